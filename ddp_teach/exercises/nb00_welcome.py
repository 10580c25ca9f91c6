"""The checker for notebook 00's exercise: fix the planted hang.

The learner's `my_fixed_order(rank, world_size)` runs on 2, 3 and 1 real
ranks (one rank last: there most wrong values look right), traced. What
the reference (`collectives.fixed_collective_order`) guarantees, and how
each property is checked:

- it finishes on every world size: no rank waits in a collective the
  others never join (a hang is reported with where each rank waited);
- it returns the pair (a, b), two numbers (a one-element tensor counts);
- a is the sum of rank + 1 over the ranks, on every rank;
- b is rank 0's b, 100, on every rank;
- each rank makes exactly one all_reduce and one broadcast: the values
  come from the collectives, not from constants typed in;
- an async collective (async_op=True) is waited for before its tensor is
  read: inside `harness.lands_on_wait` its result lands only at `wait()`
  (or once `is_completed()` says True), so an unwaited one reads NaN on
  every run, not only on the runs where the message was late.

No tensor of the caller's, no hash seed and no empty rank enter this
exercise; world size 1 is the edge size (both collectives are then no-ops
that must still be called).

Wrong answers are matched with the mistakes they look like: the hang left
in, a collective dropped, both branches' calls kept (a summed twice), the
tensors swapped between the two calls, the broadcast from another rank,
values typed in, the pair returned in the other order.
"""
import torch

import math

from ddp_teach.exercises.harness import (UNWAITED_HINT, attempt,
                                        describe_deadlock, lands_on_wait,
                                        never_waited, run_learner_code)
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, WRONG, Exercise,
                                         Verdict, register)

CHECK_TIMEOUT_S = 5.0
WORLD_SIZES = (1, 2, 3, 4, 5)  # small to large: the first failure is the smallest
RANK0_B = 100.0
NEVER_WAITED = "an async collective never waited"  # what a rank reports then


def _fixed_order_on_ranks(rank, world_size, fn):
    with lands_on_wait() as started:  # an async collective's result lands at wait()
        returned = attempt(fn, rank, world_size)
        if never_waited(started) and returned is not NOT_ATTEMPTED:
            return NEVER_WAITED
        return returned


def _as_number(value):
    """A float from a number or a one-element tensor; None otherwise."""
    if isinstance(value, torch.Tensor):
        return float(value.item()) if value.numel() == 1 else None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _pair(returned):
    """(a, b) as floats, or None when `returned` is not two numbers."""
    if not isinstance(returned, (tuple, list)) or len(returned) != 2:
        return None
    a, b = map(_as_number, returned)
    return None if a is None or b is None else (a, b)


def _collective_counts(timeline, rank) -> dict:
    names = [e.name for e in timeline.for_rank(rank) if e.kind == "comm"]
    return {name: names.count(name) for name in ("all_reduce", "broadcast")}


def _value_hint(pairs) -> str | None:
    """The hint for the ranks' (a, b) pairs, or None when they are right."""
    world_size = len(pairs)
    total = world_size * (world_size + 1) / 2
    every_b = sum(RANK0_B + r for r in range(world_size))
    a_s, b_s = {a for a, _ in pairs}, {b for _, b in pairs}
    if all(pair == (RANK0_B, total) for pair in pairs) and total != RANK0_B:
        return "you returned (b, a): return (a, b), in that order."
    if world_size > 1 and a_s == {1.0} and b_s == {every_b}:
        return ("a holds rank 0's a and b the sum of every rank's b: the "
                "tensors are swapped. all_reduce(a), then broadcast(b, src=0).")
    if world_size > 1 and a_s == {world_size * total}:
        return (f"a is {world_size} times the sum: it was all-reduced twice "
                "(both branches' calls kept?). Call all_reduce(a) once on "
                "every rank, then broadcast(b, src=0) once.")
    if a_s != {total}:
        return ("keep the all_reduce, so that a is the sum on every rank "
                f"(here {total:g}).")
    others = {RANK0_B + r for r in range(1, world_size)}
    if len(b_s) == 1 and b_s <= others:
        return (f"every rank holds rank {b_s.pop() - RANK0_B:g}'s b: broadcast "
                "from rank 0 (src=0).")
    if b_s != {RANK0_B}:
        return ("keep the broadcast from rank 0, so that every rank has rank "
                "0's b (100).")
    return None


def _count_hint(made) -> str | None:
    """The hint for a rank's collective calls, or None for one of each."""
    if made == {"all_reduce": 1, "broadcast": 1}:
        return None
    if made == {"all_reduce": 0, "broadcast": 0}:
        return ("the values must come from the collectives, not constants "
                "typed in: call all_reduce(a), then broadcast(b, src=0).")
    if made["broadcast"] == 0:
        return ("keep the broadcast from rank 0, so that every rank has rank "
                "0's b, whatever it is.")
    if made["all_reduce"] == 0:
        return "keep the all_reduce, so that a is the sum on every rank."
    if made["all_reduce"] == 2:
        return ("a was all-reduced twice (both branches' calls kept?): on one "
                "rank that changes nothing, on N ranks a is N times the sum. "
                "Call all_reduce(a) once on every rank, then broadcast(b, "
                "src=0) once.")
    return ("call all_reduce(a) once and broadcast(b, src=0) once on every "
            "rank.")


def check_fixed_order(fn) -> Verdict:
    for world_size in WORLD_SIZES:
        results, problem = run_learner_code(
            _fixed_order_on_ranks, world_size, fn, timeout=CHECK_TIMEOUT_S,
            trace=True, on_hang=describe_deadlock)
        if problem:
            return problem
        ranks = f"on {world_size} rank{'s' * (world_size > 1)}"
        unwaited = [r for r, got in enumerate(results)
                    if isinstance(got, str) and got == NEVER_WAITED]
        if unwaited:
            return Verdict(WRONG, f"{ranks}, rank {unwaited[0]} "
                           f"started an async collective and never waited for "
                           f"it.\nHint: {UNWAITED_HINT}")
        pairs = [_pair(returned) for returned in results]
        for rank, (pair, returned) in enumerate(zip(pairs, results)):
            if pair is None:
                return Verdict(WRONG, f"{ranks}, rank {rank} returned "
                               f"{returned!r:.80}.\nHint: return the pair "
                               "(a, b) of numbers, as the cell does: return "
                               "a.item(), b.item().")
        hint = (UNWAITED_HINT if any(math.isnan(v) for pair in pairs for v in pair)
                else _value_hint(pairs))
        if hint:
            got = ", ".join(f"rank {r}: a = {a:g}, b = {b:g}"
                            for r, (a, b) in enumerate(pairs))
            return Verdict(WRONG, f"{ranks} expected a = "
                           f"{world_size * (world_size + 1) / 2:g} and b = "
                           f"{RANK0_B:g} on every rank; got {got}.\nHint: {hint}")
        for rank in range(world_size):
            made = _collective_counts(results.timeline, rank)
            hint = _count_hint(made)
            if hint:
                return Verdict(WRONG, f"{ranks}, rank {rank}: right values, but "
                               f"the rank made {made['all_reduce']} all_reduce "
                               f"and {made['broadcast']} broadcast calls.\n"
                               f"Hint: {hint}")
    return Verdict(CORRECT, f"finished on {', '.join(map(str, WORLD_SIZES))} "
                            "ranks with the right values, one all_reduce and "
                            "one broadcast per rank.")


register(Exercise(
    "fix_hang", "Fix the planted hang", "my_fixed_order",
    "ddp_teach.collectives:fixed_collective_order", check_fixed_order,
    ["Run the planted version with a short timeout and read which "
     "collective each rank was waiting in.",
     "Every rank must call the same collectives in the same order: pick one "
     "order and use it on all ranks."]))
