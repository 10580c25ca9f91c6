"""Run a learner's code on real ranks for a checker, and read what happened.

A checker's worker function gets the learner's function as its argument; a
stub that still raises NotImplementedError makes the worker return
NOT_ATTEMPTED, which reads as "not attempted", not as a failure.
"""
from ddp_teach.exercises.registry import NOT_ATTEMPTED, TODO_MESSAGE, WRONG, Verdict


def run_learner_code(worker, world_size: int, fn, timeout: float = 10.0,
                     trace: bool = False):
    """Run a checker's `worker(rank, world_size, fn)` on real ranks. Returns
    (results, None), or (None, Verdict) when the learner's code raised, hung
    or is still a stub (the worker then returns NOT_ATTEMPTED)."""
    from ddp_teach.launcher import WorkerError, run
    try:
        results = run(worker, world_size, args=(fn,), timeout=timeout, trace=trace)
    except WorkerError as err:  # a WorkerTimeout too
        return None, Verdict(WRONG, f"on {world_size} ranks:\n{err}")
    if NOT_ATTEMPTED in results:
        return None, Verdict(NOT_ATTEMPTED, TODO_MESSAGE)
    return results, None
