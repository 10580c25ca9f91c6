"""Notebook 07's planted mistakes (PLANTED, run by test_registry.py, which
also checks every reference and stub). The torchrun checker really runs
torchrun for the reference and for the mistake it exists for (LOCAL_RANK
taken for the rank); its other verdicts are checked here on recorded runs,
which is what the checker's harness produces."""
import os

import pytest
import torch
import torch.distributed as dist

from ddp_teach.exercises.nb07_launching_at_scale import judge
from ddp_teach.scripts import train


def local_rank_main():
    rank = int(os.environ["LOCAL_RANK"])   # 0 on both nodes
    world_size = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    params = train(rank, world_size)
    dist.destroy_process_group()
    return params


def record(rank, **changes):
    """What the harness records for a correct my_main on 2 x 1 processes."""
    base = {"env": {"RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2",
                    "LOCAL_WORLD_SIZE": "1"},
            "init": {"init_method": None, "rank": -1, "world_size": -1,
                     "store": False},
            "train": [(rank, 2)], "error": None, "result": [torch.ones(2)],
            "left_initialized": False}
    base.update(changes)
    return base


EXPECTED = [[torch.ones(2)], [torch.ones(2)]]
RECORDED_MISTAKES = [  # (what the harness saw, the hint it must give)
    ([record(0, init=None, train=[],
             error="RuntimeError: train() was called before "
                   "init_process_group()"), record(1)],
     "dist.init_process_group(\"gloo\") first"),
    ([record(0, init=dict(record(0)["init"],
                          init_method="tcp://127.0.0.1:29500")), record(1)],
     "MASTER_ADDR and MASTER_PORT"),
    ([record(0), record(1, train=[(1, 1)])], "LOCAL_WORLD_SIZE"),
    ([record(0), record(1, init=dict(record(1)["init"], rank=0))],
     "my_main used rank 0"),
    ([record(0, left_initialized=True), record(1)], "destroy_process_group"),
    ([record(0, result=None), record(1, result=None)],
     "return what train(rank, world_size) returned"),
]


@pytest.mark.parametrize("records, hint", RECORDED_MISTAKES)
def test_each_recorded_mistake_gets_the_hint_that_fits(records, hint):
    found = judge(records, EXPECTED)
    assert found.status == "wrong" and hint in found.message, found.message


def test_a_correct_record_is_correct():
    assert judge([record(0), record(1)], EXPECTED).status == "correct"


def state(model, optimizer, epoch):
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "epoch": epoch}


def every_rank_writes(model, optimizer, epoch, path):
    torch.save(state(model, optimizer, epoch), f"{path}.{dist.get_rank()}")
    os.replace(f"{path}.{dist.get_rank()}", path)
    dist.barrier()


def no_barrier(model, optimizer, epoch, path):
    if dist.get_rank() == 0:
        torch.save(state(model, optimizer, epoch), f"{path}.tmp")
        os.replace(f"{path}.tmp", path)


def straight_into_place(model, optimizer, epoch, path):
    if dist.get_rank() == 0:
        torch.save(state(model, optimizer, epoch), path)
    dist.barrier()


def model_only(model, optimizer, epoch, path):
    if dist.get_rank() == 0:
        torch.save({"model": model.state_dict(), "epoch": epoch},
                   f"{path}.tmp")
        os.replace(f"{path}.tmp", path)
    dist.barrier()


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("torchrun_script", local_rank_main,
     ("RANK=1, LOCAL_RANK=0", "my_main used rank 0", "LOCAL_RANK counts")),
    ("checkpoint_save", every_rank_writes, "only rank 0 writes"),
    ("checkpoint_save", no_barrier, "dist.barrier() after rank 0's save"),
    ("checkpoint_save", straight_into_place, "os.replace(tmp, path)"),
    ("checkpoint_save", model_only, "the optimizer's momentum is state too"),
]
