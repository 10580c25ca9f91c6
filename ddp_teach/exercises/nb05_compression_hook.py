"""Checker for notebook 05's 16-bit gradient compression hook (the loss
scale's update rule is checked in nb05_mixed_precision.py).

`compression_hook` runs on real ranks: called directly on a bucket whose
values overflow fp16 if summed before dividing, on 1 to 5 ranks; then
plugged into torch's DDP for one backward; then into a DDP over a
sub-group of 2 of 3 ranks. The reference (`amp.fp16_allreduce_hook`, like
torch's `fp16_compress_hook`) guarantees:

- the future's value is the bucket averaged over the group, within the
  rounding of the 16-bit format (bf16 accepted too);
- a 16-bit tensor crosses the wire, divided before the sum (no overflow),
  and no more: the all-reduces of one call hand over at most half the
  fp32 bucket's bytes;
- it returns a torch Future at once, never waiting for its all-reduce
  (no blocking all-reduce, no wait() on the work or its future): the
  all-reduce here completes only after the hook has returned, and its
  result is poison until then, so reading it early shows too;
- inside torch's DDP the gradients match fp32's within 16-bit rounding;
- it reduces over the process_group it is given and divides by that
  group's size (a hook that uses the default group fails on a sub-group).

Hash seeds and empty inputs play no part (a bucket is never empty).
Wrong answers are matched with the typical mistakes (no division, dividing
after the 16-bit sum, fp32 on the wire, fp32 sent besides the 16-bit copy,
the work returned, the result read early, waiting in the hook, the group
ignored) so the hint names the one made.
"""
import threading

import torch
import torch.distributed as dist

from ddp_teach.exercises.harness import HeldWork, is_poisoned, poison, run_learner_code
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, WRONG, Exercise,
                                         Verdict, register)

SIXTEEN_BIT = ("torch.float16", "torch.bfloat16")
HOOK_WORLD_SIZES = (1, 2, 3, 4, 5)
HOOK_RETURN_S = 3.0  # a hook that has not returned by then waits on itself


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


class _HeldAllReduce(HeldWork):
    """An async all-reduce run on a buffer of the checker's: the caller's
    tensor holds poison, and the result lands in it (and the future
    completes) only at `release()`, which the checker calls once the hook
    has returned, or at the work's `wait()`, which the checker notes."""

    def __init__(self, all_reduce, tensor, args, kwargs):
        self.tensor, self.landing = tensor, tensor.clone()
        self.work = all_reduce(self.landing, *args, **dict(kwargs, async_op=True))
        poison(tensor)
        super().__init__()

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
        sent.append((str(tensor.dtype), tensor.numel() * tensor.element_size()))
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
    return {"value": value.float(), "sent": [dtype for dtype, _ in sent],
            "bytes": sum(nbytes for _, nbytes in sent),
            "fp32_bytes": _bucket_values(rank).numel() * 4,
            "waited": waited, "ddp_error": _ddp_error(fn, None)}


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
    return Verdict(CORRECT, "averages in 16 bits on 1 to 5 ranks without "
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
    if result["bytes"] > result["fp32_bytes"] // 2:
        return (f"the hook all-reduced {result['bytes']} bytes ({result['sent']}) "
                f"for a bucket of {result['fp32_bytes']} bytes in fp32: a "
                "16-bit hook exists to send half of that.\nHint: all-reduce "
                "only the 16-bit copy, once; no fp32 copy besides it, and no "
                "cast back to fp32 before the all-reduce.")
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
