"""Checker for notebook 11's replica tool `differing_tensors` (which
parameters and buffers differ between ranks; `nonfinite_ranks` is checked
in nb10_nonfinite.py).

What the reference (in ddp_teach/debugging.py) guarantees, each property
checked on real ranks with the hint that names the mistake breaking it:

`differing_tensors(model)`, on 1, 2, 3 and 5 ranks (on 1 nothing differs,
not even the NaN every rank holds alike; ranks 3 and 4 are rank 0's copies):
- a tensor differs if its bytes differ on any two ranks: two rows swapped
  (same sum, same norm), one number one bit off (allclose would pass it);
- a NaN on one rank where the others hold a number is a difference;
- a tensor that went NaN in the same places on every rank (as the
  all-reduce of section 6 makes it) is the same on every rank, although
  NaN == NaN is False (torch.equal would call it different);
- buffers count as well as parameters, named as `named_parameters()` and
  `named_buffers()` name them;
- every rank returns the same list (each compares all ranks' copies);
- no per-process hash: ranks forked from one server share Python's hash
  seed, torchrun's do not, so inside the check `hash()` of str and bytes
  is salted per rank, as separate interpreters' would be; an answer that
  compares hash(tensor bytes) is then wrong, and told why.
"""
import builtins
import math

import torch
import torch.distributed as dist
from torch import nn

from ddp_teach.exercises.harness import (UNWAITED_HINT, lands_on_wait, never_waited,
                                        run_learner_code)
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, WRONG,
                                         Exercise, Verdict, register)

# ---- differing_tensors ------------------------------------------------------

# what differs on 2 ranks, and on 3 (rank 2's changes join in)
WHERE_THEY_DIFFER = {1: [], 2: ["0.weight", "1.bias"],
                     3: ["0.weight", "1.bias", "0.bias", "1.running_mean"]}
WHERE_THEY_DIFFER[5] = WHERE_THEY_DIFFER[3]  # ranks 3 and 4 are rank 0's copies


def _replica(rank: int) -> nn.Module:
    """Three replicas that were meant to be equal. Rank 1's weight has two
    rows swapped (same sum, same norm), and its BatchNorm bias a NaN where
    the others hold 0 (a NaN on one rank only); rank 2's bias is one bit
    off, and its BatchNorm ran on other data (a buffer, not a parameter).
    Every rank's BatchNorm weight holds a NaN in the same place: equal."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    with torch.no_grad():
        model[1].weight[2] = math.nan
        if rank == 1:
            model[0].weight.copy_(model[0].weight[[1, 0, 2, 3]])
            model[1].bias[1] = math.nan
        if rank == 2:
            bias = model[0].bias
            bias[0] = torch.nextafter(bias[0], torch.tensor(math.inf))
            model[1].running_mean.fill_(0.5)
    return model


SALTED = (str, bytes, bytearray, memoryview)


def _per_process_hash(rank: int, hashed: list):
    """builtins.hash as it behaves in a process of its own: str and bytes
    hashed with a salt per process (PYTHONHASHSEED's random default), which
    ranks forked from one server share and torchrun's ranks do not; each
    salted call is noted in `hashed`."""
    real = builtins.hash

    def hash(obj, /):  # noqa: A001 (it stands in for the builtin)
        if isinstance(obj, SALTED):
            hashed.append(type(obj).__name__)
            return real((f"process {rank}", bytes(obj) if not isinstance(obj, str)
                         else obj))
        return real(obj)
    return hash


def _differing_on_ranks(rank, world_size, fn):
    hashed, real_hash = [], builtins.hash
    builtins.hash = _per_process_hash(rank, hashed)
    try:
        with lands_on_wait() as started:  # async collectives land at wait()
            got = fn(_replica(rank))
            unwaited = never_waited(started)
    except NotImplementedError:
        return NOT_ATTEMPTED
    finally:
        builtins.hash = real_hash
    return {"names": list(got), "hashed": sorted(set(hashed)),
            "unwaited": unwaited}


def _differing_hint(results: list, world_size: int) -> str:
    if any(sorted(r) != sorted(results[0]) for r in results):
        return ("the ranks returned different lists. A tensor differs if any "
                "two ranks disagree, and every rank must learn that: gather "
                "every rank's tensor (dist.all_gather) and compare them all.")
    got = set(results[0])
    if "1.weight" in got:
        return ("1.weight holds a NaN in the same place on every rank, so the "
                "replicas agree bit for bit, but NaN == NaN is False (and "
                "torch.equal says no). Compare the bytes: e.g. torch.equal("
                "a.view(torch.uint8), b.view(torch.uint8)) on flattened copies.")
    if world_size > 1 and "0.weight" not in got:
        return ("rank 1's 0.weight holds rank 0's values with two rows "
                "swapped: the same sum and, but for rounding, the same norm. "
                "Compare the values themselves (all_gather the tensors), not "
                "a sum or a norm.")
    if "1.bias" not in got:
        return ("rank 1's 1.bias holds a NaN where the other ranks hold 0.0: "
                "a NaN on ONE rank is a difference, and the one that matters "
                "most. nan_to_num, a sum or a norm of the values, or a comparison "
                "that skips NaNs hides it; comparing the bytes does not.")
    if world_size > 2 and "0.bias" not in got:
        return ("rank 2's 0.bias differs in the last bit of one number: a "
                "sum, a norm or allclose can miss it. Replicas must be bit for "
                "bit the same: compare the values exactly, not with allclose "
                "or a tolerance.")
    if world_size > 2 and "1.running_mean" not in got:
        return ("buffers drift too (here a BatchNorm's running mean): check "
                "model.named_buffers() as well as model.named_parameters().")
    return ("return the names (as in named_parameters() and named_buffers()) "
            "of the tensors that are not equal on every rank, and only those.")


HASH_HINT = (
    "your function hashed {kinds} with hash(), and Python salts the hash of "
    "str and bytes with a random seed per process (PYTHONHASHSEED). Ranks "
    "forked from one server, as dt.run's are, share the seed, so this can "
    "look right in the notebook; under torchrun each rank is a process of "
    "its own and equal tensors hash differently on every rank (the checker "
    "gave each rank a seed of its own, as torchrun would). Compare the "
    "bytes themselves (all_gather, then torch.equal on .view(torch.uint8)), "
    "or a digest that does not depend on the process, such as "
    "hashlib.sha256(t.numpy().tobytes()).hexdigest().")


def check_differing_tensors(fn) -> Verdict:
    for world_size in (1, 2, 3, 5):
        runs, problem = run_learner_code(_differing_on_ranks, world_size, fn)
        if problem:
            return problem
        if any(run["unwaited"] for run in runs):
            return Verdict(WRONG, f"on {world_size} ranks an async collective "
                           f"was never waited for.\nHint: {UNWAITED_HINT}")
        results = [run["names"] for run in runs]
        hashed = sorted({kind for run in runs for kind in run["hashed"]})
        want = WHERE_THEY_DIFFER[world_size]
        if all(sorted(r) == sorted(want) for r in results):
            continue
        hint = (HASH_HINT.format(kinds=" and ".join(hashed)) if hashed
                else _differing_hint(results, world_size))
        return Verdict(WRONG, (f"on {world_size} ranks, expected {want} on every "
                               f"rank, got {results} (one list per rank).\nHint: "
                               + hint))
    return Verdict(CORRECT, "found the swapped rows, the NaN on one rank, the "
                            "one-bit bias and the drifted buffer, not the NaN "
                            "that every rank holds alike, on every rank, with "
                            "1, 2, 3 and 5 ranks, each rank hashing as a process of "
                            "its own would.")


register(Exercise(
    "differing_tensors", "Which tensors differ between replicas",
    "differing_tensors", "ddp_teach.debugging:differing_tensors",
    check_differing_tensors,
    ["Every rank must see every rank's copy of a tensor: dist.all_gather "
     "gives them all.",
     "For each (name, tensor) in named_parameters() and then "
     "named_buffers(): gather, and keep the name if any copy's bytes differ "
     "from rank 0's.",
     "Compare bytes, not values: allclose misses the last bit, and NaN == NaN "
     "is False. tensor.view(torch.uint8) shows a tensor's bytes."]))
