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
    ("no_sync_accumulation", every_micro_batch_synced, "all-reduced 2 times"),
    ("no_sync_accumulation", never_synced, "never all-reduced"),
    ("no_sync_accumulation", loss_not_divided, "SUM over micro-batches"),
]



# the second attempt's mistakes
def ignores_seed(length, replicas, rank, shuffle, seed, epoch, drop_last):
    return torch_split(length, replicas, rank, shuffle, 0, epoch, drop_last)


def rank_in_seed(length, replicas, rank, shuffle, seed, epoch, drop_last):
    return torch_split(length, replicas, rank, shuffle, seed + rank, epoch, drop_last)


def deal(order, length, replicas, rank, drop_last):
    """Pad from the start (or cut), then deal round-robin: torch's rule."""
    per_rank = length // replicas if drop_last else -(-length // replicas)
    total = per_rank * replicas
    padded = [order[i % length] for i in range(total)]
    return padded[rank::replicas]


def reseeds_torch(length, replicas, rank, shuffle, seed, epoch, drop_last):
    """Right indices (torch's global generator, seeded alike, draws the same
    permutation), at the price of reseeding the whole program."""
    torch.manual_seed(seed + epoch)
    order = torch.randperm(length).tolist() if shuffle else list(range(length))
    return deal(order, length, replicas, rank, drop_last) if length else []


def no_guard_for_empty(length, replicas, rank, shuffle, seed, epoch, drop_last):
    g = torch.Generator().manual_seed(seed + epoch)
    order = torch.randperm(length, generator=g).tolist() if shuffle else list(range(length))
    copies = -(-replicas // length)  # how often to go round: 1 / 0 when empty
    per_rank = length // replicas if drop_last else -(-length // replicas)
    return (order * copies * 2)[:per_rank * replicas][rank::replicas]


def pads_from_the_end(length, replicas, rank, shuffle, seed, epoch, drop_last):
    g = torch.Generator().manual_seed(seed + epoch)
    order = torch.randperm(length, generator=g).tolist() if shuffle else list(range(length))
    per_rank = length // replicas if drop_last else -(-length // replicas)
    total = per_rank * replicas
    if total > length:
        order = order + order[length - (total - length):]
    return order[:total][rank::replicas]


def weighted_local_means(x):
    """Right while every rank has rows; an empty rank's mean is 0/0."""
    count = torch.tensor([float(x.shape[0])])
    packed = torch.cat([count, x.mean(0) * count, (x * x).mean(0) * count])
    dist.all_reduce(packed)
    mean = packed[1:4] / packed[0]
    return mean, packed[4:] / packed[0] - mean ** 2


def squares_in_place(x):
    count = torch.tensor([float(x.shape[0])])
    sums = x.sum(0)
    packed = torch.cat([count, sums, x.pow_(2).sum(0)])
    dist.all_reduce(packed)
    mean = packed[1:4] / packed[0]
    return mean, packed[4:] / packed[0] - mean ** 2


def gathers_every_row(x):
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, x)
    rows = torch.cat(everyone)
    return rows.mean(0), rows.var(0, unbiased=False)


def one_number_for_all_channels(x):
    packed = torch.tensor([float(x.numel()), x.sum().item(), (x * x).sum().item()])
    dist.all_reduce(packed)
    mean = packed[1] / packed[0]
    return mean, packed[2] / packed[0] - mean ** 2


def forward_outside_no_sync(model, micro_batches):
    for i, x in enumerate(micro_batches):
        loss = model(x).square().mean() / len(micro_batches)
        if i < len(micro_batches) - 1:
            with model.no_sync():
                loss.backward()
        else:
            loss.backward()


def zeroes_between(model, micro_batches):
    for i, x in enumerate(micro_batches):
        model.zero_grad()
        if i < len(micro_batches) - 1:
            with model.no_sync():
                (model(x).square().mean() / len(micro_batches)).backward()
        else:
            (model(x).square().mean() / len(micro_batches)).backward()


def all_reduced_by_hand(model, micro_batches):
    with model.no_sync():
        for x in micro_batches:
            (model(x).square().mean() / len(micro_batches)).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def count_typed_in(model, micro_batches):
    """Right for 3 micro-batches only."""
    for i, x in enumerate(micro_batches):
        if i < 2:
            with model.no_sync():
                (model(x).square().mean() / 3).backward()
        else:
            (model(x).square().mean() / 3).backward()


def pops_the_list(model, micro_batches):
    count = len(micro_batches)
    while micro_batches:
        x = micro_batches.pop(0)
        if micro_batches:
            with model.no_sync():
                (model(x).square().mean() / count).backward()
        else:
            (model(x).square().mean() / count).backward()


PLANTED += [
    ("sampler_split", ignores_seed, "ignores the seed"),
    ("sampler_split", rank_in_seed, ("the rank is in the seed", "SAME permutation")),
    ("sampler_split", reseeds_torch, ("changed the global random state",
                                      "generator of your own")),
    ("sampler_split", no_guard_for_empty, ("length 0", "ZeroDivisionError",
                                           "an empty dataset")),
    ("sampler_split", pads_from_the_end, "from the START"),
    ("syncbn_stats", weighted_local_means, ("[50, 0, 3]", "0 by 0", "NaN")),
    ("syncbn_stats", squares_in_place, ("rows changed", "x.pow_(2)")),
    ("syncbn_stats", gathers_every_row, ("bytes to collectives", "send no rows")),
    ("syncbn_stats", one_number_for_all_channels, "one mean and one variance per channel"),
    ("no_sync_accumulation", forward_outside_no_sync,
     ("although you entered no_sync", "decides in forward")),
    ("no_sync_accumulation", zeroes_between, "do not zero the gradients"),
    ("no_sync_accumulation", all_reduced_by_hand, "you called dist.all_reduce yourself"),
    ("no_sync_accumulation", count_typed_in, ("with 1 micro-batch", "len(micro_batches)")),
    ("no_sync_accumulation", pops_the_list, "changed the list of micro-batches"),
]
