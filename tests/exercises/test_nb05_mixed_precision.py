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
     "goes back to 0 after a growth"),
    ("loss_scale_update", returns_only_the_scale,
     "return the pair (new_scale, new_growth_tracker)"),
    ("compression_hook", sums_without_dividing, "that is the sum"),
    ("compression_hook", divides_after_the_sum, "Divide by the world size BEFORE"),
    ("compression_hook", sends_fp32, "nothing 16-bit crossed the wire"),
    ("compression_hook", returns_the_work, "not a torch.futures.Future"),
    ("compression_hook", forgets_the_buffer, "in torch's DDP the gradients were off"),
    ("compression_hook", copies_before_the_all_reduce_finished,
     "read before the all-reduce finished"),
]


# the second attempt's mistakes
def factors_swapped(scale, tracker, found_inf, growth, backoff, interval):
    return next_scale(scale, tracker, found_inf, backoff, growth, interval)


def no_fp32_limit(scale, tracker, found_inf, growth, backoff, interval):
    if found_inf:
        return scale * backoff, 0
    if tracker + 1 == interval:
        return scale * growth, 0
    return scale, tracker + 1


def count_kept_after_growth(scale, tracker, found_inf, growth, backoff, interval):
    """The same scales as GradScaler's, but the count is not GradScaler's."""
    if found_inf:
        return scale * backoff, 0
    count = tracker + 1
    if count % interval == 0:
        return scale * growth, count
    return scale, count


_OWN_COUNT = [0]


def counts_for_itself(scale, tracker, found_inf, growth, backoff, interval):
    """Ignores growth_tracker and keeps a count of its own."""
    if found_inf:
        _OWN_COUNT[0] = 0
        return scale * backoff, 0
    _OWN_COUNT[0] += 1
    if _OWN_COUNT[0] == interval:
        _OWN_COUNT[0] = 0
        return scale * growth, 0
    return scale, _OWN_COUNT[0]


def waits_for_the_work(process_group, bucket):
    buffer = bucket.buffer()
    compressed = buffer.half().div_(dist.get_world_size())
    work = dist.all_reduce(compressed, async_op=True)
    work.wait()
    buffer.copy_(compressed)
    future = torch.futures.Future()
    future.set_result(buffer)
    return future


def waits_on_the_future(process_group, bucket):
    buffer = bucket.buffer()
    compressed = buffer.half().div_(dist.get_world_size())
    future = dist.all_reduce(compressed, async_op=True).get_future()
    buffer.copy_(future.wait()[0])
    done = torch.futures.Future()
    done.set_result(buffer)
    return done


def blocking_all_reduce(process_group, bucket):
    buffer = bucket.buffer()
    compressed = buffer.half().div_(dist.get_world_size())
    dist.all_reduce(compressed)
    buffer.copy_(compressed)
    future = torch.futures.Future()
    future.set_result(buffer)
    return future


def ignores_the_group(process_group, bucket):
    """Right on the default group; on DDP's sub-group, it all-reduces over
    every rank."""
    return _future_of(bucket.buffer(),
                      bucket.buffer().half().div_(dist.get_world_size()),
                      lambda t: t)


def divides_by_every_rank(process_group, bucket):
    """Reduces over DDP's group, but divides by the whole job's size."""
    group = process_group or dist.group.WORLD
    buffer = bucket.buffer()
    compressed = buffer.half().div_(dist.get_world_size())
    work = dist.all_reduce(compressed, group=group, async_op=True)

    def done(future):
        buffer.copy_(future.value()[0])
        return buffer
    return work.get_future().then(done)


PLANTED += [
    ("loss_scale_update", factors_swapped, "are swapped"),
    ("loss_scale_update", no_fp32_limit, ("passed fp32's largest number", "not applied")),
    ("loss_scale_update", count_kept_after_growth, "the scale is right but the count"),
    ("loss_scale_update", counts_for_itself, ("called twice with the same arguments",
                                              "keep no count of your own")),
    ("compression_hook", waits_for_the_work, ("waited for its own all-reduce",
                                              "work.wait()")),
    ("compression_hook", waits_on_the_future, ("waited for its own all-reduce",
                                               "wait() on the future")),
    ("compression_hook", blocking_all_reduce, ("waited for its own all-reduce",
                                               "a blocking all-reduce")),
    ("compression_hook", ignores_the_group, ("passes that group", "group=process_group")),
    ("compression_hook", divides_by_every_rank, ("ranks 0 and 1 of 3",
                                                 "dist.get_world_size(process_group)")),
]


# ---- tried as a learner would (issue 34) ----------------------------------------

def held_below_fp16_max(scale, tracker, found_inf, growth, backoff, interval):
    """The scale kept within fp16's range: but the scale is an fp32 number."""
    new_scale, count = next_scale(scale, tracker, found_inf, growth, backoff, interval)
    return (new_scale if new_scale <= torch.finfo(torch.float16).max else scale), count


def clamped_at_fp32_max(scale, tracker, found_inf, growth, backoff, interval):
    """A growth past fp32's largest clamped to it instead of not applied."""
    if found_inf:
        return scale * backoff, 0
    if tracker + 1 == interval:
        return min(scale * growth, torch.finfo(torch.float32).max), 0
    return scale, tracker + 1


def as_a_tensor_like_gradscaler(scale, tracker, found_inf, growth, backoff, interval):
    """Right, in GradScaler's own style: an fp32 tensor grown only if finite,
    the count returned as a 0-d integer tensor."""
    scale_t = torch.tensor(scale, dtype=torch.float32)
    count = torch.tensor(tracker)
    if found_inf:
        return (scale_t * backoff).item(), torch.tensor(0)
    count += 1
    if count == interval:
        grown = scale_t * growth
        return (grown if torch.isfinite(grown) else scale_t).item(), torch.tensor(0)
    return scale, count


def with_math_isfinite(scale, tracker, found_inf, growth, backoff, interval):
    """Right, in another style: one expression per branch."""
    import math
    if found_inf:
        return backoff * scale, 0
    if tracker + 1 < interval:
        return scale, tracker + 1
    grown = scale * growth
    fits = math.isfinite(grown) and grown <= torch.finfo(torch.float32).max
    return (grown if fits else scale), 0


def test_loss_scale_in_other_styles_passes(verdict):
    for right in (as_a_tensor_like_gradscaler, with_math_isfinite):
        passed, seen = verdict("loss_scale_update", right)
        assert passed, seen


PLANTED += [
    ("loss_scale_update", held_below_fp16_max, ("below fp16's largest",
                                                "the scale is an fp32 number")),
    ("loss_scale_update", clamped_at_fp32_max, ("does not clamp",
                                                "keeps the old scale")),
]
