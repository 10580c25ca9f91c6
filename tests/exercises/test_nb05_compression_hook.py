"""Notebook 05's compression hook tried as a learner would (issue 34): a
hook that sends fp32 besides its 16-bit copy is wrong (the bytes are the
point), and right hooks in other styles pass. PLANTED is run by
test_registry.py."""
import torch
import torch.distributed as dist


def sixteen_bit_and_fp32_too(process_group, bucket):
    """The 16-bit average is right, but an fp32 copy is all-reduced too
    (to check it?): more bytes than no compression at all."""
    buffer = bucket.buffer()
    check = buffer.div(dist.get_world_size())
    dist.all_reduce(check, async_op=True)
    compressed = buffer.half().div_(dist.get_world_size())
    work = dist.all_reduce(compressed, async_op=True)

    def done(future):
        buffer.copy_(future.value()[0])
        return buffer
    return work.get_future().then(done)


def bf16_with_then_chain(process_group, bucket):
    """Right, in another style: bfloat16, the group's size read once, and
    two chained callbacks (decompress, then hand back the buffer)."""
    group = process_group or dist.group.WORLD
    size = dist.get_world_size(group)
    buffer = bucket.buffer()
    work = dist.all_reduce((buffer / size).to(torch.bfloat16), group=group,
                           async_op=True)
    return (work.get_future()
            .then(lambda f: f.value()[0].float())
            .then(lambda f: buffer.copy_(f.value())))


def returns_a_new_tensor(process_group, bucket):
    """Right, in another style: the future's value is a new fp32 tensor,
    not the bucket's buffer (DDP copies the value into the bucket)."""
    group = process_group if process_group is not None else dist.group.WORLD
    half = bucket.buffer().to(torch.float16)
    half.div_(group.size())
    work = dist.all_reduce(half, group=group, async_op=True)
    return work.get_future().then(lambda f: f.value()[0].to(torch.float32))


def test_hooks_in_other_styles_pass(verdict):
    for right in (bf16_with_then_chain, returns_a_new_tensor):
        passed, seen = verdict("compression_hook", right)
        assert passed, seen


PLANTED = [  # (exercise, mistake, the hint it must get): see test_registry
    ("compression_hook", sixteen_bit_and_fp32_too, ("all-reduced 30 bytes",
                                                    "send half of that")),
]
