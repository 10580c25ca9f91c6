"""Run a learner's code on real ranks for a checker, and read what happened.

Every checker that needs ranks goes through `run_learner_code`. A checker's
worker function gets the learner's function as its argument; a stub that
still raises NotImplementedError makes the worker return NOT_ATTEMPTED
(`attempt` does that), which reads as "not attempted", not as a failure.
An error or a hang in the learner's code becomes a WRONG verdict that says
on how many ranks it happened; `describe_deadlock` turns a hang into where
each rank waited, for the exercises built from collectives.

The workers always use gloo: the checkers' tensors are on the CPU, and on a
machine with a GPU per rank `dt.run`'s "auto" would pick nccl.

Code that reads a buffer before its communication is done is right or
wrong by luck of timing: over gloo on one machine a message usually lands
at once. `lands_on_wait` takes the luck out: inside it a receive (or an
async all-reduce the checker starts) fills its tensor only when its work's
`wait()` returns, and until then the tensor holds a poison value, so such
code fails its check every time, with `READ_BEFORE_WAIT_HINT`. The same
holds for a future: callbacks chained with `.then()` see the result, code
that reads the tensor before the future completes sees the poison.
"""
import contextlib

import torch
import torch.distributed as dist

from ddp_teach.exercises.registry import NOT_ATTEMPTED, TODO_MESSAGE, WRONG, Verdict

DEADLOCK_HINT = ("a blocking dist.send() waits until the receiver takes the "
                 "data, so when every rank sends first, every rank waits. Post "
                 "dist.isend() and dist.irecv() together, then wait() on both "
                 "(or let even ranks send first and odd ranks receive first).")


UNWAITED_HINT = (
    "an async collective (async_op=True) was never waited for, or its "
    "tensor was read before the wait (the checker holds the result back "
    "until wait(), and the tensor holds NaN until then). The call returns at "
    "once and the result may land at any time: call work.wait() before "
    "reading the tensor, or leave async_op out.")


READ_BEFORE_WAIT_HINT = (
    "a received buffer was read before its wait() returned (it still held "
    "the checker's poison value, NaN, or the dtype's smallest integer). A "
    "message may land at any time until wait() returns: post the isend and "
    "irecv, wait() on both, and only then read the buffer.")


def poison(tensor: torch.Tensor) -> None:
    """Fill `tensor` with what no correct result holds: NaN, or the
    dtype's smallest value for integers."""
    tensor.fill_(float("nan") if tensor.is_floating_point()
                 else torch.iinfo(tensor.dtype).min)


def is_poisoned(value) -> bool:
    """True if any tensor in `value` (or a list of them) holds poison."""
    tensors = value if isinstance(value, (list, tuple)) else [value]
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        if t.is_floating_point() and t.isnan().any() or \
                not t.is_floating_point() and (t == torch.iinfo(t.dtype).min).any():
            return True
    return False


class HeldWork:
    """What a checker hands learner code as the work of an all-reduce it
    holds back: torch's Work protocol (`wait`, `is_completed`,
    `get_future`) over `release()`, which a subclass writes and which lands
    the result and completes `self.future`. `wait()` releases and is noted
    (`waited`), so a checker can tell waiting from being released."""

    def __init__(self):
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
        raise NotImplementedError


class _LandsOnWait:
    """A work whose `wait()`, or its future's completion, also copies each
    landing buffer into the tensor the caller gave (once)."""

    def __init__(self, work, landings):
        self._work, self._landings = work, landings

    def wait(self, *args, **kwargs):
        result = self._work.wait(*args, **kwargs)
        self._land()
        return result

    def get_future(self):
        """The work's future, whose callbacks (`.then`) see the landed
        tensors: what a DDP communication hook chains on."""
        tensors = [tensor for _, tensor in self._landings]

        def landed(_future):
            self._land()
            return tensors
        return self._work.get_future().then(landed)

    def is_completed(self) -> bool:
        """As torch's Work: True once the collective is done; then the
        result is in the caller's tensor (a learner may poll instead of
        waiting)."""
        done = self._work.is_completed()
        if done:
            self._land()
        return done

    def _land(self):
        for landing, tensor in self._landings:
            tensor.copy_(landing)
        self._landings = []

    def __getattr__(self, name):
        return getattr(self._work, name)


def all_reduce_landing_on_wait(tensor: torch.Tensor, *args, **kwargs):
    """`dist.all_reduce(tensor, ..., async_op=True)` whose result lands in
    `tensor` only at `wait()` or when its future completes (poison until
    then)."""
    return _all_reduce_landing(dist.all_reduce, tensor, *args, **kwargs)


def _all_reduce_landing(all_reduce, tensor, *args, **kwargs):
    kwargs["async_op"] = True
    landing = tensor.clone()
    work = all_reduce(landing, *args, **kwargs)
    poison(tensor)
    return _LandsOnWait(work, [(landing, tensor)])


def never_waited(works) -> int:
    """How many of `works` (what `lands_on_wait` yields) never landed: never
    waited for, polled to completion, nor their future waited on."""
    return sum(1 for work in works if work._landings)


def _broadcast_landing(broadcast, tensor, src, *args, **kwargs):
    """An async broadcast whose result lands at wait(); the source's own
    tensor is not poisoned (a broadcast only reads it there)."""
    kwargs["async_op"] = True
    landing = tensor.clone()
    work = broadcast(landing, src, *args, **kwargs)
    if dist.get_rank() != src:  # src is a global rank, as in dist.broadcast
        poison(tensor)
    return _LandsOnWait(work, [(landing, tensor)])


class _IrecvLandingOnWait:
    """`dist.irecv` whose data lands in the caller's tensor at `wait()`.
    It compares equal to torch's irecv, so that `dist.P2POp` accepts it."""
    __name__ = "irecv"

    def __init__(self, real_irecv):
        self.real = real_irecv

    def __call__(self, tensor, *args, **kwargs):
        landing = torch.empty_like(tensor)
        work = self.real(landing, *args, **kwargs)
        poison(tensor)
        return _LandsOnWait(work, [(landing, tensor)])

    def __eq__(self, other):
        return other is self or other is self.real

    __hash__ = object.__hash__


@contextlib.contextmanager
def lands_on_wait():
    """Inside: `dist.irecv`, alone or in `dist.batch_isend_irecv`, and
    `dist.all_reduce(..., async_op=True)` work on a buffer of their own and
    copy into the caller's tensor when the work's `wait()` returns (or its
    future completes); the tensor holds poison until then."""
    real_irecv, real_batch = dist.irecv, dist.batch_isend_irecv
    real_all_reduce, real_broadcast = dist.all_reduce, dist.broadcast
    real_all_gather = dist.all_gather
    irecv = _IrecvLandingOnWait(real_irecv)

    started = []

    def all_reduce(tensor, *args, **kwargs):
        if kwargs.get("async_op"):
            started.append(_all_reduce_landing(real_all_reduce, tensor, *args,
                                               **kwargs))
            return started[-1]
        return real_all_reduce(tensor, *args, **kwargs)

    def all_gather(tensor_list, tensor, *args, **kwargs):
        if not kwargs.get("async_op"):
            return real_all_gather(tensor_list, tensor, *args, **kwargs)
        landings = [slot.clone() for slot in tensor_list]
        work = real_all_gather(landings, tensor, *args, **kwargs)
        for slot in tensor_list:
            poison(slot)
        started.append(_LandsOnWait(work, list(zip(landings, tensor_list))))
        return started[-1]

    def broadcast(tensor, src=None, *args, **kwargs):
        if kwargs.get("async_op") and src is not None:
            started.append(_broadcast_landing(real_broadcast, tensor, src, *args,
                                              **kwargs))
            return started[-1]
        if src is None:
            return real_broadcast(tensor, *args, **kwargs)
        return real_broadcast(tensor, src, *args, **kwargs)

    def batch_isend_irecv(p2p_op_list):
        ops, landings = [], []
        for op in p2p_op_list:
            if op.op is not irecv:
                ops.append(op)
                continue
            landing = torch.empty_like(op.tensor)
            poison(op.tensor)
            ops.append(dist.P2POp(real_irecv, landing, op.peer, op.group, op.tag))
            landings.append([(landing, op.tensor)])
        works = real_batch(ops)
        if len(works) == len(p2p_op_list):  # one work per operation
            per_op = iter(landings)
            return [_LandsOnWait(w, next(per_op)) if op.op is irecv
                    else w for w, op in zip(works, p2p_op_list)]
        everything = [pair for pairs in landings for pair in pairs]
        return [_LandsOnWait(w, everything) for w in works]

    dist.irecv, dist.batch_isend_irecv = irecv, batch_isend_irecv
    dist.all_reduce, dist.broadcast = all_reduce, broadcast
    dist.all_gather = all_gather
    try:
        yield started
    finally:
        dist.all_gather = real_all_gather
        dist.irecv, dist.batch_isend_irecv = real_irecv, real_batch
        dist.all_reduce, dist.broadcast = real_all_reduce, real_broadcast


def attempt(call, *args):
    """call(*args), or NOT_ATTEMPTED when it is still a stub: for workers
    whose only job is to call the learner's function."""
    try:
        return call(*args)
    except NotImplementedError:
        return NOT_ATTEMPTED


def describe_deadlock(err, world_size: int, timeout: float) -> str:
    """A WorkerTimeout in the learner's terms: where each rank waited, and
    the hint that fits (point-to-point calls, or collectives out of order)."""
    where = ", ".join(f"rank {r} in {c or 'your code'}()"
                      for r, c in sorted(err.in_collective.items()))
    hint = (DEADLOCK_HINT if any(c in ("send", "recv") for c in
                                 err.in_collective.values())
            else "every rank must make the same calls in the same order.")
    return (f"your function did not finish within {timeout:g} s on "
            f"{world_size} ranks: a deadlock. Where each rank waited: {where}."
            f"\nHint: {hint}")


def run_learner_code(worker, world_size: int, fn, timeout: float = 10.0,
                     trace: bool = False, *, args=(), on_hang=None,
                     alone_hint: str | None = None):
    """Run a checker's `worker(rank, world_size, fn, *args)` on real ranks.
    Returns (results, None), or (None, Verdict) when the learner's code
    raised, hung or is still a stub (the worker then returns NOT_ATTEMPTED).

    on_hang(err, world_size, timeout) words a hang (default: the launcher's
    report); alone_hint is added to an error on a single rank."""
    from ddp_teach.launcher import WorkerError, WorkerTimeout, run
    try:
        results = run(worker, world_size, args=(fn, *args), backend="gloo",
                      timeout=timeout, trace=trace)
    except WorkerTimeout as err:
        if on_hang is not None:
            return None, Verdict(WRONG, on_hang(err, world_size, timeout))
        return None, Verdict(WRONG, f"your function did not finish on "
                                    f"{world_size} ranks:\n{err}")
    except WorkerError as err:
        alone = f"\nHint: {alone_hint}" if alone_hint and world_size == 1 else ""
        return None, Verdict(WRONG, f"your function raised an error on "
                                    f"{world_size} ranks:\n{err}{alone}")
    if NOT_ATTEMPTED in results:
        return None, Verdict(NOT_ATTEMPTED, TODO_MESSAGE)
    return results, None
