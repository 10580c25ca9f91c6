"""Checkers for notebook 06's exercises on ZeRO-1 and ZeRO-2, on real ranks
(ZeRO-3's is in nb06_zero3.py).

`zero1_step`: shard assignment and the ZeRO-1 step. Several steps of AdamW
and of SGD with momentum on 2 and 3 ranks are compared with the unsharded
optimizer; a wrong answer is compared with what each typical mistake would
produce (every rank taking chunk 0, no all-gather, the gradient summed over
ranks again or divided by their number again, the given optimizer never
stepped) so that the hint names it.
SGD is there because Adam barely notices a gradient N times too large.

`sharded_clip`: clipping a gradient that is sharded over the ranks. Each
rank holds its chunk of one known gradient; the result must be torch's
`clip_grad_norm_` of the whole gradient, chunk by chunk, with the whole
norm returned. A wrong answer is compared with the likely mistakes (the
shard's own norm, the ranks' norms added, their squares averaged, a
gradient below the limit scaled up, the shard not changed in place).
"""
import torch
import torch.distributed as dist
from torch import nn

from ddp_teach.exercises.harness import run_learner_code
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, WRONG, Exercise,
                                         Verdict, register)
from ddp_teach.zero import flat_slice, shard_size

LENGTH, STEPS = 12, 4  # 12 elements split evenly over 2 and 3 ranks
OPTIMIZERS = {
    "AdamW": lambda params: torch.optim.AdamW(params, lr=0.1, weight_decay=0.1),
    "SGD with momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
}


def _initial_params():
    return torch.linspace(-1.0, 1.0, LENGTH)


def _grads(step):
    """The averaged gradient at `step`: the same on every rank."""
    return torch.randn(LENGTH, generator=torch.Generator().manual_seed(step))


def _zero1_on_ranks(rank, world_size, fn):
    size = LENGTH // world_size
    results = {}
    for name, make_optimizer in OPTIMIZERS.items():
        flat = _initial_params()
        shard = nn.Parameter(flat[rank * size:(rank + 1) * size].clone())
        optimizer = make_optimizer([shard])
        try:
            for step in range(STEPS):
                fn(flat, _grads(step), shard, optimizer)
        except NotImplementedError:
            return NOT_ATTEMPTED
        state = optimizer.state.get(shard, {})
        stepped = any(isinstance(v, torch.Tensor) and v.numel() == size
                      for v in state.values())
        results[name] = (flat.clone(), stepped)
    return results


def _simulate(make_optimizer, world_size, grad_of_chunk):
    """The flat vector after STEPS, each chunk r stepped with
    grad_of_chunk(step, r) by an optimizer of its own."""
    size = LENGTH // world_size
    chunks = []
    for rank in range(world_size):
        chunk = nn.Parameter(_initial_params()[rank * size:(rank + 1) * size])
        optimizer = make_optimizer([chunk])
        for step in range(STEPS):
            chunk.grad = grad_of_chunk(step, rank).clone()
            optimizer.step()
        chunks.append(chunk.detach())
    return torch.cat(chunks)


def _zero1_hint(got, stepped, make_optimizer, world_size, rank) -> str:
    size = LENGTH // world_size

    def chunk(step, r):
        return _grads(step)[r * size:(r + 1) * size]

    if torch.allclose(got, _simulate(make_optimizer, world_size,
                                     lambda step, r: chunk(step, 0))):
        return ("every rank stepped with chunk 0 of the gradient: rank r owns "
                "elements [r*S, (r+1)*S), S = len(flat_params) // world_size.")
    mine = slice(rank * size, (rank + 1) * size)
    others = torch.ones(LENGTH, dtype=torch.bool)
    others[mine] = False
    if torch.equal(got[others], _initial_params()[others]):
        return ("the other ranks' chunks never changed: after the step, "
                "all-gather every rank's shard into flat_params "
                "(dist.all_gather_single(flat_params, shard.detach())).")
    if torch.allclose(got, _simulate(make_optimizer, world_size,
                                     lambda step, r: chunk(step, r) * world_size)):
        return ("the gradient is world_size times too large: flat_grads is "
                "already averaged over the ranks, so take your slice of it "
                "as it is, with no further reduce.")
    if torch.allclose(got, _simulate(make_optimizer, world_size,
                                     lambda step, r: chunk(step, r) / world_size)):
        return ("the gradient is world_size times too small: flat_grads is "
                "already averaged over the ranks (DDP divided by world_size), "
                "so do not divide it again.")
    if not stepped:
        return ("step the optimizer you were given: it owns the shard and "
                "keeps its state (momentum, Adam's moments) from step to step.")
    return ("put your slice of flat_grads in shard.grad, call "
            "optimizer.step(), then all-gather the shards into flat_params.")


def check_zero1_step(fn) -> Verdict:
    for world_size in (2, 3):
        results, problem = run_learner_code(_zero1_on_ranks, world_size, fn,
                                            timeout=60.0)
        if problem:
            return problem
        for name, make_optimizer in OPTIMIZERS.items():
            want = _simulate(make_optimizer, 1, lambda step, _: _grads(step))
            for rank, rank_results in enumerate(results):
                got, stepped = rank_results[name]
                shown = (f"{name}, {world_size} ranks, rank {rank}, after "
                         f"{STEPS} steps:\nexpected {want.tolist()}\n"
                         f"got      {got.tolist()}\nHint: ")
                if not torch.allclose(got, want, rtol=1e-5, atol=1e-6):
                    return Verdict(WRONG, shown + _zero1_hint(
                        got, stepped, make_optimizer, world_size, rank))
                if not stepped:
                    return Verdict(WRONG, f"{name}, {world_size} ranks: the "
                                   "parameters are right, but the optimizer you "
                                   "were given holds no state for the shard.\n"
                                   "Hint: step IT, on the shard only. An "
                                   "optimizer over the whole vector keeps state "
                                   "for all of it: the memory ZeRO-1 saves.")
    return Verdict(CORRECT, "equal to the unsharded optimizer (AdamW and SGD "
                            "with momentum) on 2 and 3 ranks, with optimizer "
                            "state for one shard per rank.")


CLIP_LENGTH = 13  # padded to 14 on 2 ranks, 15 on 3
CLIP_CASES = (1.0, 100.0)  # below the whole gradient's norm, and above it


def _full_gradient():
    return torch.randn(CLIP_LENGTH, generator=torch.Generator().manual_seed(6)) * 3


def _clip_on_ranks(rank, world_size, fn):
    size = shard_size(CLIP_LENGTH, world_size)
    results = []
    for max_norm in CLIP_CASES:
        shard = flat_slice([_full_gradient()], rank * size, (rank + 1) * size)
        try:
            norm = fn(shard, max_norm)
        except NotImplementedError:
            return NOT_ATTEMPTED
        results.append((None if norm is None else float(norm), shard))
    return results


def _clip_hint(norm, shard, max_norm, world_size, rank) -> str:
    size = shard_size(CLIP_LENGTH, world_size)
    chunks = [flat_slice([_full_gradient()], r * size, (r + 1) * size)
              for r in range(world_size)]
    mine = chunks[rank]
    whole = float(_full_gradient().norm())

    def close(a, b):
        return a is not None and abs(a - b) <= 1e-4 * max(1.0, abs(b))

    if close(norm, float(mine.norm())) or torch.allclose(
            shard, mine * min(1.0, max_norm / float(mine.norm()))):
        return ("that is this rank's shard's norm. The norm is the whole "
                "gradient's: all-reduce (SUM) each shard's sum of squares, "
                "then take the square root.")
    if close(norm, sum(float(c.norm()) for c in chunks)):
        return ("the ranks' norms were added: norms do not add, squares do. "
                "All-reduce each shard's sum of squares, then the square root.")
    if close(norm, (sum(float(c.square().sum()) for c in chunks)
                    / world_size) ** 0.5):
        return ("the sums of squares were averaged (ReduceOp.AVG, or a "
                "division by world_size): the whole gradient's sum of squares "
                "is their SUM.")
    if max_norm > whole and not torch.allclose(shard, mine):
        return (f"the gradient's norm ({whole:.3f}) was below max_norm "
                f"({max_norm:g}) and yet it was scaled: the factor is "
                "min(1, max_norm / (norm + 1e-6)), never above 1.")
    if close(norm, whole) and torch.allclose(shard, mine):
        return ("the norm is right but the gradient was not changed: "
                "multiply the shard in place (shard_grad.mul_(factor)).")
    return ("compute the whole norm (all-reduce the shards' sums of squares, "
            "then sqrt), multiply the shard in place by min(1, max_norm / "
            "(norm + 1e-6)), and return the norm.")


def check_sharded_clip(fn) -> Verdict:
    for world_size in (2, 3):
        results, problem = run_learner_code(_clip_on_ranks, world_size, fn)
        if problem:
            return problem
        size = shard_size(CLIP_LENGTH, world_size)
        for case, max_norm in enumerate(CLIP_CASES):
            param = torch.zeros(CLIP_LENGTH, requires_grad=True)
            param.grad = _full_gradient()  # torch's clip, on the whole gradient
            norm = torch.nn.utils.clip_grad_norm_([param], max_norm)
            whole = param.grad
            for rank, rank_results in enumerate(results):
                got_norm, got_shard = rank_results[case]
                want = flat_slice([whole], rank * size, (rank + 1) * size)
                if got_norm is not None and abs(got_norm - float(norm)) < 1e-4 \
                        and torch.allclose(got_shard, want, atol=1e-6):
                    continue
                return Verdict(WRONG, (
                    f"{world_size} ranks, max_norm={max_norm:g}, rank {rank}: "
                    f"expected the norm {float(norm):.4f} and the shard "
                    f"{[round(v, 4) for v in want.tolist()]}, got {got_norm} "
                    f"and {[round(v, 4) for v in got_shard.tolist()]}.\nHint: "
                    + _clip_hint(got_norm, got_shard, max_norm, world_size, rank)))
    return Verdict(CORRECT, "torch's clip_grad_norm_ of the whole gradient, "
                            "shard by shard, on 2 and 3 ranks, above and below "
                            "max_norm.")


register(Exercise(
    "zero1_step", "Shard assignment and the ZeRO-1 step", "zero1_step",
    "ddp_teach.zero:zero1_step", check_zero1_step,
    ["Rank r owns elements [r*S, (r+1)*S) of the flat vector, "
     "S = len(flat_params) // world_size.",
     "Put that slice of flat_grads into shard.grad and call optimizer.step(): "
     "it updates the shard, and keeps optimizer state for it alone.",
     "Then dist.all_gather_single(flat_params, shard.detach()) writes every "
     "rank's updated shard into flat_params, in rank order."]))
register(Exercise(
    "sharded_clip", "Clipping a sharded gradient", "my_clip_sharded",
    "ddp_teach.zero:clip_sharded_grad_norm_", check_sharded_clip,
    ["No rank holds the whole gradient, so no rank can compute its norm "
     "alone: each computes the sum of squares of its shard.",
     "total = shard_grad.square().sum(); dist.all_reduce(total) adds them "
     "up; the norm is total.sqrt().",
     "Multiply the shard in place by (max_norm / (norm + 1e-6)).clamp(max=1), "
     "and return the norm."]))
