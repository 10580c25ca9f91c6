"""Notebook 04's exercises tried as a learner would: mistakes nobody
planted at first (PLANTED, run by test_registry.py) and right answers in
other styles than the reference's."""
import itertools
import math

import numpy as np
import torch


def drop_last_always_cuts(length, replicas, rank, shuffle, seed, epoch, drop_last):
    """torch's formula for the cut, (length - replicas) / replicas, used
    whether or not the replicas divide the length: one sample short then."""
    g = torch.Generator().manual_seed(seed + epoch)
    order = torch.randperm(length, generator=g).tolist() if shuffle else list(range(length))
    per_rank = (math.ceil((length - replicas) / replicas) if drop_last
                else math.ceil(length / replicas))
    total = max(per_rank, 0) * replicas
    padded = list(itertools.islice(itertools.cycle(order), total)) if order else []
    return padded[rank::replicas]


def numpy_shuffle(length, replicas, rank, shuffle, seed, epoch, drop_last):
    """Right everywhere but the shuffle, drawn by numpy: another order."""
    order = (np.random.default_rng(seed + epoch).permutation(length).tolist()
             if shuffle else list(range(length)))
    per_rank = length // replicas if drop_last else -(-length // replicas)
    return [order[i % length] for i in range(per_rank * replicas)][rank::replicas]


def by_cycling(length, replicas, rank, shuffle, seed, epoch, drop_last):
    """Right, in another style: itertools pads by going round, a stride deals."""
    if shuffle:
        order = torch.randperm(length, generator=torch.Generator().manual_seed(
            seed + epoch)).tolist()
    else:
        order = list(range(length))
    if drop_last and length % replicas:
        count = math.ceil((length - replicas) / replicas)
    else:
        count = math.ceil(length / replicas)
    total = count * replicas
    return list(itertools.islice(itertools.cycle(order), total))[rank:total:replicas] \
        if order else []


def as_a_tensor(length, replicas, rank, shuffle, seed, epoch, drop_last):
    """Right, computed on tensors and returned as one (its items are 0-d
    tensors, which compare equal to ints)."""
    g = torch.Generator().manual_seed(seed + epoch)
    order = torch.randperm(length, generator=g) if shuffle else torch.arange(length)
    per_rank = length // replicas if drop_last else -(-length // replicas)
    if length == 0:
        return torch.zeros(0, dtype=torch.long)
    padded = order.repeat(-(-per_rank * replicas // length))[:per_rank * replicas]
    return padded[rank::replicas]


def test_right_answers_in_other_styles_pass(verdict):
    for right in (by_cycling, as_a_tensor):
        passed, seen = verdict("sampler_split", right)
        assert passed, seen


PLANTED = [  # (exercise, mistake, the hint it must get): see test_registry
    ("sampler_split", drop_last_always_cuts,
     ("length 12, 4 ranks", "divide the length 12", "drops nothing")),
    ("sampler_split", numpy_shuffle, ("not torch's permutation", "numpy")),
]


def one_backward_of_the_sum(model, micro_batches):
    """The full-batch gradient from one backward of the summed losses: one
    all-reduce, never no_sync, every micro-batch's graph alive at once."""
    sum(model(x).square().mean() for x in micro_batches).__truediv__(
        len(micro_batches)).backward()


def one_no_sync_block(model, micro_batches):
    """Right, in another style: one with-block around all but the last."""
    *first, last = micro_batches
    with model.no_sync():
        for x in first:
            (model(x).square().mean() / len(micro_batches)).backward()
    (model(last).square().mean() / len(micro_batches)).backward()


def exit_stack_per_batch(model, micro_batches):
    """Right, in another style: an ExitStack entered for all but the last."""
    import contextlib
    n = len(micro_batches)
    for i, x in enumerate(micro_batches):
        with contextlib.ExitStack() as stack:
            if i < n - 1:
                stack.enter_context(model.no_sync())
            loss = model(x).square().mean()
            loss.div(n).backward()


def test_accumulation_in_other_styles_passes(verdict):
    for right in (one_no_sync_block, exit_stack_per_batch):
        passed, seen = verdict("no_sync_accumulation", right)
        assert passed, seen


def stats_with_an_unwaited_all_reduce(x):
    """Right when the all-reduce happens to land before it is read."""
    import torch.distributed as dist
    x = x.double()
    sums = torch.cat([torch.tensor([float(len(x))]).double(), x.sum(0),
                      (x * x).sum(0)])
    dist.all_reduce(sums, async_op=True)
    count, total, squares = sums[0], sums[1:4], sums[4:]
    mean = total / count
    return mean, squares / count - mean ** 2


PLANTED += [
    ("syncbn_stats", stats_with_an_unwaited_all_reduce, ("never waited for",
                                                         "work.wait()")),
    ("no_sync_accumulation", one_backward_of_the_sum,
     ("1 backward pass for 2 micro-batches", "activations alive at once")),
]
