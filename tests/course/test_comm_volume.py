"""paper_comm_volume counts the paper's Psi on both kinds of timeline.

A traced run records an all-gather or reduce-scatter as the bytes of its
input and output, (N + 1) / N of the array; a simulated run records the
array once. The same ZeRO-3 step, run for real and simulated at 2, 3 and 8
ranks, must give the same volume: every collective counted as its whole
(padded) array, as the ZeRO paper counts it (section 7).
"""
import pytest
import torch
import torch.distributed as dist
from torch import nn

import ddp_teach as dt
from ddp_teach.zero import paper_comm_volume, shard_size

RUN_TIMEOUT = 120.0
UNIT_SIZES = {"0": 4 * 5 + 5, "2": 5 * 3 + 3}  # Linear(4, 5), Linear(5, 3)


def zero3_step(rank, world_size, device="cpu"):
    torch.manual_seed(0)
    with torch.device(device):
        model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3))
        x = torch.randn(6, 4, requires_grad=True)  # unit 0's backward needs its weights
    net = dt.fsdp.FullyShardedDataParallel(model, prefetch=False)
    dist.barrier()
    net(x).square().mean().backward()


def expected_bytes(events, world_size):
    """Each unit's collectives counted as its whole padded fp32 array."""
    total = 0
    for event in events:
        unit = event.name.split()[1]
        total += 4 * world_size * shard_size(UNIT_SIZES[unit], world_size)
    return total


def unit_collectives(timeline):
    return [e for e in timeline if e.kind == "comm" and e.name.startswith("unit ")]


@pytest.mark.parametrize("world_size", [2, 3, 8])
def test_real_and_simulated_timelines_give_the_papers_volume(world_size):
    real = unit_collectives(dt.run(zero3_step, world_size, timeout=RUN_TIMEOUT,
                                   trace=True).timeline.for_rank(0))
    _, timeline = dt.sim.one_rank(zero3_step, world_size,
                                  dt.sim.Simulation("A100 80GB", "PCIe 4 x16"),
                                  args=("meta",))
    simulated = unit_collectives(timeline)
    # forward and backward gather both units, backward reduce-scatters both
    assert [e.name for e in real] == [e.name for e in simulated]
    assert len(real) == 6
    expected = expected_bytes(real, world_size)
    assert paper_comm_volume(real, world_size) == pytest.approx(expected, rel=1e-12)
    assert paper_comm_volume(simulated, world_size, simulated=True) == \
        pytest.approx(expected, rel=1e-12)
    # the traced run's correction, applied to a simulated timeline, undercounts
    assert paper_comm_volume(simulated, world_size) == \
        pytest.approx(expected * world_size / (world_size + 1), rel=1e-12)


def test_a_world_size_that_is_not_a_count_is_refused():
    with pytest.raises(ValueError, match="world_size must be an int >= 1"):
        paper_comm_volume([], 0)
