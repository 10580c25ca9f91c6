"""Checkers for notebook 03's exercises: the pieces of DDP's Reducer.

Bucket assignment is a pure function and is checked here; the gradient hook
and the finishing step run on real workers, on a small model whose expected
averaged gradients the kernel computes itself. Wrong answers are matched
against typical mistakes (forward order, no small first bucket, a blocking
all-reduce, a forgotten wait or division, slices copied back at the wrong
offset) so that the hint names the mistake.
"""
import torch
import torch.distributed as dist

from ddp_teach.ddp import MIB, bucket_indices
from ddp_teach.exercises.harness import (all_reduce_landing_on_wait, attempt,
                                        is_poisoned, run_learner_code)
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, TODO_MESSAGE,
                                         WRONG, Exercise, Verdict, register)

WORLD_SIZES = (2, 3)
BUCKET_CASES = [([2, 2, 2, 2, 2, 2], 4, 2),  # exact fits: tells >= from >
                ([4, 4, 4, 4], 8, 4), ([100, 200, 300, 400, 500], 450, 150),
                ([3 * MIB, MIB, 2 * MIB, MIB // 2, MIB // 2], 25 * MIB, MIB),
                ([5, 5, 5], None, 4), ([5, 5, 5], 0, 4), ([], 8, 4)]


def closing_strictly(sizes, cap, first_cap):
    """The off-by-one mistake: close a bucket only once it holds MORE than
    its cap."""
    buckets, current, filled = [], [], 0
    for index in reversed(range(len(sizes))):
        current.append(index)
        filled += sizes[index]
        if filled > (min(cap, first_cap) if not buckets else cap):
            buckets.append(current)
            current, filled = [], 0
    return buckets + ([current] if current else [])


def check_bucket_assignment(fn) -> Verdict:
    for sizes, cap, first_cap in BUCKET_CASES:
        try:
            got = fn(list(sizes), cap, first_cap)
        except NotImplementedError:
            return Verdict(NOT_ATTEMPTED, TODO_MESSAGE)
        want = bucket_indices(sizes, cap, first_cap)
        if [list(b) for b in got] == want:
            continue
        shown = (f"sizes {sizes}, cap {cap}, first cap {first_cap}: expected "
                 f"{want}, got {got}.\nHint: ")
        forward = [[len(sizes) - 1 - i for i in b] for b in  # first param first
                   bucket_indices(sizes[::-1], cap, first_cap)]
        if cap is None:
            return Verdict(WRONG, shown + "cap None means one bucket with "
                           "every parameter, the last one first.")
        if cap == 0:
            return Verdict(WRONG, shown + "cap 0 means one bucket per "
                           "parameter, the last parameter first.")
        if got == forward:
            return Verdict(WRONG, shown + "fill buckets from the LAST "
                           "parameter: backward produces its gradient first.")
        if got == bucket_indices(sizes, cap, cap):
            return Verdict(WRONG, shown + "the first bucket is capped at "
                           "min(cap, first_cap), so that the first all-reduce "
                           "starts early in backward.")
        if got == closing_strictly(sizes, cap, first_cap):
            return Verdict(WRONG, shown + "close a bucket once it holds AT "
                           "LEAST its cap (>=), not more than it.")
        return Verdict(WRONG, shown + "walk the parameters backwards, add each "
                       "to the open bucket, and close it when it is full.")
    return Verdict(CORRECT, f"{len(BUCKET_CASES)} cases, caps None and 0 "
                            "included, and no parameters at all.")


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 3))


def _batch(rank):
    return torch.randn(5, 6, generator=torch.Generator().manual_seed(10 + rank))


def _expected_grads(world_size):
    """The average over ranks of each rank's gradients, computed here."""
    total = None
    for rank in range(world_size):
        model = _model()
        model(_batch(rank)).square().mean().backward()
        grads = [p.grad for p in model.parameters()]
        total = grads if total is None else [t + g for t, g in zip(total, grads)]
    return [t / world_size for t in total]


class _Watched:
    """A work that notes whether anyone waited for it."""

    def __init__(self, work):
        self._work, self.waited = work, False

    def wait(self, *args, **kwargs):
        self.waited = True
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._work, name)


def _hook_on_ranks(rank, world_size, make_hook):
    model, pending = _model(), []
    hook = attempt(make_hook, pending)
    if hook is NOT_ATTEMPTED:
        return NOT_ATTEMPTED
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)
    before = [p.detach().clone() for p in model.parameters()]
    works, all_reduce = [], dist.all_reduce

    def watched_all_reduce(*args, **kwargs):  # notes a wait() inside backward
        work = all_reduce(*args, **kwargs)
        if work is not None:
            works.append(_Watched(work))
            return works[-1]
        return work

    dist.all_reduce = watched_all_reduce
    try:
        model(_batch(rank)).square().mean().backward()
    finally:
        dist.all_reduce = all_reduce
    launched, blocking = len(pending), sum(w is None for _, w in pending)
    waited_in_backward = any(w.waited for w in works)
    for _, work in pending:
        if work is not None:
            work.wait()
    return {"launched": launched, "blocking": blocking,
            "waited_in_backward": waited_in_backward,
            "params_changed": any(not torch.equal(p, b) for p, b in
                                  zip(model.parameters(), before)),
            "grads": [p.grad / world_size for p in model.parameters()]}


def check_grad_hook(fn) -> Verdict:
    for world_size in WORLD_SIZES:
        results, problem = run_learner_code(_hook_on_ranks, world_size, fn)
        if problem:
            return problem
        want, seen = _expected_grads(world_size), results[0]
        if seen["launched"] == 0:
            return Verdict(WRONG, "no work was appended to `pending`.\nHint: "
                           "append (param, work) so the finishing step can "
                           "wait for every all-reduce.")
        if seen["blocking"]:
            return Verdict(WRONG, "dist.all_reduce returned None: it ran to "
                           "the end inside backward.\nHint: pass "
                           "async_op=True, so the sum travels while backward "
                           "computes the next gradients.")
        if seen["waited_in_backward"]:
            return Verdict(WRONG, "the hook waited for its all-reduce "
                           "(work.wait()) before backward went on: backward "
                           "stood still until the sum arrived, as with a "
                           "blocking call, so nothing overlapped.\nHint: the "
                           "hook only starts the all-reduce and appends "
                           "(param, work); the finishing step waits.")
        if seen["params_changed"]:
            return Verdict(WRONG, "the parameters changed.\nHint: all-reduce "
                           "param.grad, not the parameter itself.")
        got = seen["grads"]
        if all(torch.allclose(g * world_size, w / world_size) for g, w in
               zip(got, want)):
            return Verdict(WRONG, "the gradients were divided twice.\nHint: "
                           "the hook only starts the sum; averaging is the "
                           "finishing step's job.")
        if not all(torch.allclose(g, w, atol=1e-6) for g, w in zip(got, want)):
            return Verdict(WRONG, f"on {world_size} ranks the summed gradients "
                           "are wrong.\nHint: all-reduce param.grad itself "
                           "(in place), once per parameter.")
    return Verdict(CORRECT, "async all-reduces started in backward, one per "
                            f"parameter, on {WORLD_SIZES} ranks.")


def _finish_on_ranks(rank, world_size, finish):
    model = _model()
    model(_batch(rank)).square().mean().backward()
    params = list(model.parameters())
    buckets = []
    for group in (params[2:][::-1], params[:2][::-1]):  # backward order
        buffer = torch.cat([p.grad.flatten() for p in group])
        # the sum lands in the buffer at wait(), not a moment before
        work = _Watched(all_reduce_landing_on_wait(buffer))
        buckets.append({"buffer": buffer, "work": work, "params": group})
    try:
        finish(buckets, world_size)
    except NotImplementedError:
        for bucket in buckets:
            bucket["work"].wait()  # finish the collectives before leaving
        return NOT_ATTEMPTED
    return {"waited": all(b["work"].waited for b in buckets),
            "grads": [p.grad.clone() for p in params]}


def check_finish(fn) -> Verdict:
    for world_size in WORLD_SIZES:
        results, problem = run_learner_code(_finish_on_ranks, world_size, fn)
        if problem:
            return problem
        want, seen = _expected_grads(world_size), results[0]
        if not seen["waited"]:
            return Verdict(WRONG, "a bucket's work was never waited for.\n"
                           "Hint: call work.wait() before reading the buffer: "
                           "until then the sum may be half done.")
        got = seen["grads"]
        if all(torch.allclose(g, w, atol=1e-6) for g, w in zip(got, want)):
            continue
        if is_poisoned(got):
            return Verdict(WRONG, "a gradient was copied out of its bucket's "
                           "buffer before the bucket's work.wait() returned: "
                           "until then the sum may be half done (here the "
                           "buffer held NaN until wait()).\nHint: wait for "
                           "the bucket's work first, then divide and copy.")
        if all(torch.allclose(g, w * world_size, atol=1e-6)
               for g, w in zip(got, want)):
            return Verdict(WRONG, "the gradients are the SUM over ranks.\n"
                           "Hint: divide the buffer by world_size.")
        if not any(torch.allclose(g, w, atol=1e-6) for g, w in zip(got, want)):
            return Verdict(WRONG, "no parameter's .grad holds the average.\n"
                           "Hint: copy each parameter's slice of the buffer "
                           "back into param.grad (view_as(param)).")
        return Verdict(WRONG, "some parameters' gradients are right, others "
                       "not.\nHint: walk the buffer with a running offset: a "
                       "parameter's slice starts where the previous one's "
                       "ended, in the bucket's parameter order.")
    return Verdict(CORRECT, f"waited, averaged and copied back on {WORLD_SIZES} ranks.")


register(Exercise(
    "ddp_bucket_assignment", "Bucket assignment", "my_bucket_indices",
    "ddp_teach.ddp:bucket_indices", check_bucket_assignment,
    ["Walk the parameter indices from the last to the first.",
     "Add each to the open bucket; close it once its bytes reach the cap "
     "(the first bucket's cap is min(cap, first_cap))."],
    stub_parameters=("sizes_bytes", "cap_bytes", "first_cap_bytes")))
register(Exercise(
    "ddp_grad_hook", "The gradient hook", "my_make_hook",
    "ddp_teach.ddp:make_allreduce_hook", check_grad_hook,
    ["Return an inner function hook(param) that closes over `pending`.",
     "Inside: work = dist.all_reduce(param.grad, async_op=True); "
     "pending.append((param, work))."]))
register(Exercise(
    "ddp_finish", "Finishing the synchronisation", "my_finish",
    "ddp_teach.ddp:finish_buckets", check_finish,
    ["For each bucket: wait for its work, then divide its buffer.",
     "Copy slices back with a running offset: "
     "buffer[offset:offset + p.numel()].view_as(p)."]))
