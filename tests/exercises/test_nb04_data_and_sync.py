"""Notebook 04's planted mistakes (PLANTED, run by test_registry.py, which
also checks every reference and stub): each must get the hint that fits."""
import torch
import torch.distributed as dist
from torch.utils.data.distributed import DistributedSampler

from ddp_teach.exercises import reference_solution

global_stats = reference_solution("syncbn_stats")


def torch_split(length, replicas, rank, shuffle, seed, epoch, drop_last):
    sampler = DistributedSampler(range(length), replicas, rank, shuffle, seed,
                                 drop_last)
    sampler.set_epoch(epoch)
    return list(sampler)


def contiguous_blocks(length, replicas, rank, shuffle, seed, epoch, drop_last):
    everything = torch_split(length, 1, 0, shuffle, seed, epoch, False)
    total = len(torch_split(length, replicas, rank, shuffle, seed, epoch,
                            drop_last)) * replicas
    padded = (everything * 2)[:total]
    share = total // replicas
    return padded[rank * share:(rank + 1) * share]


def ignores_epoch(length, replicas, rank, shuffle, seed, epoch, drop_last):
    return torch_split(length, replicas, rank, shuffle, seed, 0, drop_last)


def no_padding(length, replicas, rank, shuffle, seed, epoch, drop_last):
    g = torch.Generator().manual_seed(seed + epoch)
    order = torch.randperm(length, generator=g).tolist() if shuffle else list(range(length))
    return order[rank::replicas]


def pads_only_once(length, replicas, rank, shuffle, seed, epoch, drop_last):
    """Right until the padding is longer than the dataset (1 sample, 4 ranks)."""
    g = torch.Generator().manual_seed(seed + epoch)
    order = torch.randperm(length, generator=g).tolist() if shuffle else list(range(length))
    per_rank = len(torch_split(length, replicas, rank, shuffle, seed, epoch, drop_last))
    total = per_rank * replicas
    order = order[:total] if drop_last else order + order[:total - length]
    return order[rank::replicas]


def local_stats(x):
    return x.mean(0), x.var(0, unbiased=False)


def mean_of_means(x):
    mean = x.mean(0)
    dist.all_reduce(mean)
    mean /= dist.get_world_size()
    _, var = global_stats(x)
    return mean, var


def unbiased(x):
    mean, var = global_stats(x)
    count = torch.tensor([float(x.shape[0])])
    dist.all_reduce(count)
    return mean, var * count / (count - 1)


def every_micro_batch_synced(model, micro_batches):
    for x in micro_batches:
        (model(x).square().mean() / len(micro_batches)).backward()


def never_synced(model, micro_batches):
    with model.no_sync():
        for x in micro_batches:
            (model(x).square().mean() / len(micro_batches)).backward()


def loss_not_divided(model, micro_batches):
    for i, x in enumerate(micro_batches):
        if i < len(micro_batches) - 1:
            with model.no_sync():
                model(x).square().mean().backward()
        else:
            model(x).square().mean().backward()


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("sampler_split", contiguous_blocks, "round-robin"),
    ("sampler_split", ignores_epoch, "seed + epoch"),
    ("sampler_split", no_padding, "the same number of samples"),
    ("sampler_split", pads_only_once, "longer than the dataset"),
    ("syncbn_stats", local_stats, "this rank's own statistics"),
    ("syncbn_stats", mean_of_means, "averaged the ranks' means"),
    ("syncbn_stats", unbiased, "biased variance"),
    ("no_sync_accumulation", every_micro_batch_synced, "all-reduced 3 times"),
    ("no_sync_accumulation", never_synced, "never all-reduced"),
    ("no_sync_accumulation", loss_not_divided, "SUM over micro-batches"),
]

