"""Notebook 00's planted mistakes (PLANTED, run by test_registry.py, which
also checks the reference and a stub): the unfixed hang is explained (where
each rank waited), a fix that drops a collective is told which one to keep,
and each other way to get the values wrong is named."""
import pytest
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


def both_branches_kept(rank, world_size):
    """The if/else deleted, all four calls kept: a is all-reduced twice."""
    a = torch.tensor([float(rank + 1)])
    b = torch.tensor([float(rank + 100)])
    dist.all_reduce(a)
    dist.broadcast(b, src=0)
    dist.broadcast(b, src=0)
    dist.all_reduce(a)
    return a.item(), b.item()


def tensors_swapped(rank, world_size):
    a = torch.tensor([float(rank + 1)])
    b = torch.tensor([float(rank + 100)])
    dist.all_reduce(b)
    dist.broadcast(a, src=0)
    return a.item(), b.item()


def broadcast_from_rank_one(rank, world_size):
    a = torch.tensor([float(rank + 1)])
    b = torch.tensor([float(rank + 100)])
    dist.all_reduce(a)
    dist.broadcast(b, src=min(1, world_size - 1))
    return a.item(), b.item()


def values_typed_in(rank, world_size):
    """No collective at all: the right numbers, computed locally."""
    return world_size * (world_size + 1) / 2, 100.0


def pair_reversed(rank, world_size):
    a = torch.tensor([float(rank + 1)])
    b = torch.tensor([float(rank + 100)])
    dist.all_reduce(a)
    dist.broadcast(b, src=0)
    return b.item(), a.item()


def returns_tensors(rank, world_size):
    """Right, without .item(): one-element tensors count as numbers."""
    a = torch.tensor([float(rank + 1)])
    b = torch.tensor([float(rank + 100)])
    dist.all_reduce(a)
    dist.broadcast(b, src=0)
    return a, b


def returns_a_dict(rank, world_size):
    a = torch.tensor([float(rank + 1)])
    b = torch.tensor([float(rank + 100)])
    dist.all_reduce(a)
    dist.broadcast(b, src=0)
    return {"a": a.item(), "b": b.item()}


def async_never_waited(rank, world_size):
    """The all-reduce started with async_op=True and its work dropped: the
    value is right only when the message happened to land in time."""
    a = torch.tensor([float(rank + 1)])
    b = torch.tensor([float(rank + 100)])
    dist.all_reduce(a, async_op=True)
    dist.broadcast(b, src=0)
    return a.item(), b.item()


def async_broadcast_never_waited(rank, world_size):
    a = torch.tensor([float(rank + 1)])
    b = torch.tensor([float(rank + 100)])
    dist.all_reduce(a)
    dist.broadcast(b, src=0, async_op=True)
    return a.item(), b.item()


def async_waited(rank, world_size):
    """Right: both collectives async, both waited before reading."""
    a = torch.tensor([float(rank + 1)])
    b = torch.tensor([float(rank + 100)])
    works = [dist.all_reduce(a, async_op=True),
             dist.broadcast(b, src=0, async_op=True)]
    for work in works:
        work.wait()
    return a.item(), b.item()


def async_future_and_polling(rank, world_size):
    """Right, in another style: wait on the work's future, poll the other."""
    a = torch.tensor([float(rank + 1)])
    b = torch.tensor([float(rank + 100)])
    dist.all_reduce(a, async_op=True).get_future().wait()
    work = dist.broadcast(b, src=0, async_op=True)
    while not work.is_completed():
        pass
    return float(a), float(b)


@pytest.mark.parametrize("right", [async_waited, async_future_and_polling])
def test_async_collectives_waited_in_any_style_are_right(right, verdict):
    passed, seen = verdict("fix_hang", right)
    assert passed, seen


def test_one_element_tensors_count_as_the_numbers(verdict):
    passed, seen = verdict("fix_hang", returns_tensors)
    assert passed, seen


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("fix_hang", planted_hang, ("deadlock", "all_reduce()", "broadcast()")),
    ("fix_hang", no_broadcast, "keep the broadcast"),
    ("fix_hang", no_all_reduce, "keep the all_reduce"),
    # the second attempt's mistakes
    ("fix_hang", both_branches_kept, ("all-reduced twice", "N times the sum")),
    ("fix_hang", tensors_swapped, "the tensors are swapped"),
    ("fix_hang", broadcast_from_rank_one, ("rank 1's b", "src=0")),
    ("fix_hang", values_typed_in, ("0 all_reduce and 0 broadcast",
                                   "not constants typed in")),
    ("fix_hang", pair_reversed, "you returned (b, a)"),
    ("fix_hang", returns_a_dict, "return the pair (a, b)"),
    ("fix_hang", async_never_waited, ("never waited for it", "work.wait()")),
    ("fix_hang", async_broadcast_never_waited, "never waited for it"),
]
