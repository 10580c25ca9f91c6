"""Notebook 05's planted mistakes (PLANTED, run by test_registry.py, which
also checks every reference and stub), and a bf16 hook, right too."""
import torch
import torch.distributed as dist

from ddp_teach.amp import bf16_allreduce_hook, next_scale


def test_a_bf16_hook_is_right_too(verdict):
    passed, seen = verdict("compression_hook", bf16_allreduce_hook)
    assert passed, seen


def never_backs_off(scale, tracker, found_inf, growth, backoff, interval):
    return next_scale(scale, tracker, False, growth, backoff, interval)


def count_survives_overflow(scale, tracker, found_inf, growth, backoff, interval):
    if found_inf:
        return scale * backoff, tracker
    return next_scale(scale, tracker, False, growth, backoff, interval)


def grows_one_step_late(scale, tracker, found_inf, growth, backoff, interval):
    if found_inf:
        return scale * backoff, 0
    if tracker + 1 > interval:
        return scale * growth, 0
    return scale, tracker + 1


def count_not_restarted_after_growth(scale, tracker, found_inf, growth, backoff,
                                     interval):
    if found_inf:
        return scale * backoff, 0
    if tracker + 1 >= interval:
        return scale * growth, tracker + 1
    return scale, tracker + 1


def returns_only_the_scale(scale, tracker, found_inf, growth, backoff, interval):
    return next_scale(scale, tracker, found_inf, growth, backoff, interval)[0]


def _future_of(buffer, tensor, transform):
    work = dist.all_reduce(tensor, async_op=True)

    def done(future):
        buffer.copy_(transform(future.value()[0]))
        return buffer
    return work.get_future().then(done)


def sums_without_dividing(process_group, bucket):
    buffer = bucket.buffer()
    return _future_of(buffer, buffer.half(), lambda t: t)


def divides_after_the_sum(process_group, bucket):
    buffer = bucket.buffer()
    return _future_of(buffer, buffer.half(),
                      lambda t: t / dist.get_world_size())


def sends_fp32(process_group, bucket):
    buffer = bucket.buffer()
    return _future_of(buffer, buffer.div(dist.get_world_size()), lambda t: t)


def returns_the_work(process_group, bucket):
    compressed = bucket.buffer().half().div_(dist.get_world_size())
    return dist.all_reduce(compressed, async_op=True)


def forgets_the_buffer(process_group, bucket):
    """Averages right, but the future holds a fresh zero tensor."""
    buffer = bucket.buffer()
    compressed = buffer.half().div_(dist.get_world_size())
    work = dist.all_reduce(compressed, async_op=True)
    return work.get_future().then(lambda f: torch.zeros_like(buffer)
                                  if buffer.numel() > 5 else f.value()[0])


def copies_before_the_all_reduce_finished(process_group, bucket):
    """Starts the 16-bit all-reduce, then copies its result back at once:
    right only when the all-reduce happened to finish first."""
    buffer = bucket.buffer()
    compressed = buffer.half().div_(dist.get_world_size())
    work = dist.all_reduce(compressed, async_op=True)
    buffer.copy_(compressed)
    return work.get_future().then(lambda _f: buffer)


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("loss_scale_update", never_backs_off, "must multiply the scale by backoff_factor"),
    ("loss_scale_update", count_survives_overflow,
     "restart the count of clean steps at 0 whenever"),
    ("loss_scale_update", grows_one_step_late, "should have grown"),
    ("loss_scale_update", count_not_restarted_after_growth,
     "after growing, restart the count"),
    ("loss_scale_update", returns_only_the_scale,
     "must return (new_scale, new_growth_tracker)"),
    ("compression_hook", sums_without_dividing, "that is the sum"),
    ("compression_hook", divides_after_the_sum, "Divide by the world size BEFORE"),
    ("compression_hook", sends_fp32, "nothing 16-bit crossed the wire"),
    ("compression_hook", returns_the_work, "not a torch.futures.Future"),
    ("compression_hook", forgets_the_buffer, "in torch's DDP the gradients were off"),
    ("compression_hook", copies_before_the_all_reduce_finished,
     "read before the all-reduce finished"),
]
