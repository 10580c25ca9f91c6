"""ZeRO-3 on simulated GPUs: prefetching the next unit's all-gather hides it
behind compute, which a CPU cannot show (gloo and compute share its cores)."""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import ddp_teach as dt


def zero3_step(rank, world_size, prefetch):
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(512, 512) for _ in range(6)])
    sharded = dt.zero.FullyShardedDataParallel(model, prefetch=prefetch)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(128, 512, generator=g), torch.randn(128, 512, generator=g)
    for _ in range(2):
        dist.barrier()
        start = dt.tracing.now()
        F.mse_loss(sharded(x), y).backward()
        took = dt.tracing.now() - start
    return took, [p.grad.clone() for p in sharded.parameters()]


@pytest.mark.parametrize("link", ["PCIe 4 x16", "NVLink 4"])
def test_prefetch_makes_a_simulated_zero3_step_faster_with_the_same_gradients(link):
    sim = dt.sim.Simulation("A100 80GB", link)
    without = dt.run(zero3_step, 4, args=(False,), simulate=sim)
    with_prefetch = dt.run(zero3_step, 4, args=(True,), simulate=sim)
    assert max(t for t, _ in with_prefetch) < max(t for t, _ in without)
    for (_, a), (_, b) in zip(with_prefetch, without):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


def fsdp2_step(rank, world_size):
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(4)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    x = torch.randn(32, 256, generator=torch.Generator().manual_seed(rank))
    for _ in range(2):
        dist.barrier()
        model(x).square().mean().backward()
    return [p.grad.to_local().clone() for p in model.parameters()]


def test_torch_fsdp2_runs_simulated_with_its_gathers_and_scatters_on_the_link():
    sim = dt.sim.Simulation("A100 80GB", "PCIe 4 x16")
    simulated = dt.run(fsdp2_step, 2, simulate=sim)
    real = dt.run(fsdp2_step, 2)
    for got, want in zip(simulated, real):
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    step = simulated.timeline.after_last_barrier()
    names = [e.name for e in step.for_rank(0) if e.kind == "comm"]
    assert names.count("all_gather_single") >= 8, "each layer, forward and backward"
    assert names.count("reduce_scatter_single") == 4, "each layer's gradients"
    again = dt.run(fsdp2_step, 2, simulate=sim).timeline.after_last_barrier()
    assert [(e.start, e.end) for e in again] == [(e.start, e.end) for e in step]
