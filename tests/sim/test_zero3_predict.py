"""`predict.zero3`: the ZeRO-3 step of `ddp_teach.fsdp` on any link, with and
without prefetch, from one step traced on a free link, against the
simulated step (`one_rank`, on the meta device)."""
import pytest
import torch
import torch.distributed as dist

import ddp_teach as dt
from ddp_teach.sim import Simulation, one_rank
from ddp_teach.sim.schedules import predict

WORLD = 8


def zero3_step(rank, world_size, prefetch=False):
    with torch.device("meta"):
        model = dt.fsdp.FullyShardedDataParallel(dt.models.reference_mlp(512, 4),
                                                 prefetch=prefetch)
        x = torch.randn(128, 512)
    dist.barrier()
    model(x).square().mean().backward()


def step_seconds(timeline):
    step = timeline.after_last_barrier()
    return max(e.end for e in step) - min(e.start for e in step)


@pytest.mark.parametrize("link", ["PCIe 4 x16", "NVLink 4"])
def test_zero3_prediction_matches_the_simulated_step(link):
    sim = Simulation("A100 80GB", link)
    profile = predict.zero3_profile(zero3_step, WORLD, sim)
    assert all(e.duration == 0 for e in profile if e.kind == "comm"), \
        "the profile's link is free"
    steps = {p: step_seconds(one_rank(zero3_step, WORLD, sim, args=(p,))[1])
             for p in (False, True)}
    without = predict.zero3(profile, WORLD, sim.link, prefetch=False)
    with_prefetch = predict.zero3(profile, WORLD, sim.link, prefetch=True)
    assert steps[False] == pytest.approx(without, rel=1e-9), "blocking: exact"
    assert steps[True] == pytest.approx(with_prefetch, rel=0.02)


def test_after_last_barrier_leaves_out_a_barrier_that_took_no_time():
    profile = predict.zero3_profile(zero3_step, WORLD, Simulation())
    names = [e.name for e in profile]
    assert "barrier" not in names and names[0] == "forward"
