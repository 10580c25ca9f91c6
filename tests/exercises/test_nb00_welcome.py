"""Notebook 00's checker: the fixed order passes; the unfixed hang is
explained (where each rank waited), and a fix that drops a collective is
told which one to keep."""
import torch
import torch.distributed as dist

from ddp_teach.collectives import fixed_collective_order


def planted_hang(rank, world_size):
    a = torch.tensor([float(rank + 1)])
    b = torch.tensor([float(rank + 100)])
    if rank == 0:
        dist.all_reduce(a)
        dist.broadcast(b, src=0)
    else:
        dist.broadcast(b, src=0)
        dist.all_reduce(a)
    return a.item(), b.item()


def no_broadcast(rank, world_size):
    a = torch.tensor([float(rank + 1)])
    dist.all_reduce(a)
    return a.item(), float(rank + 100)


def test_fix_hang_accepts_the_fix_and_explains_the_unfixed_hang(verdict):
    assert verdict("fix_hang", fixed_collective_order)[0]
    passed, seen = verdict("fix_hang", planted_hang)
    assert not passed and "deadlock" in seen
    assert "all_reduce()" in seen and "broadcast()" in seen
    passed, seen = verdict("fix_hang", no_broadcast)
    assert not passed and "keep the broadcast" in seen


def test_the_unsolved_stub_is_not_attempted(verdict):
    def stub(rank, world_size):
        raise NotImplementedError("your turn: delete this line first")

    passed, seen = verdict("fix_hang", stub)
    assert not passed and "not attempted" in seen, seen
