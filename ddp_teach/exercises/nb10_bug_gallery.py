"""Checkers for notebook 11's exercises on metrics and checkpoints
(`dataset_mean`, `strip_ddp_prefix`; the replica tools `differing_tensors`
and `nonfinite_ranks` are in nb10_replicas.py).

What each reference (in ddp_teach/debugging.py) guarantees, each property
checked with the hint that names the mistake breaking it:

`dataset_mean(local_losses)`, on 2 and 3 real ranks holding 5, 1 and 0
values (the last batch of an epoch):
- the mean over every value on every rank: every value weighs the same,
  whatever its rank's count (not a mean of the ranks' means, not the sum,
  not a count assumed equal on every rank, not the world size as count);
- a rank that holds no values is no problem (no 0/0 on it);
- the same answer on every rank (all_reduce, not reduce to rank 0);
- the caller's tensor left as it was;
- an async all-reduce (async_op=True) is waited for: its result lands only
  at wait() (harness.lands_on_wait), so one never waited fails every time.

`strip_ddp_prefix(state_dict)`, on a DDP state dict and on a bare one:
- a new dict whose keys lose the leading "module." once, values unchanged,
  key order free; the given dict left as it was;
- only at the start, and only that prefix: "module." inside a key
  ("model.module.bias", "model.submodule.weight") stays, a submodule called
  `module` keeps its name ("module.module.weight" -> "module.weight"), and
  a key without the prefix is kept whole (not cut by 7 characters), also
  one that starts with "module" but not "module." ("module_norm.weight");
- the prefix removed as a word: `str.lstrip("module.")` removes any of the
  characters m, o, d, u, l, e and "." ("embed.weight" -> "bed.weight").
"""
import math
from collections import OrderedDict

import torch
import torch.distributed as dist
from torch import nn

from ddp_teach.exercises.harness import (UNWAITED_HINT, lands_on_wait, never_waited,
                                        run_learner_code)
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, TODO_MESSAGE,
                                         WRONG, Exercise, Verdict, register)


# ---- dataset_mean -----------------------------------------------------------

def _local_losses(rank: int, world_size: int) -> torch.Tensor:
    """Rank 0 holds 5 values, rank 1 one, rank 2 none (a last batch), ranks 3
    and 4 three and two."""
    count = [5, 1, 0, 3, 2][rank]
    return torch.arange(count, dtype=torch.float32) + 10.0 * rank + 1.0


def _mean_on_ranks(rank, world_size, fn):
    given = _local_losses(rank, world_size)
    with lands_on_wait() as started:  # an async all-reduce lands at wait()
        try:
            got = fn(given)
        except NotImplementedError:
            return NOT_ATTEMPTED
        unwaited = never_waited(started)
    return {"mean": float(got), "unwaited": unwaited,
            "changed": not torch.equal(given, _local_losses(rank, world_size))}


def _mean_hint(results: list, world_size: int, rank: int) -> str:
    """The hint for rank `rank`'s wrong answer (the first wrong rank)."""
    values = [_local_losses(r, world_size) for r in range(world_size)]
    total, count = sum(v.sum().item() for v in values), sum(v.numel() for v in values)
    means = [v.mean().item() for v in values if v.numel()]
    close = lambda a, b: math.isclose(a, b, rel_tol=1e-5)  # noqa: E731
    if any(r["changed"] for r in results):
        return ("your function also changed the caller's local_losses (an "
                "in-place operation such as -=, /= or div_ on it): work on new "
                "tensors.")
    got, local = results[rank]["mean"], values[rank]
    if math.isnan(got) and not all(v.numel() for v in values):
        return ("NaN: rank 2 holds no values, and 0/0 is NaN (the mean of an "
                "empty tensor is NaN); the all-reduce then spreads it to every "
                "rank. Communicate sums and counts, which are 0 on an empty "
                "rank, and divide only once, by the total count.")
    if rank > 0 and close(results[0]["mean"], total / count):
        return ("rank 0 is right, the others are not: only rank 0 got the "
                "whole sum (dist.reduce?). Use dist.all_reduce, so that every "
                "rank holds the sums and counts of all ranks.")
    if close(got, sum(means) / world_size) or close(got, sum(means) / len(means)):
        return ("that is the mean of the ranks' means: a rank with 1 value "
                "weighs as much as one with 5. All-reduce the sum and the "
                "count, then divide.")
    if close(got, total) and world_size == 1:
        return ("that is the sum over every rank (one here), divided by "
                "nothing or by the number of RANKS, 1: divide by the number "
                "of values, all-reduced too.")
    if close(got, total):
        return ("that is the sum over every rank: divide it by the total "
                "count, all-reduced too.")
    if close(got, total / world_size):
        return ("that is the sum over every rank divided by the number of "
                "RANKS: divide by the number of values, all-reduced too.")
    if local.numel() and close(got, total / (local.numel() * world_size)):
        return ("the sum divided by this rank's count times the world size: "
                "that assumes every rank holds as many values. All-reduce the "
                "counts as well.")
    if local.numel() and close(got, local.mean().item()):
        return ("that is this rank's own mean: nothing was communicated. "
                "All-reduce the sum and the count, then divide.")
    return "all-reduce the sum of the values and their count, then divide."


def check_dataset_mean(fn) -> Verdict:
    for world_size in (1, 2, 3, 5):
        results, problem = run_learner_code(_mean_on_ranks, world_size, fn)
        if problem:
            return problem
        counts = [_local_losses(r, world_size).numel() for r in range(world_size)]
        if any(seen["unwaited"] for seen in results):
            return Verdict(WRONG, f"{world_size} ranks holding {counts} values: "
                           f"an async all-reduce was never waited for.\nHint: "
                           f"{UNWAITED_HINT}")
        want = torch.cat([_local_losses(r, world_size) for r in range(world_size)]).mean().item()
        for rank, seen in enumerate(results):
            right = math.isclose(seen["mean"], want, rel_tol=1e-5)
            if right and not seen["changed"]:
                continue
            if right:
                return Verdict(WRONG, f"{world_size} ranks holding {counts} values: "
                               "the right mean, but your function changed the "
                               "caller's local_losses (an in-place operation "
                               "such as -=, /= or sub_ on it).\nHint: leave the "
                               "values as they were given; work on new tensors.")
            return Verdict(WRONG, (
                f"{world_size} ranks holding {counts} values, rank {rank}: expected "
                f"the mean {want:.4f}, got {seen['mean']:.4f}.\nHint: "
                + _mean_hint(results, world_size, rank)))
    return Verdict(CORRECT, "the mean over every value on 2 and 3 ranks holding "
                            "5, 1 and 0 values, the same on every rank.")


# ---- strip_ddp_prefix -------------------------------------------------------

class _Block(nn.Module):
    """Has a submodule called `module`, and one whose name ends in it."""

    def __init__(self):
        super().__init__()
        self.module = nn.Linear(2, 2)
        self.submodule = nn.Linear(2, 1)


class _Wrapped(nn.Module):
    """Names that trip up str.lstrip and str.split: `embed` and `model`
    start with letters of "module.", and a submodule is called `module`, so
    DDP's keys read module.module.weight."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(3, 2)
        self.module = nn.Linear(2, 2)
        self.model = _Block()


def _bare_models() -> list:
    """A model to wrap, and one whose own keys have no top-level `module`
    (a bare state dict with it would look like a DDP one), but one that
    starts with the letters "module" without the dot: `module_norm`."""
    torch.manual_seed(0)
    bare = nn.Sequential(OrderedDict([("0", nn.Linear(3, 2)), ("1", _Block()),
                                      ("2", nn.Linear(1, 3)),
                                      ("module_norm", nn.LayerNorm(3))]))
    return [_Wrapped(), bare]


def _strip_repeatedly(key: str) -> str:
    while key.startswith("module."):
        key = key[len("module."):]
    return key


PREFIX_MISTAKES = [  # (what the mistake does to a key, the hint that names it)
    (lambda key: key[len("module."):] if key.startswith("module") else key,
     "'module_norm.weight' starts with 'module' but not with 'module.', and "
     "lost its first 7 characters: test the whole prefix, dot included, "
     "key.startswith('module.'), or use key.removeprefix('module.')."),
    (lambda key: key.lstrip("module."),
     "str.lstrip('module.') removes any of the CHARACTERS m, o, d, u, l, e and "
     "'.' from the left, not the word: 'module.embed.weight' became "
     "'bed.weight'. Use key.removeprefix('module.')."),
    (lambda key: key.split("module.")[-1],
     "key.split('module.') cuts at every 'module.' in the key, also inside "
     "'model.module.bias' or 'model.submodule.weight'. Remove the prefix "
     "only at the start: key.removeprefix('module.')."),
    (lambda key: key.replace("module.", ""),
     "replace() removed 'module.' everywhere in the key, also inside names "
     "such as 'model.submodule.weight' or 'model.module.bias'. Remove it "
     "only at the start: key.removeprefix('module.')."),
    (_strip_repeatedly,
     "the prefix was removed more than once: DDP adds one 'module.'; a "
     "second one is your model's own submodule called `module`. Remove it "
     "once: key.removeprefix('module.')."),
]


def _prefix_hint(given: dict, got: dict) -> str:
    for mistake, hint in PREFIX_MISTAKES:
        if set(got) == {mistake(key) for key in given}:
            return hint
    if not any(key.startswith("module.") for key in given):
        return ("these keys had no prefix, and yours changed them anyway: "
                "remove 'module.' only where a key starts with it "
                "(key.removeprefix('module.')).")
    if any(key.startswith("module.") for key in got):
        return "the keys still start with 'module.': remove that prefix."
    return "keep the values, and remove the leading 'module.' from each key."


def check_strip_ddp_prefix(fn) -> Verdict:
    wrapped_model, bare_model = _bare_models()
    cases = (("a DDP model's state dict", wrapped_model.state_dict(), "module."),
             ("a bare model's state dict (no prefix)", bare_model.state_dict(), ""))
    for name, bare, prefix in cases:
        given = {prefix + key: value for key, value in bare.items()}
        passed = dict(given)
        try:
            got = fn(passed)
        except NotImplementedError:
            return Verdict(NOT_ATTEMPTED, TODO_MESSAGE)
        if not isinstance(got, dict):
            return Verdict(WRONG, f"return a dict, not a {type(got).__name__}."
                                  "\nHint: build a new dict with the new keys.")
        if got is passed or list(passed) != list(given):
            return Verdict(WRONG, f"for {name}, your function changed the dict it "
                           "was given.\nHint: build and return a NEW dict: the "
                           "caller may still need the old one.")
        if set(got) == set(bare) and all(torch.equal(got[k], bare[k]) for k in bare):
            continue
        if set(got) == set(bare):
            return Verdict(WRONG, f"for {name}, the keys are right but some values "
                           "are not the ones given.\nHint: keep each value as it "
                           "is; only the keys change.")
        return Verdict(WRONG, f"for {name}, expected the keys {list(bare)}, got "
                       f"{list(got)}.\nHint: " + _prefix_hint(given, got))
    fresh = _bare_models()[0]
    fresh.load_state_dict(fn({"module." + k: v for k, v in wrapped_model.state_dict().items()}))
    return Verdict(CORRECT, "a DDP state dict loads into the bare model (names "
                            "with 'module' inside, and a submodule called "
                            "module, kept), and a bare state dict is left as it was.")


register(Exercise(
    "dataset_mean", "The mean over ranks that hold different counts",
    "dataset_mean", "ddp_teach.debugging:dataset_mean", check_dataset_mean,
    ["A mean of means is wrong as soon as ranks hold different numbers of "
     "values: add up the values and count them, over every rank.",
     "One all-reduce can carry both: a tensor holding this rank's sum and "
     "its count. A rank with no values adds 0 and 0.",
     "Divide once, at the end: total sum over total count."]))
register(Exercise(
    "strip_ddp_prefix", "Loading a DDP checkpoint into a bare model",
    "strip_ddp_prefix", "ddp_teach.debugging:strip_ddp_prefix",
    check_strip_ddp_prefix,
    ["DDP holds your model as its attribute `module`, so its state dict's "
     "keys are yours with 'module.' in front.",
     "Remove it only at the start of a key, and only once: other parts of a "
     "name may contain 'module.' too. str.lstrip removes characters, not a "
     "word.",
     "str.removeprefix(prefix) (Python 3.9+) removes a leading prefix, and "
     "leaves a key without it as it is."]))
