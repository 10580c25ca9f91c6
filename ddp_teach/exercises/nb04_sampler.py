"""The checker for notebook 04's first exercise: the indices a rank reads,
as torch's DistributedSampler gives them (the other two exercises are in
nb04_data_and_sync.py and nb04_accumulation.py).

The learner's `my_rank_indices(length, num_replicas, rank, shuffle, seed,
epoch, drop_last)` is called here in the kernel, for every rank of every
case, and compared with torch's own sampler. What the reference
(`sampler.rank_indices`) guarantees, and how each property is checked:

- values: torch's indices, index for index, with and without shuffle and
  drop_last, over several epochs and a seed other than 0;
- every rank gets as many indices (or DDP's collectives would not line
  up): a consequence of the equality, named when it fails;
- drop_last both where it cuts a tail and where the replicas divide the
  length (nothing to cut: torch then takes length / replicas each);
- edge sizes: fewer samples than ranks (the padding then goes round the
  dataset more than once), one rank, an empty dataset (every rank gets []);
- no global state: the order comes from a generator of its own, so
  torch's and Python's global random states are the same after the call
  (checked after each call, then put back, so that a wrong answer does not
  reseed the learner's notebook);
- the ranks agree without talking: each rank's list is computed from the
  arguments alone (every call here is separate). Hash seeds cannot enter:
  torch's permutation does not depend on them.

A wrong answer is compared with what each typical mistake would produce:
blocks instead of a round-robin deal, no padding, padding only once when
it is longer than the dataset, padding from the end, the epoch or the seed
ignored, the rank mixed into the seed, torch's global RNG reseeded, an
empty dataset not handled, so that the hint names the mistake.
"""
import random

import torch
from torch.utils.data.distributed import DistributedSampler as TorchSampler

from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, TODO_MESSAGE,
                                         WRONG, Exercise, Verdict, register)

# (length, num_replicas, shuffle, seed, epoch, drop_last); the empty
# datasets last, so that the ordinary cases are diagnosed first
SAMPLER_CASES = ([(10, 3, shuffle, 0, epoch, drop_last)
                  for shuffle in (False, True) for epoch in (0, 1)
                  for drop_last in (False, True)]
                 + [(12, 4, True, 0, 2, False), (7, 2, True, 0, 0, True),
                    # drop_last where the replicas divide the length: nothing
                    # to drop (torch's num_samples is then length / replicas)
                    (12, 4, True, 0, 1, True), (9, 3, False, 0, 0, True),
                    (1, 4, False, 0, 0, False), (2, 7, True, 0, 1, False),
                    (10, 3, True, 7, 1, False), (5, 1, True, 3, 2, False),
                    (0, 3, True, 0, 0, False), (0, 2, False, 0, 1, True)])


def torch_indices(length, replicas, rank, shuffle, seed, epoch, drop_last):
    sampler = TorchSampler(range(length), num_replicas=replicas, rank=rank,
                           shuffle=shuffle, seed=seed, drop_last=drop_last)
    sampler.set_epoch(epoch)
    return list(sampler)


def _global_random_state():
    return torch.get_rng_state(), random.getstate()


def _restore(state) -> None:
    torch.set_rng_state(state[0])
    random.setstate(state[1])


def _call(fn, args):
    """(indices as a list, whether the global random state changed); the
    state is put back either way."""
    before = _global_random_state()
    try:
        got = list(fn(*args))
    finally:
        after = _global_random_state()
        _restore(before)
    changed = not torch.equal(before[0], after[0]) or before[1] != after[1]
    return got, changed


def check_sampler_split(fn) -> Verdict:
    for length, replicas, shuffle, seed, epoch, drop_last in SAMPLER_CASES:
        for rank in range(replicas):
            args = (length, replicas, rank, shuffle, seed, epoch, drop_last)
            shown = (f"length {length}, {replicas} rank{'s' * (replicas > 1)}, "
                     f"rank {rank}, shuffle={shuffle}, seed {seed}, epoch "
                     f"{epoch}, drop_last={drop_last}")
            try:
                got, reseeded = _call(fn, args)
            except NotImplementedError:
                return Verdict(NOT_ATTEMPTED, TODO_MESSAGE)
            except Exception as error:
                if length:
                    raise  # check() shows the error with the learner's line
                return Verdict(WRONG, f"{shown}: your function raised "
                               f"{type(error).__name__}: {error}.\nHint: an "
                               "empty dataset gives every rank an empty list: "
                               "there is nothing to shuffle or pad with, so "
                               "guard the padding (no division by the length).")
            want = torch_indices(*args)
            if got != want:
                return Verdict(WRONG, f"{shown}: expected {want}, got {got}."
                               f"\nHint: {_sampler_hint(got, want, args)}")
            if reseeded:
                return Verdict(WRONG, f"{shown}: the right indices, but your "
                               "function changed the global random state "
                               "(torch.manual_seed, random.seed?).\nHint: the "
                               "training's own randomness (initialisation, "
                               "dropout) would then restart at every epoch. "
                               "Shuffle with a generator of your own: "
                               "torch.Generator().manual_seed(seed + epoch).")
    return Verdict(CORRECT, "equal to torch's DistributedSampler with and "
                            "without shuffle and drop_last, over several epochs "
                            "and seeds, with datasets smaller than the number of "
                            "ranks, one rank and empty datasets too, and no "
                            "global random state touched.")


def _sampler_hint(got, want, args) -> str:
    length, replicas, rank, shuffle, seed, epoch, drop_last = args
    if epoch and got == torch_indices(length, replicas, rank, shuffle, seed,
                                      0, drop_last):
        return ("the order ignores the epoch: seed the generator with "
                "seed + epoch, or every epoch repeats the same order.")
    if seed and got == torch_indices(length, replicas, rank, shuffle, 0, epoch,
                                     drop_last):
        return ("the order ignores the seed: seed the generator with "
                "seed + epoch, so that a job started with another seed reads "
                "another order.")
    if shuffle and rank and got == torch_indices(length, replicas, rank, shuffle,
                                                 seed + rank, epoch, drop_last):
        return ("the rank is in the seed, so each rank shuffles differently "
                "and ranks read overlapping samples: every rank must draw the "
                "SAME permutation (seed + epoch only), then take its share.")
    padding = len(want) * replicas - length
    if drop_last and length % replicas == 0 and len(got) != len(want):
        return (f"here the {replicas} replicas divide the length {length}, so "
                "drop_last drops nothing: each rank takes length / num_replicas "
                "indices. Cut a tail only when length % num_replicas != 0.")
    if len(got) != len(want) and not drop_last and padding > length:
        return (f"here the padding ({padding} indices) is longer than the "
                f"dataset ({length}): repeat the indices as many times as it "
                "takes to reach num_samples * num_replicas, not just once.")
    if len(got) != len(want):
        return ("every rank must get the same number of samples (or ranks "
                "take different numbers of steps and DDP hangs): without "
                "drop_last pad by repeating indices from the start; with it, "
                "drop the tail.")
    if not drop_last and 0 < padding <= length and got == _padded_from_end(args, len(want)):
        return ("the padding repeats the last indices: pad by repeating "
                "indices from the START of the (shuffled) list, as torch does.")
    if sorted(got) == sorted(want):
        return ("the right samples in the wrong order: shuffle with "
                "torch.randperm(length, generator=g) seeded seed + epoch.")
    order = _full_order(args, len(want))
    if got == order[rank * len(want):(rank + 1) * len(want)]:
        return ("deal the (shuffled, padded) indices out round-robin: rank r "
                "takes indices[r::num_replicas], not a contiguous block.")
    if shuffle and all(0 <= i < length for i in got):
        return ("the indices are not torch's permutation: DistributedSampler "
                "shuffles with torch.randperm(length, generator=g), g seeded "
                "seed + epoch. Another generator (numpy, random, "
                "torch.randperm without g) gives another order, so your ranks "
                "would not read what torch's sampler reads.")
    return ("shuffle (torch.randperm with a generator seeded seed + epoch), "
            "pad from the start or cut the tail, then rank r takes "
            "indices[r::num_replicas].")


def _full_order(args, per_rank) -> list:
    """torch's whole (shuffled, padded or cut) list before it is dealt out."""
    length, replicas, rank, shuffle, seed, epoch, _ = args
    order = (torch.randperm(length, generator=torch.Generator().manual_seed(
        seed + epoch)).tolist() if shuffle else list(range(length)))
    total = per_rank * replicas
    while len(order) < total:
        order = order + order[:total - len(order)]
    return order[:total]


def _padded_from_end(args, per_rank) -> list:
    length, replicas, rank, shuffle, seed, epoch, _ = args
    order = (torch.randperm(length, generator=torch.Generator().manual_seed(
        seed + epoch)).tolist() if shuffle else list(range(length)))
    padded = order + order[length - (per_rank * replicas - length):]
    return padded[rank::replicas]


register(Exercise(
    "sampler_split", "The sampler's index split", "my_rank_indices",
    "ddp_teach.sampler:rank_indices", check_sampler_split,
    ["Shuffle (or not) all indices with a generator of your own, seeded "
     "seed + epoch: torch.randperm(length, generator=g).",
     "Without drop_last, pad by going round the list again from the start "
     "until it divides by num_replicas; with drop_last, cut the tail.",
     "Rank r takes indices[r::num_replicas]."],
    stub_parameters=("length", "num_replicas", "rank", "shuffle", "seed", "epoch",
                     "drop_last")))
