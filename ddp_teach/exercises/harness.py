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
"""
from ddp_teach.exercises.registry import NOT_ATTEMPTED, TODO_MESSAGE, WRONG, Verdict

DEADLOCK_HINT = ("a blocking dist.send() waits until the receiver takes the "
                 "data, so when every rank sends first, every rank waits. Post "
                 "dist.isend() and dist.irecv() together, then wait() on both "
                 "(or let even ranks send first and odd ranks receive first).")


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
