"""Checker for notebook 11's `nonfinite_ranks(loss)`: on which ranks a
loss is NaN or inf (`differing_tensors` is checked in nb10_replicas.py).

What the reference (ddp_teach.debugging.nonfinite_ranks) guarantees, each
checked on 1, 2, 3 and 5 ranks, small to large, with NaN, inf, -inf and
finite losses (a NaN on one rank only, and on every rank):
- the ranks whose loss is NaN, inf or -inf, in order, on every rank;
- found from a flag per rank: neither the loss itself communicated (the
  all-reduce spreads the NaN) nor a flag reduced to one (that says whether
  SOME rank is bad, not which);
- the loss left as it was (it is backpropagated next).
"""
import math

import torch
import torch.distributed as dist

from ddp_teach.exercises.harness import (UNWAITED_HINT, lands_on_wait, never_waited,
                                        run_learner_code)
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, WRONG,
                                         Exercise, Verdict, register)

LOSS_CASES = [  # the loss on ranks 0, 1, ...: one rank first, then more
    (math.nan,), (1.5,),
    (math.inf, -math.inf), (1.5, 2.0),  # == inf, isnan, isinf: each differs
    (1.5, math.nan, 0.25),
    (1.5, 2.0, math.inf),
    (1.5, 2.0, 0.25),
    (math.nan, 2.0, -math.inf),
    (math.nan, math.nan, math.nan),  # every rank bad: all of them named
    (1.5, 2.0, 0.25, 3.0, math.nan),
    (math.inf, 2.0, 0.25, -math.inf, 1.0),
]
WORLD_SIZES = sorted({len(losses) for losses in LOSS_CASES})


def _cases(world_size: int) -> list:
    """The loss cases for `world_size` ranks, in LOSS_CASES' order."""
    return [losses for losses in LOSS_CASES if len(losses) == world_size]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN equal to NaN."""
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


def _nonfinite_on_ranks(rank, world_size, fn):
    with lands_on_wait() as started:  # async collectives land at wait()
        seen = _nonfinite_calls(rank, _cases(world_size), fn)
        if seen is not NOT_ATTEMPTED:
            seen["unwaited"] = never_waited(started)
    return seen


def _nonfinite_calls(rank, cases, fn):
    found, reduced, changed = [], set(), False
    real = dist.all_reduce

    def spy(tensor, *args, **kwargs):  # notes what was all-reduced
        reduced.add("loss" if tensor.numel() == 1 and _same(tensor.detach().reshape(()), value)
                    else "flag")
        return real(tensor, *args, **kwargs)
    dist.all_reduce = spy
    try:
        for losses in cases:
            value = torch.tensor(losses[rank])
            loss = torch.tensor(losses[rank], requires_grad=True) * 1.0  # as a loss is
            try:
                found.append(list(fn(loss)))
            except NotImplementedError:
                return NOT_ATTEMPTED
            changed = changed or not _same(loss.detach(), value)
    finally:
        dist.all_reduce = real
    return {"found": found, "reduced": sorted(reduced), "changed": changed}


def check_nonfinite_ranks(fn) -> Verdict:
    for world_size in WORLD_SIZES:
        problem = _wrong_on(world_size, fn)
        if problem:
            return problem
    return Verdict(CORRECT, "named the ranks with a NaN, an inf or a -inf, and "
                            "none when all were finite, on every rank, on "
                            f"{', '.join(map(str, WORLD_SIZES))} ranks, the "
                            "loss left as it was.")


def _wrong_on(world_size: int, fn) -> Verdict | None:
    """The verdict on the first wrong case on `world_size` ranks, or None."""
    results, problem = run_learner_code(_nonfinite_on_ranks, world_size, fn)
    if problem:
        return problem
    ranks = f"on {world_size} rank{'s' * (world_size > 1)}"
    if any(r["unwaited"] for r in results):
        return Verdict(WRONG, f"{ranks} an async collective was never waited "
                       f"for.\nHint: {UNWAITED_HINT}")
    cases = _cases(world_size)
    for case, losses in enumerate(cases):
        want = [r for r, loss in enumerate(losses) if not math.isfinite(loss)]
        got = [per_rank["found"][case] for per_rank in results]
        if all(g == want for g in got):
            continue
        shown = (f"{ranks}, losses {list(losses)} on ranks "
                 f"{', '.join(map(str, range(world_size)))}: expected {want} on "
                 f"every rank, got {got} (one list per rank).\nHint: ")
        return Verdict(WRONG, shown + _nonfinite_hint(got, want, results[0],
                                                       cases))
    if any(r["changed"] for r in results):
        return Verdict(WRONG, f"{ranks}, the right ranks, but your function "
                       "changed the loss it was given (an in-place all_reduce "
                       "or nan_to_num_ on it?), and the training step "
                       "backpropagates that loss next.\nHint: communicate a "
                       "new tensor (a flag), and leave the loss alone.")
    return None


FLAG_MISTAKES = [  # (which losses the mistake flags, the hint that names it)
    (math.isnan, "an inf is not a NaN (and inf == inf): test with "
     "torch.isfinite, which catches NaN, inf and -inf."),
    (lambda loss: math.isnan(loss) or loss == math.inf, "-inf counts too: test "
     "with torch.isfinite, which catches NaN, inf and -inf, rather than "
     "comparing with inf."),
    (math.isinf, "a NaN is not an inf: test with torch.isfinite, which catches "
     "NaN, inf and -inf."),
]


def _nonfinite_hint(got, want, seen, cases) -> str:
    """The hint for `got` (one list per rank) on a failing case; `seen`
    is rank 0's record over every case of `cases`."""
    if any(g != got[0] for g in got):
        return ("the ranks answered differently: each knows only its own loss. "
                "All-gather a flag per rank so that every rank learns about all "
                "of them.")
    if want and len(want) < len(got) and got[0] == list(range(len(got))):
        if "loss" in seen["reduced"]:
            return ("every rank is named: the NaN went through a collective "
                    "(all-reduce of the loss) and reached all ranks, which is "
                    "the very thing that hides where it started. Communicate a "
                    "0/1 flag per rank, not the loss.")
        return ("every rank is named: an all-reduce of a flag (MAX or SUM) "
                "says whether SOME rank is bad, not which. Gather one flag "
                "per rank (dist.all_gather) and return the ranks whose flag "
                "is set.")
    for flagged, hint in FLAG_MISTAKES:
        if all(found == [r for r, loss in enumerate(losses) if flagged(loss)]
               for found, losses in zip(seen["found"], cases)):
            return hint
    return ("flag = not torch.isfinite(loss); gather every rank's flag; "
            "return the ranks whose flag is set, in order.")


register(Exercise(
    "nonfinite_ranks", "Which ranks have a NaN or inf loss",
    "nonfinite_ranks", "ddp_teach.debugging:nonfinite_ranks",
    check_nonfinite_ranks,
    ["Do not all-reduce the loss itself: that spreads the NaN everywhere.",
     "A 0/1 flag per rank (is this rank's loss finite?), gathered from every "
     "rank with dist.all_gather, says which ranks went bad.",
     "Return the ranks whose flag is set, in rank order; leave the loss "
     "as it was."],
    stub_parameters=("loss",)))
