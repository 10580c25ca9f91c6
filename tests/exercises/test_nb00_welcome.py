"""Notebook 00's planted mistakes (PLANTED, run by test_registry.py, which
also checks the reference and a stub): the unfixed hang is explained (where
each rank waited), and a fix that drops a collective is told which one to
keep."""
import torch
import torch.distributed as dist


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


def no_all_reduce(rank, world_size):
    """Finishes, by leaving out the collective that was in the way."""
    b = torch.tensor([float(rank + 100)])
    dist.broadcast(b, src=0)
    return float(rank + 1), b.item()


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("fix_hang", planted_hang, ("deadlock", "all_reduce()", "broadcast()")),
    ("fix_hang", no_broadcast, "keep the broadcast"),
    ("fix_hang", no_all_reduce, "keep the all_reduce"),
]
