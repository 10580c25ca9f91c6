"""The counter of DTensor's collectives sees what parallelize_module issues,
forward and backward, with the bytes the Megatron formulas predict."""
import torch
import torch.nn as nn

import ddp_teach as dt
from ddp_teach.dtensor_traffic import (CollectiveCounter, sequence_parallel_block_bytes,
                                       tensor_parallel_block_bytes)

ROWS, H = 6, 8


def mlp_traffic(rank, world_size, sequence_parallel):
    """A two-layer MLP split column- then row-wise; with sequence_parallel
    its input and output are split along dim 0 (the rows)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(H, 4 * H), nn.GELU(), nn.Linear(4 * H, H))
    split = dict(input_layouts=Shard(0)) if sequence_parallel else {}
    joined = dict(output_layouts=Shard(0)) if sequence_parallel else {}
    mlp = parallelize_module(mlp, init_device_mesh("cpu", (world_size,)),
                             {"0": ColwiseParallel(**split),
                              "2": RowwiseParallel(**joined)})
    x = torch.randn(ROWS, H, generator=torch.Generator().manual_seed(1))
    if sequence_parallel:
        x = x.chunk(world_size)[rank]
    x.requires_grad_()
    with CollectiveCounter() as forward:
        out = mlp(x)
    with CollectiveCounter() as backward:
        out.sum().backward()
    return forward.calls, forward.bytes_by_name(), backward.bytes_by_name()


def test_tensor_parallel_mlp_all_reduces_its_output_once_each_way():
    for calls, forward, backward in dt.run(mlp_traffic, 2, args=(False,)):
        assert [c.name for c in calls] == ["all_reduce"]
        assert forward == {"all_reduce": ROWS * H * 4}
        assert backward == {"all_reduce": ROWS * H * 4}  # Megatron's f


def test_sequence_parallel_turns_the_all_reduce_into_gather_and_scatter():
    for calls, forward, backward in dt.run(mlp_traffic, 2, args=(True,)):
        assert [c.name for c in calls] == ["all_gather_into_tensor",
                                           "reduce_scatter_tensor"]
        # the whole buffers, the gathered output and the scattered input
        assert forward == {"all_gather_into_tensor": ROWS * H * 4,
                           "reduce_scatter_tensor": ROWS * H * 4}
        assert backward == forward


def test_nothing_is_counted_outside_dtensor():
    with CollectiveCounter() as counted:
        torch.ones(3).mul(2).sum()
    assert counted.calls == [] and counted.bytes_by_name() == {}


def test_block_formulas_move_the_same_volume_both_ways():
    tp = tensor_parallel_block_bytes(2, 8, 16)
    sp = sequence_parallel_block_bytes(2, 8, 16)
    assert tp == {"all_reduce": 2 * 2 * 8 * 16 * 4}
    assert sp["all_gather_into_tensor"] == sp["reduce_scatter_tensor"] == tp["all_reduce"]
