"""What uneven inputs need: torch's DistributedDataParallel when the ranks
have DIFFERENT numbers of batches.

Every backward all-reduces the gradients, so each rank must run as many
backwards as the others. A rank that runs out of batches stops calling the
all-reduce and the rest wait for it forever, or fail when it leaves
(`without_join`). `torch.distributed.algorithms.Join([ddp_model])` lets a
rank that has finished "shadow" the collectives of the others (it
contributes zero gradients) until every rank is done, so the run ends and
the replicas stay identical (`with_join`).
"""
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms import Join
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_teach as dt

HANG_TIMEOUT_S = 5.0


def batches_of(rank):
    return 2 + 2 * rank  # rank 0: 2 batches, rank 1: 4, rank 2: 6


def train(rank, use_join):
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randn(batches_of(rank), 3, 4,
                       generator=torch.Generator().manual_seed(rank))

    def steps():
        for x in data:
            optimizer.zero_grad()
            model(x).pow(2).sum().backward()
            optimizer.step()

    if use_join:
        with Join([model]):
            steps()
    else:
        steps()
    return [p.detach() for p in model.parameters()]


def with_join(rank, world_size):
    return train(rank, use_join=True)


def without_join(rank, world_size):
    train(rank, use_join=False)
    dist.barrier()  # stands for whatever comes next (evaluation, saving...)


def test_uneven_batches_without_join_do_not_finish():
    # gloo: here the barrier waits forever (WorkerTimeout); without it rank 0
    # exits and rank 1's next all-reduce fails, "Connection reset by peer"
    # (WorkerError). WorkerTimeout is a WorkerError, so both are caught.
    with pytest.raises((dt.WorkerTimeout, dt.WorkerError)):
        dt.run(without_join, 2, timeout=HANG_TIMEOUT_S)


def test_join_lets_uneven_ranks_finish_identical():
    results = dt.run(with_join, 3, timeout=30.0)
    first = results[0]
    for rank, params in enumerate(results[1:], start=1):
        for ours, theirs in zip(params, first):
            assert torch.equal(ours, theirs), f"rank {rank} differs from rank 0"
    torch.manual_seed(0)
    initial = nn.Linear(4, 2)  # where training started: the steps took effect
    assert not torch.equal(first[0], initial.weight.detach())
