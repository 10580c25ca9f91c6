"""Checkers for notebook 05's exercises: the loss scale's update rule and a
16-bit gradient compression hook.

The update rule is checked here in the kernel against `dt.amp.next_scale`
(which `tests/course/test_amp.py` holds equal to torch's GradScaler) over scripted
runs of clean and overflowing steps; the first step where the learner's
scale differs is shown with the history that led to it. The hook runs on
real ranks, first called directly on a bucket whose values would overflow
fp16 if summed before dividing, then plugged into torch's DDP for one
backward. Wrong answers are matched with the typical mistakes (no back-off,
a count not restarted, growth one step late; no division, dividing after
the 16-bit sum, fp32 on the wire) so the hint names the one made.
"""
import torch
import torch.distributed as dist

from ddp_teach.exercises.harness import (is_poisoned, lands_on_wait,
                                        run_learner_code)
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, TODO_MESSAGE,
                                         WRONG, Exercise, Verdict, register)

# (growth_factor, backoff_factor, growth_interval, script of found_inf flags)
SCALE_CASES = [
    (2.0, 0.5, 3, [False] * 7 + [True] + [False] * 4 + [True, True] + [False] * 3),
    (4.0, 0.25, 2, [False, True, False, False, False, True, False, False]),
    (2.0, 0.5, 1, [False, False, True, False]),
]
INIT_SCALE = 1024.0
SIXTEEN_BIT = ("torch.float16", "torch.bfloat16")


def scale_history(update, growth, backoff, interval, script):
    """[(scale, tracker)] after each step of `script`, using `update`."""
    scale, tracker, history = INIT_SCALE, 0, []
    for found_inf in script:
        new_scale, tracker = update(scale, tracker, found_inf, growth, backoff,
                                    interval)
        scale = float(new_scale)
        history.append((scale, int(tracker)))
    return history


def check_loss_scale_update(fn) -> Verdict:
    from ddp_teach.amp import next_scale
    for growth, backoff, interval, script in SCALE_CASES:
        want = scale_history(next_scale, growth, backoff, interval, script)
        try:
            got = scale_history(fn, growth, backoff, interval, script)
        except NotImplementedError:
            return Verdict(NOT_ATTEMPTED, TODO_MESSAGE)
        except (TypeError, ValueError) as error:
            return Verdict(WRONG, f"update_scale must return (new_scale, "
                                  f"new_growth_tracker); calling it raised "
                                  f"{type(error).__name__}: {error}")
        for step, (mine, right) in enumerate(zip(got, want)):
            if mine[0] == right[0]:
                continue
            shown = (f"growth_factor {growth}, backoff_factor {backoff}, "
                     f"growth_interval {interval}, starting at {INIT_SCALE:g}; "
                     f"steps so far (True = inf/NaN found): "
                     f"{script[:step + 1]}.\nAfter step {step} the scale should "
                     f"be {right[0]:g}, got {mine[0]:g}.\nHint: ")
            return Verdict(WRONG, shown + _scale_hint(script, step, mine[0], right[0],
                                                     got, want))
    return Verdict(CORRECT, "the same scale sequence as torch's GradScaler: "
                            "back-off on every overflow, growth after each "
                            "run of growth_interval clean steps.")


def _scale_hint(script, step, mine, right, got, want) -> str:
    if script[step]:
        return ("an overflow (found_inf True) must multiply the scale by "
                "backoff_factor and restart the count of clean steps at 0.")
    if mine > right and True in script[:step]:
        return ("the scale grew too early after an overflow: restart the "
                "count of clean steps at 0 whenever an overflow happens.")
    if mine > right:
        return ("the scale grew too early: after growing, restart the count at "
                "0; grow only when the count of clean steps reaches growth_interval.")
    return ("the scale should have grown: add 1 to the count on a clean step, "
            "and when it reaches growth_interval multiply the scale by "
            "growth_factor (and restart the count).")


class _Bucket:
    """A stand-in for torch's GradBucket: all a compression hook reads."""

    def __init__(self, buffer):
        self._buffer = buffer

    def buffer(self):
        return self._buffer

    def index(self):
        return 0

    def is_last(self):
        return True


def _bucket_values(rank):
    """Small gradients, ordinary ones, and 40000 on every rank: the sum
    overflows fp16 (max 65504), the mean does not."""
    return torch.tensor([1e-3, -0.5, 2.0 + rank, 40000.0, 3e-2 * (rank + 1)])


def _hook_on_ranks(rank, world_size, fn):
    """The hook called on a bucket directly. Its async all-reduce lands only
    when the work's future completes (`lands_on_wait`), so a hook that reads
    the result before that reads poison, every time."""
    sent = []
    with lands_on_wait():
        original = dist.all_reduce

        def spy(tensor, *args, **kwargs):
            sent.append(str(tensor.dtype))
            return original(tensor, *args, **kwargs)
        dist.all_reduce = spy
        try:
            future = fn(None, _Bucket(_bucket_values(rank)))
        except NotImplementedError:
            return NOT_ATTEMPTED
        finally:
            dist.all_reduce = original
        if not isinstance(future, torch._C.Future):  # torch.futures.Future or c10d's
            return {"returned": type(future).__name__}
        value = future.wait()
    value = value[0] if isinstance(value, list) else value
    return {"value": value.float(), "sent": sent, "ddp_error": _ddp_error(fn)}


def _ddp_error(fn) -> float:
    """Largest gap between torch's DDP gradients with the hook and without,
    relative to the largest gradient (bf16 keeps about 3 digits)."""
    from torch.nn.parallel import DistributedDataParallel
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 3)
    x = torch.randn(4, 8) * (dist.get_rank() + 1)
    grads = []
    for hook in (None, fn):
        ddp = DistributedDataParallel(model)
        if hook is not None:
            ddp.register_comm_hook(None, hook)
        model.zero_grad()
        ddp(x).square().sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    return ((grads[0] - grads[1]).abs().max() / grads[0].abs().max()).item()


def check_compression_hook(fn) -> Verdict:
    for world_size in (2, 3):
        results, problem = run_learner_code(_hook_on_ranks, world_size, fn,
                                            timeout=30)
        if problem:
            return problem
        values = [_bucket_values(r) for r in range(world_size)]
        mean = torch.stack(values).mean(0)
        for rank, result in enumerate(results):
            where = f"on {world_size} ranks, rank {rank}: "
            if "returned" in result:
                return Verdict(WRONG, where + f"the hook returned a "
                               f"{result['returned']}, not a torch.futures.Future."
                               "\nHint: return work.get_future().then(...), the "
                               "future of the async all-reduce with the result "
                               "written back.")
            if not any(dtype in SIXTEEN_BIT for dtype in result["sent"]):
                return Verdict(WRONG, where + f"all-reduced {result['sent']}: "
                               "nothing 16-bit crossed the wire.\nHint: cast the "
                               "bucket to torch.float16 or torch.bfloat16 before "
                               "all_reduce; that is what halves the bytes.")
            got = result["value"]
            shown = where + (f"the bucket averaged should be {mean.tolist()}, "
                             f"got {got.tolist()}.\nHint: ")
            if is_poisoned(got):
                return Verdict(WRONG, shown + "the result was read before the "
                               "all-reduce finished (it still held the checker's "
                               "poison, NaN). Copy it into the bucket in the "
                               "function you pass to work.get_future().then(...): "
                               "that runs once the all-reduce is done.")
            finite = torch.isfinite(got)
            if torch.allclose(got[finite], mean[finite] * world_size, rtol=1e-2):
                return Verdict(WRONG, shown + "that is the sum: divide by the "
                               "world size (DDP expects the hook to average), "
                               "and do it before the 16-bit all-reduce.")
            if not finite.all():
                return Verdict(WRONG, shown + "a value overflowed: 40000 on each "
                               "rank sums past fp16's 65504. Divide by the world "
                               "size BEFORE the 16-bit all-reduce, not after.")
            if not torch.allclose(got, mean, rtol=1e-2, atol=1e-4):
                return Verdict(WRONG, shown + "all-reduce (SUM) the 16-bit copy "
                               "divided by the world size, then copy the result "
                               "back into the bucket's buffer.")
            if not result["ddp_error"] < 1e-2:
                return Verdict(WRONG, where + "called directly the hook averages, "
                               "but in torch's DDP the gradients were off by "
                               f"{result['ddp_error']:.1%} of the largest one.\nHint: the future's "
                               "value must be the averaged bucket (write it into "
                               "bucket.buffer() and return that).")
    return Verdict(CORRECT, "averages in 16 bits on 2 and 3 ranks without "
                            "overflowing, and drops into torch's DDP: the "
                            "gradients match fp32 to within 16-bit rounding.")


register(Exercise(
    name="loss_scale_update", title="The loss scale's update rule",
    stub_name="update_scale", reference="ddp_teach.amp:next_scale",
    checker=check_loss_scale_update,
    hints=["Two cases: the step overflowed (found_inf) or it was clean.",
           "Overflow: scale * backoff_factor, and the count of clean steps "
           "goes back to 0. Clean: the count goes up by one.",
           "When the count reaches growth_interval, multiply the scale by "
           "growth_factor and set the count back to 0."],
    stub_parameters=("scale", "growth_tracker", "found_inf", "growth_factor",
                     "backoff_factor", "growth_interval")))

register(Exercise(
    name="compression_hook", title="A 16-bit gradient compression hook",
    stub_name="fp16_hook", reference="ddp_teach.amp:fp16_allreduce_hook",
    checker=check_compression_hook,
    hints=["bucket.buffer() is the flat fp32 gradient; send a 16-bit copy.",
           "compressed = buffer.to(torch.float16).div_(world_size), then "
           "dist.all_reduce(compressed, async_op=True).",
           "Return work.get_future().then(f): in f, copy f.value()[0] back into "
           "the buffer and return the buffer."]))
