"""Checker for notebook 06's exercise on clipping a gradient that is sharded
over the ranks (ZeRO-2, ZeRO-3), on real ranks.

`my_clip_sharded(shard_grad, max_norm)`: each rank holds its chunk of one
known gradient. What the reference, `ddp_teach.zero.clip_sharded_grad_norm_`,
guarantees, and how each property is checked:

- values: every rank's chunk becomes its chunk of torch's
  `clip_grad_norm_` of the whole gradient, and every rank returns the whole
  gradient's norm (the same number on every rank): on 1 to 5 ranks,
  with the norm above `max_norm` (it clips) and below it (it must not
  scale up);
- in place: the tensor the caller passed is scaled, as torch's function
  scales `.grad` in place;
- a zero gradient: norm 0, the gradient stays zero, no NaN (the 1e-6 in
  the factor);
- traffic: a rank hands collectives at most one float64 number per rank
  per call (an all-reduce of a scalar, or an all-gather of one): a norm
  computed by gathering the shards is right in value and wrong in cost,
  and is rejected, since saving that memory and traffic is the point;
- an empty shard: when a tensor has fewer rows than there are ranks,
  FSDP2's sharding gives the last ranks nothing. Such a rank still joins
  the all-reduce (its sum of squares is 0) and returns the whole norm;
  checked on 3 ranks, shards of 2, 2 and 0 numbers.

A wrong result is compared with the likely mistakes (the shard's own norm,
the ranks' norms added, their squares averaged, their largest norm, the sum
of squares without its square root, a gradient below the limit scaled up,
the shard not changed in place), so that the hint names the mistake.
"""
import torch

from ddp_teach.exercises.harness import (UNWAITED_HINT, describe_deadlock,
                                        lands_on_wait, never_waited,
                                        run_learner_code)
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, WRONG, Exercise,
                                         Verdict, register)
from ddp_teach.flat import flat_slice, shard_size

WORLD_SIZES = (1, 2, 3, 4, 5)
CLIP_LENGTH = 13  # prime: padded to 14, 15, 16 and 15 on 2 to 5 ranks
# name: (the whole gradient, max_norm, how it is cut)
CASES = {
    "a gradient whose norm is above max_norm":
        (lambda: torch.randn(CLIP_LENGTH, generator=torch.Generator()
                             .manual_seed(6)) * 3, 1.0, "flat"),
    "a gradient whose norm is below max_norm":
        (lambda: torch.randn(CLIP_LENGTH, generator=torch.Generator()
                             .manual_seed(6)) * 3, 100.0, "flat"),
    "a zero gradient": (lambda: torch.zeros(CLIP_LENGTH), 1.0, "flat"),
}
EMPTY_CASE = ("4 numbers cut as FSDP2 cuts them (rank 2's shard is empty)",
              (lambda: torch.tensor([3.0, -1.0, 2.0, 0.5]), 1.0, "chunk"))
EMPTY_WORLD_SIZE = 3
NEVER_WAITED = "an async all-reduce never waited"  # what a rank reports then
SCALAR_BYTES = 8  # a float64 number: what a rank needs to send per call
EMPTY_TIMEOUT_S = 8.0  # the reference takes well under a second
ZERO_NORM_HINT = ("a zero gradient has norm 0, and max_norm / norm divides by "
                  "zero. torch's factor is min(1, max_norm / (norm + 1e-6)): "
                  "the 1e-6 keeps it finite, and a zero gradient stays zero.")
EMPTY_HINT = ("a rank's shard may be empty: FSDP2 gives the last ranks "
              "nothing when a tensor has fewer rows than there are ranks. "
              "That rank must still join the all-reduce, with a sum of "
              "squares of 0 (an empty tensor's .square().sum() is 0), and "
              "return the whole norm like every other rank.")


def _shards(case, world_size) -> list:
    """Every rank's shard of the case's gradient: equal chunks of the
    padded flat vector, or torch.chunk's pieces (empty ones at the end)."""
    make, _, cut = case
    whole = make()
    if cut == "chunk":
        pieces = list(whole.chunk(world_size))
        return pieces + [whole[:0]] * (world_size - len(pieces))
    size = shard_size(whole.numel(), world_size)
    return [flat_slice([whole], r * size, (r + 1) * size) for r in range(world_size)]


def _as_number(norm):
    try:
        return float(norm)
    except (TypeError, ValueError, RuntimeError):
        return None


def _clip_on_ranks(rank, world_size, fn, cases):
    results = []
    for case in cases:
        shard = _shards(case, world_size)[rank].clone()
        with lands_on_wait() as started:  # an async all-reduce lands at wait()
            try:
                norm = fn(shard, case[1])
            except NotImplementedError:
                return NOT_ATTEMPTED
            if never_waited(started):
                return NEVER_WAITED
        results.append((_as_number(norm), repr(norm)[:60], shard))
    return results


def _close(a, b) -> bool:
    return a is not None and abs(a - b) <= 1e-4 * max(1.0, abs(b))


def _clip_hint(norm, shard, case, world_size, rank, norms) -> str:
    """The mistake that `norm` and `shard` (this rank's results) show;
    `norms` holds what every rank returned."""
    _, max_norm, _ = case
    chunks = _shards(case, world_size)
    mine = chunks[rank]
    whole = float(case[0]().norm())
    if shard.isnan().any() or (norm is not None and norm != norm):
        return f"NaN appeared: {ZERO_NORM_HINT}"
    squares = [float(c.square().sum()) for c in chunks]
    if whole > 0 and _close(norm, sum(squares)):
        return ("that is the whole gradient's sum of squares: the norm is "
                "its square root.")
    agree = all(_close(other, norm) for other in norms)
    if world_size > 1 and whole > 0:
        if agree and _close(norm, max(float(c.norm()) for c in chunks)):
            return ("that is the largest shard's norm (ReduceOp.MAX): the "
                    "whole gradient's norm is the square root of the SUM of "
                    "the shards' sums of squares.")
        if mine.numel() and (_close(norm, float(mine.norm())) or torch.allclose(
                shard, mine * min(1.0, max_norm / float(mine.norm())))):
            return ("that is this rank's shard's norm. The norm is the whole "
                    "gradient's: all-reduce (SUM) each shard's sum of squares, "
                    "then take the square root.")
        if _close(norm, sum(float(c.norm()) for c in chunks)):
            return ("the ranks' norms were added: norms do not add, squares "
                    "do. All-reduce each shard's sum of squares, then the "
                    "square root.")
        if _close(norm, (sum(squares) / world_size) ** 0.5):
            return ("the sums of squares were averaged (ReduceOp.AVG, or a "
                    "division by world_size): the whole gradient's sum of "
                    "squares is their SUM.")
    if max_norm > whole and not torch.allclose(shard, mine):
        return (f"the gradient's norm ({whole:.3f}) was below max_norm "
                f"({max_norm:g}) and yet it was scaled: the factor is "
                "min(1, max_norm / (norm + 1e-6)), never above 1.")
    if _close(norm, whole) and torch.allclose(shard, mine) and max_norm < whole:
        return ("the norm is right but the gradient was not changed: "
                "multiply the shard in place (shard_grad.mul_(factor)); "
                "`shard_grad = shard_grad * factor` makes a new tensor that "
                "the caller never sees.")
    return ("compute the whole norm (all-reduce the shards' sums of squares, "
            "then sqrt), multiply the shard in place by min(1, max_norm / "
            "(norm + 1e-6)), and return the norm.")


def _torch_clip(case, world_size):
    """(norm, every rank's clipped chunk) by torch's clip_grad_norm_ on the
    whole gradient."""
    param = torch.zeros(case[0]().numel(), requires_grad=True)
    param.grad = case[0]()
    norm = float(torch.nn.utils.clip_grad_norm_([param], case[1]))
    clipped = _shards((lambda: param.grad, case[1], case[2]), world_size)
    return norm, clipped


def _judge(results, cases, names, world_size) -> Verdict | None:
    if any(isinstance(r, str) and r == NEVER_WAITED for r in results):
        return Verdict(WRONG, f"on {world_size} rank{'s' * (world_size > 1)}: an "
                       f"async all-reduce was never waited for.\nHint: "
                       f"{UNWAITED_HINT}")
    for index, (name, case) in enumerate(zip(names, cases)):
        norm, chunks = _torch_clip(case, world_size)
        for rank, rank_results in enumerate(results):
            got_norm, shown, got_shard = rank_results[index]
            want = chunks[rank]
            if (_close(got_norm, norm) and got_shard.shape == want.shape
                    and torch.allclose(got_shard, want, atol=1e-6)):
                continue
            return Verdict(WRONG, (
                f"{world_size} rank{'s' * (world_size > 1)}, {name} "
                f"(max_norm={case[1]:g}), rank {rank}: expected the norm "
                f"{norm:.4f} and the shard "
                f"{[round(v, 4) for v in want.tolist()]}, got {shown} and "
                f"{[round(v, 4) for v in got_shard.tolist()]}.\nHint: "
                + _clip_hint(got_norm, got_shard, case, world_size, rank,
                             [r[index][0] for r in results])))
    return None


def _traffic(timeline, calls, world_size) -> Verdict | None:
    """WRONG when a rank handed collectives more than a number per rank per
    call: the shards themselves travelled. (An event counts its collective's
    whole buffer: an all-gather of one number per rank counts world_size
    numbers, an all-reduce of one number one.)"""
    allowed = calls * world_size * SCALAR_BYTES
    for rank in range(world_size):
        moved = sum(e.nbytes for e in timeline.for_rank(rank) if e.kind == "comm")
        if moved > allowed:
            return Verdict(WRONG, (
                f"{world_size} rank{'s' * (world_size > 1)}: the right norms "
                f"and shards, but rank "
                f"{rank} handed {moved} bytes to collectives over {calls} "
                f"calls, where a number per rank ({allowed} bytes at most, in "
                "float64) is enough.\nHint: gathering the shards (or the "
                "whole gradient) to every rank gives the right norm at the "
                "cost of the very memory and traffic that sharding saves: "
                "each rank sends only its shard's sum of squares, "
                "all-reduced, then takes the square root."))
    return None


def _empty_shard_hang(err, world_size, timeout) -> str:
    return (f"in the case of {EMPTY_CASE[0]}: "
            + describe_deadlock(err, world_size, timeout).split("\nHint:")[0]
            + f"\nHint: {EMPTY_HINT}")


def check_sharded_clip(fn) -> Verdict:
    names, cases = list(CASES), list(CASES.values())
    for world_size in WORLD_SIZES:
        results, problem = run_learner_code(_clip_on_ranks, world_size, fn,
                                            args=(cases,), trace=True)
        if problem:
            if "ZeroDivisionError" in problem.message:
                problem.message += f"\nHint: {ZERO_NORM_HINT}"
            return problem
        wrong = _judge(results, cases, names, world_size) or _traffic(
            results.timeline, len(cases), world_size)
        if wrong:
            return wrong
    name, case = EMPTY_CASE
    results, problem = run_learner_code(
        _clip_on_ranks, EMPTY_WORLD_SIZE, fn, args=([case],),
        timeout=EMPTY_TIMEOUT_S, on_hang=_empty_shard_hang)
    if problem:
        if problem.status == WRONG and "Hint:" not in problem.message:
            problem.message += f"\nIn the case of {name}.\nHint: {EMPTY_HINT}"
        return problem
    wrong = _judge(results, [case], [name], EMPTY_WORLD_SIZE)
    if wrong:
        wrong.message = wrong.message.split("\nHint: ")[0] + f"\nHint: {EMPTY_HINT}"
        return wrong
    return Verdict(CORRECT, "torch's clip_grad_norm_ of the whole gradient, "
                            "shard by shard and in place, on 1 to 5 ranks, "
                            "above and below max_norm, for a zero gradient, "
                            "and with one rank's shard empty.")


register(Exercise(
    "sharded_clip", "Clipping a sharded gradient", "my_clip_sharded",
    "ddp_teach.zero:clip_sharded_grad_norm_", check_sharded_clip,
    ["No rank holds the whole gradient, so no rank can compute its norm "
     "alone: each computes the sum of squares of its shard.",
     "total = shard_grad.square().sum(); dist.all_reduce(total) adds them "
     "up; the norm is total.sqrt().",
     "Multiply the shard in place by (max_norm / (norm + 1e-6)).clamp(max=1), "
     "and return the norm."]))
