"""Checkers for notebook 05's exercises: the loss scale's update rule and a
16-bit gradient compression hook.

`loss_scale_update` is checked here in the kernel against
`dt.amp.next_scale` (which tests/course/test_amp.py holds equal to torch's
GradScaler) over scripted runs of clean and overflowing steps. The
reference guarantees:

- the scale after every step, and the count of clean steps it returns
  (GradScaler's `_growth_tracker`, 0 after any change of the scale);
- back-off on every overflow, growth after each run of growth_interval
  clean steps (growth_interval 1 included);
- the scale stays a finite fp32 number: a growth past fp32's largest is
  not applied, as GradScaler keeps a grown scale only if it is finite;
- no state of its own: the same arguments give the same answer.

`compression_hook` runs on real ranks: called directly on a bucket whose
values overflow fp16 if summed before dividing, on 1, 2 and 3 ranks; then
plugged into torch's DDP for one backward; then into a DDP over a
sub-group of 2 of 3 ranks. The reference (`amp.fp16_allreduce_hook`, like
torch's `fp16_compress_hook`) guarantees:

- the future's value is the bucket averaged over the group, within the
  rounding of the 16-bit format (bf16 accepted too);
- a 16-bit tensor crosses the wire, divided before the sum (no overflow);
- it returns a torch Future at once, never waiting for its all-reduce
  (no blocking all-reduce, no wait() on the work or its future): the
  all-reduce here completes only after the hook has returned, and its
  result is poison until then, so reading it early shows too;
- inside torch's DDP the gradients match fp32's within 16-bit rounding;
- it reduces over the process_group it is given and divides by that
  group's size (a hook that uses the default group fails on a sub-group).

Hash seeds and empty inputs play no part (a bucket is never empty).
Wrong answers are matched with the typical mistakes (no back-off, a count
not restarted, growth one step late or early, the factors swapped, no fp32
limit, a counter of its own; no division, dividing after the 16-bit sum,
fp32 on the wire, the work returned, the result read early, waiting in the
hook, the group ignored) so the hint names the one made.
"""
import threading

import torch
import torch.distributed as dist

from ddp_teach.exercises.harness import is_poisoned, poison, run_learner_code
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, TODO_MESSAGE,
                                         WRONG, Exercise, Verdict, register)

# (init scale, growth_factor, backoff_factor, growth_interval, found_inf flags)
SCALE_CASES = [
    (1024.0, 2.0, 0.5, 3, [False] * 7 + [True] + [False] * 4 + [True, True]
     + [False] * 3),
    (1024.0, 4.0, 0.25, 2, [False, True, False, False, False, True, False, False]),
    (1024.0, 2.0, 0.5, 1, [False, False, True, False]),
    (2.0 ** 127, 2.0, 0.5, 1, [False, False]),  # growth would pass fp32's max
]
SIXTEEN_BIT = ("torch.float16", "torch.bfloat16")
FP32_MAX = torch.finfo(torch.float32).max
HOOK_WORLD_SIZES = (1, 2, 3)
HOOK_RETURN_S = 3.0  # a hook that has not returned by then waits on itself


def _pair(returned):
    """(scale, tracker) as (float, int), or None if not a pair of numbers."""
    if not isinstance(returned, (tuple, list)) or len(returned) != 2:
        return None
    try:
        return float(returned[0]), int(returned[1])
    except (TypeError, ValueError):
        return None


def scale_history(update, init, growth, backoff, interval, script):
    """[(scale, tracker)] after each step of `script`, using `update`; a
    string saying what `update` returned when it is not a pair."""
    scale, tracker, history = init, 0, []
    for found_inf in script:
        returned = update(scale, tracker, found_inf, growth, backoff, interval)
        pair = _pair(returned)
        if pair is None:
            return f"{returned!r:.80}"
        scale, tracker = pair
        history.append(pair)
    return history


def check_loss_scale_update(fn) -> Verdict:
    from ddp_teach.amp import next_scale
    try:
        first, again = (_pair(fn(1024.0, 0, False, 2.0, 0.5, 3)) for _ in range(2))
    except NotImplementedError:
        return Verdict(NOT_ATTEMPTED, TODO_MESSAGE)
    if first is not None and first != again:
        return Verdict(WRONG, f"called twice with the same arguments (scale "
                       f"1024, count 0, a clean step) it returned {first}, then "
                       f"{again}.\nHint: keep no count of your own: the count "
                       "of clean steps comes in as growth_tracker and goes out "
                       "as the second value returned.")
    for init, growth, backoff, interval, script in SCALE_CASES:
        want = scale_history(next_scale, init, growth, backoff, interval, script)
        got = scale_history(fn, init, growth, backoff, interval, script)
        if isinstance(got, str):
            return Verdict(WRONG, f"update_scale returned {got}.\nHint: return "
                           "the pair (new_scale, new_growth_tracker).")
        for step, (mine, right) in enumerate(zip(got, want)):
            if mine == right:
                continue
            shown = (f"growth_factor {growth}, backoff_factor {backoff}, "
                     f"growth_interval {interval}, starting at {init:g}; "
                     f"steps so far (True = inf/NaN found): "
                     f"{script[:step + 1]}.\nAfter step {step} the scale and "
                     f"count should be ({right[0]:g}, {right[1]}), got "
                     f"({mine[0]:g}, {mine[1]}).\nHint: ")
            before = want[step - 1][0] if step else init
            return Verdict(WRONG, shown + _scale_hint(script, step, mine, right,
                                                     before, growth, backoff))
    return Verdict(CORRECT, "the same scales and counts as torch's GradScaler: "
                            "back-off on every overflow, growth after each run "
                            "of growth_interval clean steps, never past fp32.")


def _scale_hint(script, step, mine, right, before, growth, backoff) -> str:
    if mine[0] == right[0] and script[step]:
        return ("the scale is right but the count is not: restart the count "
                "of clean steps at 0 whenever an overflow happens.")
    if mine[0] == right[0]:
        return ("the scale is right but the count is not: it counts the clean "
                "steps since the scale last changed, so it goes back to 0 "
                "after a growth too.")
    if script[step] and mine[0] == before * growth or (
            right[0] == before * growth and mine[0] == before * backoff):
        return ("the scale " + ("grew on an overflow" if script[step] else
                                "shrank where it should have grown")
                + ": growth_factor and backoff_factor are swapped.")
    if script[step]:
        return ("an overflow (found_inf True) must multiply the scale by "
                "backoff_factor and restart the count of clean steps at 0.")
    if mine[0] > FP32_MAX:
        return ("the scale passed fp32's largest number (GradScaler's scale, an "
                "fp32 tensor, would be inf): a growth past "
                "torch.finfo(torch.float32).max is not applied; GradScaler "
                "keeps the old scale then.")
    if mine[0] > right[0] and True in script[:step]:
        return ("the scale grew too early after an overflow: restart the "
                "count of clean steps at 0 whenever an overflow happens.")
    if mine[0] > right[0]:
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


class _HeldAllReduce:
    """An async all-reduce run on a buffer of the checker's: the caller's
    tensor holds poison, and the result lands in it (and the future
    completes) only at `release()`, which the checker calls once the hook
    has returned, or at the work's `wait()`, which the checker notes."""

    def __init__(self, all_reduce, tensor, args, kwargs):
        self.tensor, self.landing = tensor, tensor.clone()
        self.work = all_reduce(self.landing, *args, **dict(kwargs, async_op=True))
        poison(tensor)
        self.future, self.waited = torch.futures.Future(), False

    def wait(self, *args, **kwargs):
        self.waited = True
        self.release()
        return True

    def is_completed(self) -> bool:
        return self.future.done()

    def get_future(self):
        return self.future

    def release(self) -> None:
        if not self.future.done():
            self.work.wait()
            self.tensor.copy_(self.landing)
            self.future.set_result([self.tensor])


def _bucket_values(rank):
    """Small gradients, ordinary ones, and 40000 on every rank: the sum
    overflows fp16 (max 65504), the mean does not."""
    return torch.tensor([1e-3, -0.5, 2.0 + rank, 40000.0, 3e-2 * (rank + 1)])


def _call_hook(fn, bucket):
    """Call the hook in a thread of its own, with every async all-reduce
    held until it returns (or HOOK_RETURN_S passed: it waits on itself).
    Returns (future, what was sent, how the hook waited)."""
    real, sent, held, blocking = dist.all_reduce, [], [], []

    def spy(tensor, *args, **kwargs):
        sent.append(str(tensor.dtype))
        if kwargs.get("async_op"):
            held.append(_HeldAllReduce(real, tensor, args, kwargs))
            return held[-1]
        blocking.append(True)
        return real(tensor, *args, **kwargs)
    outcome = {}

    def call():
        try:
            outcome["future"] = fn(None, bucket)
        except BaseException as error:  # handed to the worker's thread below
            outcome["error"] = error
    dist.all_reduce = spy
    try:
        thread = threading.Thread(target=call, daemon=True)
        thread.start()
        thread.join(HOOK_RETURN_S)
        stuck = thread.is_alive()
        for work in held:
            work.release()
        thread.join()
    finally:
        dist.all_reduce = real
    if "error" in outcome:
        raise outcome["error"]
    waited = ("a blocking all-reduce" if blocking else
              "wait() on the future" if stuck else
              "work.wait()" if any(w.waited for w in held) else None)
    return outcome["future"], sent, waited


def _hook_on_ranks(rank, world_size, fn):
    try:
        future, sent, waited = _call_hook(fn, _Bucket(_bucket_values(rank)))
    except NotImplementedError:
        return NOT_ATTEMPTED
    if isinstance(future, _HeldAllReduce):
        return {"returned": "Work (the all-reduce's handle)"}
    if not isinstance(future, torch._C.Future):  # torch.futures.Future or c10d's
        return {"returned": type(future).__name__}
    value = future.wait()
    value = value[0] if isinstance(value, list) else value
    return {"value": value.float(), "sent": sent, "waited": waited,
            "ddp_error": _ddp_error(fn, None)}


def _ddp_error(fn, group):
    """Largest gap between torch's DDP gradients with the hook and without,
    relative to the largest gradient, over `group` (None: every rank)."""
    from torch.nn.parallel import DistributedDataParallel
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 3)
    x = torch.randn(4, 8) * (dist.get_rank() + 1)
    grads = []
    for hook in (None, fn):
        ddp = DistributedDataParallel(model, process_group=group)
        if hook is not None:
            ddp.register_comm_hook(group, hook)
        model.zero_grad()
        ddp(x).square().sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    return ((grads[0] - grads[1]).abs().max() / grads[0].abs().max()).item()


def _subgroup_on_ranks(rank, world_size, fn):
    group = dist.new_group([0, 1])  # every rank creates it; rank 2 then leaves
    return None if rank not in (0, 1) else _ddp_error(fn, group)


def _tolerance(world_size: int) -> float:
    """bf16's rounding (the coarser 16-bit format): each rank's share and
    each partial sum rounded once, half an eps (2^-8) of the largest value
    each time, with room to spare."""
    return (world_size + 1) * 2.0 ** -8


def check_compression_hook(fn) -> Verdict:
    for world_size in HOOK_WORLD_SIZES:
        results, problem = run_learner_code(_hook_on_ranks, world_size, fn,
                                            timeout=30)
        if problem:
            return problem
        values = [_bucket_values(r) for r in range(world_size)]
        for rank, result in enumerate(results):
            hint = _hook_hint(result, values, world_size)
            if hint:
                return Verdict(WRONG, f"on {world_size} rank"
                               f"{'s' * (world_size > 1)}, rank {rank}: {hint}")
    results, problem = run_learner_code(_subgroup_on_ranks, 3, fn, timeout=15)
    group_hint = ("DDP over a group of ranks 0 and 1 (of 3) passes that group "
                  "as the hook's first argument: all-reduce with "
                  "group=process_group (None means the default group) and "
                  "divide by dist.get_world_size(process_group).")
    if problem:  # the first lines say what failed; the traceback is DDP's
        failed = "\n".join(problem.message.splitlines()[:2])
        return Verdict(WRONG, f"in torch's DDP over ranks 0 and 1 of 3 (rank 2 "
                       f"outside the group): {failed}\nHint: {group_hint}")
    if not max(results[:2]) < _tolerance(2):
        return Verdict(WRONG, "in torch's DDP over ranks 0 and 1 of 3 the "
                       f"gradients were off by {max(results[:2]):.1%} of the "
                       f"largest one.\nHint: {group_hint}")
    return Verdict(CORRECT, "averages in 16 bits on 1, 2 and 3 ranks without "
                            "overflowing or waiting, drops into torch's DDP "
                            "(gradients match fp32 to within 16-bit rounding), "
                            "on a sub-group too.")


def _hook_hint(result, values, world_size) -> str | None:
    mean = torch.stack(values).mean(0)
    if "returned" in result:
        return (f"the hook returned a {result['returned']}, not a "
                "torch.futures.Future.\nHint: return work.get_future().then(...),"
                " the future of the async all-reduce with the result written back.")
    if result["waited"]:
        return (f"the hook waited for its own all-reduce ({result['waited']}) "
                "before returning.\nHint: DDP would stop its backward at every "
                "bucket. Start the all-reduce with async_op=True and return "
                "work.get_future().then(f); DDP waits on that future itself.")
    if not any(dtype in SIXTEEN_BIT for dtype in result["sent"]):
        return (f"all-reduced {result['sent']}: nothing 16-bit crossed the wire."
                "\nHint: cast the bucket to torch.float16 (or torch.bfloat16) "
                "before all_reduce; that is what halves the bytes.")
    got = result["value"]
    shown = (f"the bucket averaged should be {mean.tolist()}, got "
             f"{got.tolist()}.\nHint: ")
    if is_poisoned(got):
        return shown + ("the result was read before the all-reduce finished "
                        "(it still held the checker's poison, NaN). Copy it into "
                        "the bucket in the function you pass to "
                        "work.get_future().then(...): that runs once the "
                        "all-reduce is done.")
    finite = torch.isfinite(got)
    if world_size > 1 and torch.allclose(got[finite], mean[finite] * world_size,
                                         rtol=1e-2):
        return shown + ("that is the sum: divide by the world size (DDP expects "
                        "the hook to average), and do it before the 16-bit "
                        "all-reduce.")
    if not finite.all():
        return shown + ("a value overflowed: 40000 on each rank sums past "
                        "fp16's 65504. Divide by the world size BEFORE the "
                        "16-bit all-reduce, not after.")
    if not torch.allclose(got, mean, rtol=_tolerance(world_size), atol=1e-4):
        return shown + ("all-reduce (SUM) the 16-bit copy divided by the world "
                        "size, then copy the result back into the bucket's buffer.")
    if not result["ddp_error"] < _tolerance(world_size):
        return ("called directly the hook averages, but in torch's DDP the "
                f"gradients were off by {result['ddp_error']:.1%} of the largest "
                "one.\nHint: the future's value must be the averaged bucket "
                "(write it into bucket.buffer() and return that).")
    return None


register(Exercise(
    name="loss_scale_update", title="The loss scale's update rule",
    stub_name="update_scale", reference="ddp_teach.amp:next_scale",
    checker=check_loss_scale_update,
    hints=["Two cases: the step overflowed (found_inf) or it was clean.",
           "Overflow: scale * backoff_factor, and the count of clean steps "
           "goes back to 0. Clean: the count goes up by one.",
           "When the count reaches growth_interval, multiply the scale by "
           "growth_factor (unless that passes fp32's largest number) and set "
           "the count back to 0."],
    stub_parameters=("scale", "growth_tracker", "found_inf", "growth_factor",
                     "backoff_factor", "growth_interval")))

register(Exercise(
    name="compression_hook", title="A 16-bit gradient compression hook",
    stub_name="fp16_hook", reference="ddp_teach.amp:fp16_allreduce_hook",
    checker=check_compression_hook,
    hints=["bucket.buffer() is the flat fp32 gradient; send a 16-bit copy, "
           "divided by the group's size first.",
           "group = process_group or dist.group.WORLD; compressed = "
           "buffer.to(torch.float16).div_(dist.get_world_size(group)), then "
           "dist.all_reduce(compressed, group=group, async_op=True).",
           "Return work.get_future().then(f): in f, copy f.value()[0] back into "
           "the buffer and return the buffer."]))
