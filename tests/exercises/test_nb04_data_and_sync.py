"""Notebook 04's checkers: each passes the reference and catches three
planted mistakes with the hint that fits."""
import pytest
import torch
import torch.distributed as dist
from torch.utils.data.distributed import DistributedSampler

from ddp_teach.ddp import accumulate
from ddp_teach.exercises import reference_solution

global_stats = reference_solution("syncbn_stats")


def stub(*args):
    raise NotImplementedError


def torch_split(length, replicas, rank, shuffle, seed, epoch, drop_last):
    sampler = DistributedSampler(range(length), replicas, rank, shuffle, seed,
                                 drop_last)
    sampler.set_epoch(epoch)
    return list(sampler)


@pytest.mark.parametrize("name, reference", [
    ("sampler_split", torch_split), ("syncbn_stats", global_stats),
    ("no_sync_accumulation", accumulate)])
def test_references_pass_and_stubs_are_not_attempted(name, reference, verdict):
    passed, seen = verdict(name, reference)
    assert passed and "✅" in seen, seen
    passed, seen = verdict(name, stub)
    assert not passed and "not attempted" in seen, seen


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


MISTAKES = [  # (exercise, planted mistake, the hint it must get)
    ("sampler_split", contiguous_blocks, "round-robin"),
    ("sampler_split", ignores_epoch, "seed + epoch"),
    ("sampler_split", no_padding, "the same number of samples"),
    ("syncbn_stats", local_stats, "this rank's own statistics"),
    ("syncbn_stats", mean_of_means, "averaged the ranks' means"),
    ("syncbn_stats", unbiased, "biased variance"),
    ("no_sync_accumulation", every_micro_batch_synced, "all-reduced 3 times"),
    ("no_sync_accumulation", never_synced, "never all-reduced"),
    ("no_sync_accumulation", loss_not_divided, "SUM over micro-batches"),
]


@pytest.mark.parametrize("name, planted, hint", MISTAKES)
def test_each_planted_mistake_gets_the_hint_that_fits(name, planted, hint, verdict):
    passed, seen = verdict(name, planted)
    assert not passed and hint in seen, seen
