"""DistributedSampler from scratch: which samples each rank reads.

Data parallelism needs every rank to see a different slice of the data set
and, for collectives to line up, the SAME number of samples. torch's
`torch.utils.data.distributed.DistributedSampler` does it in three steps,
reproduced here index for index (written anew, not copied):

1. Order: `torch.randperm(length)` from a generator seeded with
   `seed + epoch` (the same on every rank, so the ranks agree on one
   permutation without talking), or `0, 1, ..., length - 1` unshuffled.
2. Equalise: without `drop_last`, pad by going round the list again from the
   start until the total divides by the number of replicas (a few samples
   are seen twice per epoch); with `drop_last`, cut the tail down to the
   largest multiple (a few samples are not seen this epoch).
3. Deal: rank r takes every `num_replicas`-th index starting at r, like
   cards dealt round a table.

Forgetting `set_epoch(epoch)` gives the same order every epoch.
"""
import math

import torch
import torch.distributed as dist


def rank_indices(length: int, num_replicas: int, rank: int, shuffle: bool = True,
                 seed: int = 0, epoch: int = 0, drop_last: bool = False) -> list[int]:
    """The data-set indices rank `rank` reads in epoch `epoch`, in order:
    exactly those of torch's DistributedSampler with the same arguments."""
    _check_replicas(num_replicas, rank)
    if shuffle:
        generator = torch.Generator().manual_seed(seed + epoch)
        order = torch.randperm(length, generator=generator).tolist()
    else:
        order = list(range(length))
    if drop_last:  # torch writes ceil((length - n) / n) when n does not
        per_rank = length // num_replicas  # divide length: the same number
    else:
        per_rank = math.ceil(length / num_replicas)
    total = per_rank * num_replicas
    padded = [order[i % length] for i in range(total)]  # pads from the start
    return padded[rank:total:num_replicas]


class DistributedSampler(torch.utils.data.Sampler):
    """Drop-in for torch's DistributedSampler, built on `rank_indices`.

    `num_replicas` and `rank` default to the default process group's world
    size and rank. Call `set_epoch(epoch)` before each epoch so that the
    shuffle differs between epochs (and agrees between ranks)."""

    def __init__(self, dataset, num_replicas: int | None = None,
                 rank: int | None = None, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False):
        if num_replicas is None or rank is None:
            if not (dist.is_available() and dist.is_initialized()):
                raise ValueError(
                    "DistributedSampler needs num_replicas and rank, or an "
                    "initialised default process group to take them from "
                    "(call dist.init_process_group first, or pass both)")
            num_replicas = dist.get_world_size() if num_replicas is None else num_replicas
            rank = dist.get_rank() if rank is None else rank
        _check_replicas(num_replicas, rank)
        self.dataset, self.num_replicas, self.rank = dataset, num_replicas, rank
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Use this epoch's shuffle from the next `iter(sampler)` on."""
        self.epoch = epoch

    def __iter__(self):
        return iter(rank_indices(len(self.dataset), self.num_replicas, self.rank,
                                 self.shuffle, self.seed, self.epoch,
                                 self.drop_last))

    def __len__(self) -> int:
        if self.drop_last:
            return len(self.dataset) // self.num_replicas
        return math.ceil(len(self.dataset) / self.num_replicas)


def _check_replicas(num_replicas, rank) -> None:
    if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) \
            or num_replicas < 1:
        raise ValueError(f"num_replicas must be a positive int; got {num_replicas!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) \
            or not 0 <= rank < num_replicas:
        raise ValueError(f"rank must be an int from 0 to {num_replicas - 1} "
                         f"(num_replicas={num_replicas}); got {rank!r}")
