"""Pipeline and tensor parallelism on CPU ranks: each gives exactly what one
process computes on the whole model, and moves the bytes its formula says."""
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import ddp_teach as dt
from ddp_teach import pipeline, tensor_parallel as tp

WIDTH, DEPTH, BATCH = 16, 4, 12


def make_layers():
    torch.manual_seed(0)
    return [m for _ in range(DEPTH) for m in (nn.Linear(WIDTH, WIDTH), nn.Tanh())]


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)


def test_split_layers_makes_contiguous_near_equal_stages():
    assert pipeline.split_layers(range(8), 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert pipeline.split_layers(range(7), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    with pytest.raises(ValueError):
        pipeline.split_layers(range(2), 3)


def test_bubble_formula_is_gpipes():
    assert pipeline.bubble_fraction(2, 1) == pytest.approx(1 / 2)
    assert pipeline.bubble_fraction(4, 4) == pytest.approx(3 / 7)
    assert pipeline.bubble_fraction(1, 8) == 0.0


def pipe(rank, world_size, micro_batches):
    x, y = data()
    stage = nn.Sequential(*pipeline.split_layers(make_layers(), world_size)[rank])
    loss = pipeline.gpipe_step(stage, x if rank == 0 else None,
                               y if rank == world_size - 1 else None,
                               micro_batches, (BATCH // micro_batches, WIDTH))
    return loss, [p.grad for p in stage.parameters()]


@pytest.mark.parametrize("world_size, micro_batches", [(2, 1), (2, 4), (3, 3)])
def test_gpipe_equals_one_process_on_the_whole_batch(world_size, micro_batches):
    result = dt.run(pipe, world_size, args=(micro_batches,), trace=True)
    model = nn.Sequential(*make_layers())
    x, y = data()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    assert result[-1][0] == pytest.approx(loss.item(), rel=1e-5)
    grads = [g for _, stage_grads in result for g in stage_grads]
    for got, param in zip(grads, model.parameters(), strict=True):
        assert torch.allclose(got, param.grad, atol=1e-6)
    # only activations cross a boundary: forward, then their gradients back
    sent = sum(e.nbytes for e in result.timeline if e.name == "send")
    assert sent == (world_size - 1) * pipeline.pipeline_bytes(BATCH, WIDTH)
    computed = {e.name for e in result.timeline.for_rank(0) if e.kind == "compute"}
    assert computed == {f"{p}{i}" for p in "FB" for i in range(micro_batches)}


def test_measured_bubble_of_a_schedule_with_known_gaps():
    from ddp_teach.tracing.events import COMPUTE, Event
    events = [Event(0, "F0", COMPUTE, 0.0, 1.0), Event(0, "B0", COMPUTE, 3.0, 4.0),
              Event(1, "F0", COMPUTE, 1.0, 2.0), Event(1, "B0", COMPUTE, 2.0, 3.0)]
    timeline = dt.Timeline(events)
    assert pipeline.measured_bubble(timeline, 0) == pytest.approx(0.5)
    assert pipeline.measured_bubble(timeline, 1) == pytest.approx(0.5)


H, ROWS = 8, 4


def make_mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(H, 4 * H), nn.GELU(), nn.Linear(4 * H, H))


def inputs():
    return torch.randn(ROWS, H, generator=torch.Generator().manual_seed(3))


def tensor_parallel(rank, world_size):
    mlp = make_mlp()
    up = mlp[0]
    column = tp.column_parallel_forward(
        inputs(), tp.shard(up.weight.detach(), 0, rank, world_size),
        tp.shard(up.bias.detach(), 0, rank, world_size))
    hidden = tp.shard(F.gelu(up(inputs())).detach(), 1, rank, world_size)
    row = tp.row_parallel_forward(
        hidden, tp.shard(mlp[2].weight.detach(), 1, rank, world_size),
        mlp[2].bias.detach())
    dist.barrier()  # what follows is one training step of the parallel MLP
    parallel = tp.ParallelMLP(mlp)
    x = inputs().requires_grad_()
    out = parallel(x)
    out.square().sum().backward()
    return (column, row, out.detach(), x.grad, parallel.up.weight.grad,
            parallel.down.weight.grad, parallel.down.bias.grad)


@pytest.mark.parametrize("world_size", [2, 4])
def test_split_layers_equal_the_whole_layer_forward_and_backward(world_size):
    result = dt.run(tensor_parallel, world_size, trace=True)
    mlp = make_mlp()
    x = inputs().requires_grad_()
    out = mlp(x)
    out.square().sum().backward()
    with torch.no_grad():
        first = mlp[0](inputs())
    for column, row, parallel_out, x_grad, *_ in result:
        assert torch.allclose(column, first, atol=1e-6)      # all-gather
        assert torch.allclose(row, out.detach(), atol=1e-5)  # all-reduce
        assert torch.allclose(parallel_out, out.detach(), atol=1e-5)
        assert torch.allclose(x_grad, x.grad, atol=1e-5)     # f's all-reduce
    up_grads = torch.cat([r[4] for r in result], dim=0)    # rows per rank
    down_grads = torch.cat([r[5] for r in result], dim=1)  # columns per rank
    assert torch.allclose(up_grads, mlp[0].weight.grad, atol=1e-5)
    assert torch.allclose(down_grads, mlp[2].weight.grad, atol=1e-5)
    assert all(torch.allclose(r[6], mlp[2].bias.grad, atol=1e-5) for r in result)
    # the MLP's step: one all-reduce of ROWS x H in forward, one in backward
    step = result.timeline.after_last_barrier().for_rank(0)
    reduces = [e.nbytes for e in step if e.name == "all_reduce"]
    assert reduces == [ROWS * H * 4] * 2
    assert sum(reduces) == tp.megatron_mlp_bytes(ROWS, H)


def test_shard_refuses_an_uneven_split():
    with pytest.raises(ValueError, match="equal parts"):
        tp.shard(torch.zeros(5, 2), 0, 0, 2)
