"""Checkers for notebook 09's exercises: the tools that find data-parallel bugs.

`dataset_mean`: the mean over every rank's values when ranks hold different
numbers of them (one rank holds none). `strip_ddp_prefix`: a DDP state dict
loaded into a bare model. `differing_tensors`: which parameters and buffers
differ between ranks. `nonfinite_ranks`: on which ranks a loss is NaN or
inf. Each wrong answer is compared with what the likely mistakes produce (a
mean of means, a sum, a local answer; replace() instead of removeprefix();
a sum or allclose as the comparison, the buffers forgotten; the loss
all-reduced, NaN but not inf) so that the hint names the mistake.
"""
import math

import torch
import torch.distributed as dist
from torch import nn

from ddp_teach.exercises.harness import run_learner_code
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, TODO_MESSAGE,
                                         WRONG, Exercise, Verdict, register)


# ---- dataset_mean -----------------------------------------------------------

def _local_losses(rank: int, world_size: int) -> torch.Tensor:
    """Rank 0 holds 5 values, rank 1 one, rank 2 none: a last batch."""
    count = [5, 1, 0][rank]
    return torch.arange(count, dtype=torch.float32) + 10.0 * rank + 1.0


def _mean_on_ranks(rank, world_size, fn):
    try:
        got = fn(_local_losses(rank, world_size))
    except NotImplementedError:
        return NOT_ATTEMPTED
    return float(got)


def _mean_hint(got: float, world_size: int, rank: int) -> str:
    values = [_local_losses(r, world_size) for r in range(world_size)]
    local = values[rank]
    total, count = sum(v.sum().item() for v in values), sum(v.numel() for v in values)
    means = [v.mean().item() for v in values]
    close = lambda a, b: math.isclose(a, b, rel_tol=1e-5)  # noqa: E731
    if math.isnan(got) or close(got, sum(means) / world_size) or \
            close(got, sum(m for m in means if not math.isnan(m)) / world_size):
        return ("that is the mean of the ranks' means: a rank with 1 value "
                "weighs as much as one with 5, and a rank with none gives NaN. "
                "All-reduce the sum and the count, then divide.")
    if close(got, total):
        return ("that is the sum over every rank: divide it by the total "
                "count, all-reduced too.")
    if local.numel() and close(got, total / (local.numel() * world_size)):
        return ("the sum divided by this rank's count times the world size: "
                "that assumes every rank holds as many values. All-reduce the "
                "counts as well.")
    if local.numel() and close(got, local.mean().item()):
        return ("that is this rank's own mean: nothing was communicated. "
                "All-reduce the sum and the count, then divide.")
    return "all-reduce the sum of the values and their count, then divide."


def check_dataset_mean(fn) -> Verdict:
    for world_size in (2, 3):
        results, problem = run_learner_code(_mean_on_ranks, world_size, fn)
        if problem:
            return problem
        values = torch.cat([_local_losses(r, world_size) for r in range(world_size)])
        want = values.mean().item()
        for rank, got in enumerate(results):
            if not math.isclose(got, want, rel_tol=1e-5):
                return Verdict(WRONG, (
                    f"{world_size} ranks holding "
                    f"{[_local_losses(r, world_size).numel() for r in range(world_size)]}"
                    f" values, rank {rank}: expected the mean {want:.4f}, got "
                    f"{got:.4f}.\nHint: " + _mean_hint(got, world_size, rank)))
    return Verdict(CORRECT, "the mean over every value on 2 and 3 ranks holding "
                            "5, 1 and 0 values, the same on every rank.")


# ---- strip_ddp_prefix -------------------------------------------------------

class _Block(nn.Module):
    """Has a submodule called `module`, and one whose name ends in it."""

    def __init__(self):
        super().__init__()
        self.module = nn.Linear(2, 2)
        self.submodule = nn.Linear(2, 1)


def _bare_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 2), _Block())


def check_strip_ddp_prefix(fn) -> Verdict:
    model = _bare_model()
    bare = model.state_dict()
    wrapped = {f"module.{key}": value for key, value in bare.items()}
    for name, given in (("a DDP model's state dict", wrapped),
                        ("a bare model's state dict (no prefix)", bare)):
        try:
            got = fn(dict(given))
        except NotImplementedError:
            return Verdict(NOT_ATTEMPTED, TODO_MESSAGE)
        if not isinstance(got, dict):
            return Verdict(WRONG, f"return a dict, not a {type(got).__name__}."
                                  "\nHint: build a new dict with the new keys.")
        if list(got) == list(bare) and all(torch.equal(got[k], bare[k]) for k in bare):
            continue
        shown = (f"for {name}, expected the keys {list(bare)}, got "
                 f"{list(got)}.\nHint: ")
        return Verdict(WRONG, shown + _prefix_hint(list(given), list(got)))
    fresh = _bare_model()
    fresh.load_state_dict(fn(wrapped))
    return Verdict(CORRECT, "a DDP state dict loads into the bare model (keys "
                            "that contain 'module.' elsewhere kept), and a bare "
                            "state dict is left as it was.")


def _prefix_hint(given: list, got: list) -> str:
    if any(key.startswith("module.") for key in got):
        return "the keys still start with 'module.': remove that prefix."
    if got == [key.replace("module.", "") for key in given]:
        return ("replace() removed 'module.' everywhere in the key, also "
                "inside names such as '1.submodule.weight' or '1.module.bias'. "
                "Remove it only at the start: key.removeprefix('module.').")
    if not any(key.startswith("module.") for key in given):
        return ("these keys had no prefix, and yours changed them anyway: "
                "remove 'module.' only where a key starts with it "
                "(key.removeprefix('module.')).")
    return "keep the values, and remove the leading 'module.' from each key."


# ---- differing_tensors ------------------------------------------------------

WHERE_THEY_DIFFER = ["0.weight", "0.bias", "1.running_mean"]


def _replica(rank: int) -> nn.Module:
    """Three replicas that were meant to be equal. Rank 1's weight has two
    rows swapped (same sum, same norm); rank 2's bias is one bit off, and
    its BatchNorm ran on other data (a buffer, not a parameter)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    with torch.no_grad():
        if rank == 1:
            model[0].weight.copy_(model[0].weight[[1, 0, 2, 3]])
        if rank == 2:
            bias = model[0].bias
            bias[0] = torch.nextafter(bias[0], torch.tensor(math.inf))
            model[1].running_mean.fill_(0.5)
    return model


def _differing_on_ranks(rank, world_size, fn):
    try:
        got = fn(_replica(rank))
    except NotImplementedError:
        return NOT_ATTEMPTED
    return list(got)


def _differing_hint(results: list, world_size: int) -> str:
    if any(sorted(r) != sorted(results[0]) for r in results):
        return ("the ranks returned different lists. A tensor differs if any "
                "two ranks disagree, and every rank must learn that: gather "
                "every rank's tensor (dist.all_gather) and compare them all.")
    got = set(results[0])
    if world_size > 1 and "0.weight" not in got:
        return ("rank 1's 0.weight holds rank 0's values with two rows "
                "swapped: the same sum and norm. Compare the values "
                "themselves (all_gather the tensors), not a sum or a norm.")
    if world_size > 2 and "0.bias" not in got:
        return ("rank 2's 0.bias differs in the last bit of one number. "
                "Replicas must be bit for bit the same: use torch.equal, not "
                "allclose or a tolerance.")
    if world_size > 2 and "1.running_mean" not in got:
        return ("buffers drift too (here a BatchNorm's running mean): check "
                "model.named_buffers() as well as model.named_parameters().")
    return ("return the names (as in named_parameters() and named_buffers()) "
            "of the tensors that are not equal on every rank, and only those.")


def check_differing_tensors(fn) -> Verdict:
    for world_size in (2, 3):
        results, problem = run_learner_code(_differing_on_ranks, world_size, fn)
        if problem:
            return problem
        want = WHERE_THEY_DIFFER[:1] if world_size == 2 else WHERE_THEY_DIFFER
        if all(sorted(r) == sorted(want) for r in results):
            continue
        return Verdict(WRONG, (f"on {world_size} ranks, expected {want} on every "
                               f"rank, got {results} (one list per rank).\nHint: "
                               + _differing_hint(results, world_size)))
    return Verdict(CORRECT, "found the swapped rows, the one-bit bias and the "
                            "drifted buffer, on every rank, with 2 and 3 ranks.")


# ---- nonfinite_ranks --------------------------------------------------------

LOSS_CASES = [  # the loss on ranks 0, 1, 2
    (1.5, math.nan, 0.25),
    (1.5, 2.0, math.inf),
    (1.5, 2.0, 0.25),
    (math.nan, 2.0, -math.inf),
]


def _nonfinite_on_ranks(rank, world_size, fn):
    found = []
    for losses in LOSS_CASES:
        try:
            found.append(list(fn(torch.tensor(losses[rank]))))
        except NotImplementedError:
            return NOT_ATTEMPTED
    return found


def check_nonfinite_ranks(fn) -> Verdict:
    results, problem = run_learner_code(_nonfinite_on_ranks, 3, fn)
    if problem:
        return problem
    for case, losses in enumerate(LOSS_CASES):
        want = [r for r, loss in enumerate(losses) if not math.isfinite(loss)]
        got = [per_rank[case] for per_rank in results]
        if all(g == want for g in got):
            continue
        shown = (f"losses {list(losses)} on ranks 0, 1, 2: expected {want} on "
                 f"every rank, got {got} (one list per rank).\nHint: ")
        return Verdict(WRONG, shown + _nonfinite_hint(got, want, losses))
    return Verdict(CORRECT, "named the ranks with a NaN, an inf or a -inf, and "
                            "none when all were finite, on every rank.")


def _nonfinite_hint(got, want, losses) -> str:
    if any(g != got[0] for g in got):
        return ("the ranks answered differently: each knows only its own loss. "
                "All-gather (or all-reduce) a flag per rank so that every rank "
                "learns about all of them.")
    if want and got[0] == [0, 1, 2]:
        return ("every rank is named: the NaN went through a collective "
                "(all-reduce of the loss) and reached all ranks, which is the "
                "very thing that hides where it started. Communicate a 0/1 "
                "flag per rank, not the loss.")
    if got[0] == [r for r, loss in enumerate(losses) if math.isnan(loss)]:
        return ("an inf is not a NaN (and inf == inf): test with "
                "torch.isfinite, which catches NaN, inf and -inf.")
    return ("flag = not torch.isfinite(loss); gather every rank's flag; "
            "return the ranks whose flag is set, in order.")


register(Exercise(
    "dataset_mean", "The mean over ranks that hold different counts",
    "dataset_mean", "ddp_teach.debugging:dataset_mean", check_dataset_mean,
    ["A mean of means is wrong as soon as ranks hold different numbers of "
     "values: add up the values and count them, over every rank.",
     "t = torch.stack([local_losses.sum(), torch.tensor(float(local_losses.numel()))])"
     "; dist.all_reduce(t) adds both over the ranks.",
     "Return t[0] / t[1]."]))
register(Exercise(
    "strip_ddp_prefix", "Loading a DDP checkpoint into a bare model",
    "strip_ddp_prefix", "ddp_teach.debugging:strip_ddp_prefix",
    check_strip_ddp_prefix,
    ["DDP holds your model as its attribute `module`, so its state dict's "
     "keys are yours with 'module.' in front.",
     "Remove it only at the start of a key: other parts of a name may "
     "contain 'module.' too.",
     "return {key.removeprefix('module.'): value for key, value in "
     "state_dict.items()}"]))
register(Exercise(
    "differing_tensors", "Which tensors differ between replicas",
    "differing_tensors", "ddp_teach.debugging:differing_tensors",
    check_differing_tensors,
    ["Every rank must see every rank's copy of a tensor: dist.all_gather "
     "gives them all.",
     "For each (name, tensor) in named_parameters() and then "
     "named_buffers(): gather, and keep the name if any copy is not "
     "torch.equal to rank 0's.",
     "Use torch.equal, not allclose: replicas drift from the last bit on."]))
register(Exercise(
    "nonfinite_ranks", "Which ranks have a NaN or inf loss",
    "nonfinite_ranks", "ddp_teach.debugging:nonfinite_ranks",
    check_nonfinite_ranks,
    ["Do not all-reduce the loss itself: that spreads the NaN everywhere.",
     "flag = torch.tensor([0 if torch.isfinite(loss).all() else 1]); "
     "gather every rank's flag with dist.all_gather.",
     "Return [rank for rank, flag in enumerate(flags) if flag]."],
    stub_parameters=("loss",)))
