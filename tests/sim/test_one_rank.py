"""`dt.sim.one_rank`: one rank of a large simulated run in this process,
equal to the multi-process simulation where both can run, and leaving
torch.distributed as it found it."""
import pytest
import torch
import torch.distributed as dist

import ddp_teach as dt
from ddp_teach.sim import Simulation, one_rank

SIM = Simulation("A100 80GB", "InfiniBand NDR")


def ddp_step(rank, world_size, device="cpu"):
    with torch.device(device):
        model = dt.ddp.DistributedDataParallel(dt.models.reference_mlp(256, 3),
                                               bucket_cap_mb=0.25)
        x = torch.randn(32, 256)
    for _ in range(2):
        dist.barrier()
        model(x).square().mean().backward()


def zero3_step(rank, world_size, device="cpu"):
    with torch.device(device):
        model = dt.fsdp.FullyShardedDataParallel(dt.models.reference_mlp(256, 4))
        x = torch.randn(32, 256)
    for _ in range(2):
        dist.barrier()
        model(x).square().mean().backward()


def events(timeline):
    return [(e.name, e.kind, e.start, e.end, e.nbytes)
            for e in timeline.after_last_barrier().for_rank(0)]


@pytest.mark.parametrize("step", [ddp_step, zero3_step])
def test_one_rank_on_meta_equals_the_simulated_run_of_every_rank(step):
    _, here = one_rank(step, 4, SIM, args=("meta",))
    every = dt.run(step, 4, simulate=SIM).timeline
    mine, theirs = events(here), events(every)
    assert len(mine) > 5 and any(kind == "comm" for _, kind, *_ in mine)
    assert len(mine) == len(theirs)
    for a, b in zip(mine, theirs):  # name, kind, bytes; then the times
        assert (a[0], a[1], a[4]) == (b[0], b[1], b[4])
        assert a[2:4] == pytest.approx(b[2:4], abs=1e-12)
    assert here.clock == SIM.label


def test_one_rank_puts_torch_distributed_back_even_after_an_error():
    before = dist.all_reduce

    def fails(rank, world_size):
        assert dist.all_reduce is not before, "calls are recorded inside"
        raise KeyError("the learner's bug")
    with pytest.raises(KeyError, match="the learner's bug"):
        one_rank(fails, 8, SIM)
    assert dist.all_reduce is before and not dist.is_initialized()
    value, timeline = one_rank(lambda rank, world_size: world_size, 1024, SIM)
    assert value == 1024 and len(timeline) == 0


def test_one_rank_refuses_bad_arguments_and_a_process_that_has_a_group():
    with pytest.raises(ValueError, match="world_size must be an int >= 1"):
        one_rank(zero3_step, 0, SIM)

    def nested(rank, world_size):
        one_rank(zero3_step, 8, SIM)
    with pytest.raises(dt.WorkerError, match="already has one"):
        dt.run(nested, 1)


def torch_ddp_step(rank, world_size):
    model = torch.nn.parallel.DistributedDataParallel(dt.models.reference_mlp(256, 3))
    x = torch.randn(32, 256)
    for _ in range(2):
        dist.barrier()
        model(x).square().mean().backward()
    return [p.grad.clone() for p in model.parameters()]


def test_torch_ddp_runs_on_one_rank_as_in_the_multi_process_simulation():
    """torch's fake group completes works with the value None, which torch's
    DDP hook cannot read; the simulator's works hold the tensor instead, so
    torch's DDP runs here, with the timeline of 4 real simulated ranks."""
    grads, here = one_rank(torch_ddp_step, 4, SIM)
    run = dt.run(torch_ddp_step, 4, simulate=SIM)
    assert events(here) == events(run.timeline)
    assert any(e.kind == "comm" for e in here.after_last_barrier().events)
    assert all(g.isfinite().all() for g in grads)
