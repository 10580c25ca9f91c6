"""dt.diagnosis: the emulations it states, the comparison with one GPU, and
the reference diagnosis on simulated runs (one rank on the meta device,
copied to every rank, as dt.sim.one_rank assumes)."""
import math

import pytest
import torch
import torch.distributed as dist
from torch import nn

import ddp_teach as dt
from ddp_teach.diagnosis import (bus_bandwidth, diagnose, every_rank, host_memory_link,
                                 shared_device, step_report)
from ddp_teach.tracing.events import COMM, COMPUTE, Event
from ddp_teach.tracing.timeline import Timeline

A100, PCIE = dt.sim.DEVICES["A100 80GB"], dt.sim.LINKS["PCIe 4 x16"]


def test_a_shared_device_gives_each_rank_a_share_of_every_rate():
    shared = shared_device(A100, 4)
    assert all(math.isclose(shared.flops[k], A100.flops[k] / 4) for k in A100.flops)
    assert math.isclose(shared.memory_bandwidth, A100.memory_bandwidth / 4)
    assert shared.launch_s == A100.launch_s and shared.achieved is A100.achieved
    with pytest.raises(ValueError, match="world_size must be an int >= 1"):
        shared_device(A100, 0)


def test_a_link_through_host_memory_has_half_the_bandwidth_twice_the_latency():
    slow = host_memory_link(PCIE)
    assert math.isclose(slow.bandwidth, PCIE.bandwidth / 2)
    assert math.isclose(slow.alpha, 2 * PCIE.alpha)


def test_bus_bandwidth_reads_as_the_links_speed_for_a_large_ring_all_reduce():
    nbytes = 1 << 30
    for n in (2, 4, 8):
        seconds = dt.cost.collective_time("all_reduce", nbytes, n, PCIE)
        assert math.isclose(bus_bandwidth(nbytes, seconds, n), PCIE.bandwidth, rel_tol=0.01)
    assert bus_bandwidth(10, 0.0, 2) == float("inf")


def test_every_rank_copies_one_ranks_events_and_refuses_several():
    one = Timeline([Event(0, "forward", COMPUTE, 0.0, 1.0),
                    Event(0, "all_reduce", COMM, 0.5, 1.5, 8)])
    copied = every_rank(one, 3)
    assert copied.ranks == [0, 1, 2]
    assert all(copied.summary()[r] == one.summary()[0] for r in range(3))
    with pytest.raises(ValueError, match="the timeline of one rank"):
        every_rank(copied, 2)


def test_step_report_compares_with_one_gpu():
    alone = Timeline([Event(0, "forward", COMPUTE, 0.0, 2.0)])
    run = Timeline([Event(r, "forward", COMPUTE, 0.0, 2.0) for r in (0, 1)] +
                   [Event(r, "all_reduce", COMM, 1.0, 3.0, 8) for r in (0, 1)])
    report = step_report(run, alone)
    assert report["step_s"] == 3.0 and report["vs_one"] == 1.5
    assert math.isclose(report["speedup"], 2 * 2.0 / 3.0)
    assert report["exposed_s"] == 1.0 and report["idle_s"] == 0.0
    assert report["overlap"] == 0.5


def mlp_step(rank, world_size, width, depth, batch, cap):
    with torch.device("meta"):
        model = nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)])
        x = torch.randn(batch, width)
    net = model if world_size == 1 else dt.ddp.DistributedDataParallel(
        model, bucket_cap_mb=cap, first_bucket_cap_mb=1 if cap else 0)
    for _ in range(2):
        dist.barrier()
        net(x).square().mean().backward()


def simulated(world_size, simulation, shape, cap=25):
    _, timeline = dt.sim.one_rank(mlp_step, world_size, simulation, args=(*shape, cap))
    return every_rank(timeline.after_last_barrier(), world_size)


def test_the_reference_names_simulated_runs_of_three_causes():
    lab = dt.sim.Simulation(A100, PCIE, compute="achieved")
    shape = (1024, 4, 2048)
    alone = simulated(1, lab, shape)
    assert diagnose(simulated(2, lab, shape), alone) == "healthy"
    assert diagnose(simulated(2, lab, shape, cap=None), alone) == "no_overlap"
    slow = dt.sim.Simulation(A100, host_memory_link(PCIE), compute="achieved")
    assert diagnose(simulated(2, slow, shape), alone) == "slow_link"
