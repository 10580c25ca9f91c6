"""The checker for notebook 00's exercise: fix the planted hang.

The learner's `my_fixed_order(rank, world_size)` runs on 2 and 3 real ranks.
A version that still hangs is reported with where each rank waited (which
collective), so the learner sees the mismatch; a version that finishes but
dropped a collective to get there is told which one to keep.
"""
from ddp_teach.exercises.harness import attempt, describe_deadlock, run_learner_code
from ddp_teach.exercises.registry import CORRECT, WRONG, Exercise, Verdict, register

CHECK_TIMEOUT_S = 5.0


def _fixed_order_on_ranks(rank, world_size, fn):
    return attempt(fn, rank, world_size)


def check_fixed_order(fn) -> Verdict:
    for world_size in (2, 3):
        results, problem = run_learner_code(
            _fixed_order_on_ranks, world_size, fn, timeout=CHECK_TIMEOUT_S,
            on_hang=describe_deadlock)
        if problem:
            return problem
        total = world_size * (world_size + 1) / 2
        for rank, (a, b) in enumerate(results):
            if a != total:
                return Verdict(WRONG, f"on {world_size} ranks rank {rank} has "
                               f"a = {a:g}, expected {total:g}: keep the "
                               "all_reduce, so that a is the sum on every rank.")
            if b != 100.0:
                return Verdict(WRONG, f"on {world_size} ranks rank {rank} has "
                               f"b = {b:g}, expected 100: keep the broadcast "
                               "from rank 0, so that every rank has rank 0's b.")
    return Verdict(CORRECT, "finished on 2 and 3 ranks with the right values.")


register(Exercise(
    "fix_hang", "Fix the planted hang", "my_fixed_order",
    "ddp_teach.collectives:fixed_collective_order", check_fixed_order,
    ["Run the planted version with a short timeout and read which "
     "collective each rank was waiting in.",
     "Every rank must call the same collectives in the same order: pick one "
     "order and use it on all ranks."]))
