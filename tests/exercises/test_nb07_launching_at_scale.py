"""Notebook 07's planted mistakes for the torchrun exercise (PLANTED, run
by test_registry.py, which also checks every reference and stub). The
checker really runs torchrun for the reference and for the two mistakes
its layout exists for (LOCAL_RANK taken for the rank, a world size written
into the code); its other verdicts are checked here on recorded runs,
which is what the checker's harness produces. The second attempt's
mistakes are the last three records: RANK left a string, the group
destroyed before train, dist.get_world_size() called before the group
exists."""
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


def hard_coded_world_size():
    rank = int(os.environ["RANK"])
    world_size = 2  # what it was in the notebook
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
    # the second attempt
    ([record(0, train=[("0", 2)], error="TypeError: manual_seed expected a "
             "long, but got str"), record(1)], "os.environ holds strings"),
    ([record(0, train=[(0, 2)], error="RuntimeError: train() was called "
             "after destroy_process_group()"), record(1)],
     "destroy it at the end"),
    ([record(0, init=None, train=[], error="ValueError: Default process "
             "group has not been initialized, please make sure to call "
             "init_process_group."), record(1)],
     "read RANK and WORLD_SIZE from os.environ"),
]


@pytest.mark.parametrize("records, hint", RECORDED_MISTAKES)
def test_each_recorded_mistake_gets_the_hint_that_fits(records, hint):
    found = judge(records, EXPECTED)
    assert found.status == "wrong" and hint in found.message, found.message


def test_a_correct_record_is_correct():
    assert judge([record(0), record(1)], EXPECTED).status == "correct"


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("torchrun_script", local_rank_main,
     ("RANK=1, LOCAL_RANK=0", "my_main used rank 0", "LOCAL_RANK counts")),
    ("torchrun_script", hard_coded_world_size,
     ("my_main used world size 2", "right for one job size only")),
]
