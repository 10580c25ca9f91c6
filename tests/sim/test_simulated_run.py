"""`dt.run(..., simulate=)`: real results, virtual time that does not depend
on the machine, and step times equal to the textbook schedule."""
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import ddp_teach as dt
from ddp_teach.sim import Simulation
from ddp_teach.sim.schedules import predict

WIDTH, DEPTH, BATCH, STEPS = 256, 4, 32, 2
CAPS_MB = [0.25, 1, 4, 100, None]


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH)])


def batch_of(rank):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)


def loss_of(model, rank=0):
    x, y = batch_of(rank)
    return F.mse_loss(model(x), y)


def step_times(rank, world_size, how, caps=(None,)):
    """Virtual seconds of the last step, per bucket cap (naive: no buckets)."""
    out = {}
    for cap in caps:
        model = make_model()
        net = model if how == "naive" else dt.ddp.DistributedDataParallel(
            model, bucket_cap_mb=cap)
        for _ in range(STEPS):
            dist.barrier()
            start = dt.tracing.now()
            model.zero_grad()
            loss_of(net, rank).backward()
            if how == "naive":
                for p in model.parameters():
                    dist.all_reduce(p.grad)
                    p.grad /= world_size
            out[cap] = dt.tracing.now() - start
    return out, [p.grad.clone() for p in model.parameters()]


def test_results_are_real_and_equal_to_an_unsimulated_run():
    sim = Simulation("A100 80GB", "PCIe 4 x16")
    simulated = dt.run(step_times, 2, args=("ddp",), simulate=sim)
    real = dt.run(step_times, 2, args=("ddp",))
    for (_, got), (_, want) in zip(simulated, real):
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert real.timeline is None and simulated.timeline.clock == sim.label


def _virtual_events(result):
    return [(e.rank, e.name, e.kind, e.start, e.end, e.nbytes)
            for e in result.timeline]


def test_virtual_times_are_identical_run_to_run_and_under_load():
    sim = Simulation("H100 SXM", "InfiniBand NDR")
    first = dt.run(step_times, 2, args=("ddp", (1,)), simulate=sim)
    second = dt.run(step_times, 2, args=("ddp", (1,)), simulate=sim)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(2)]  # both cores busy with something else
    try:
        loaded = dt.run(step_times, 2, args=("ddp", (1,)), simulate=sim)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert _virtual_events(first) == _virtual_events(second) == _virtual_events(loaded)
    assert first[0][0] == loaded[0][0]  # the step time the program measured


def test_the_timeline_shows_phases_and_queued_buckets_in_virtual_time():
    sim = Simulation("A100 80GB", "PCIe 4 x16")
    result = dt.run(step_times, 2, args=("ddp", (0.25,)), simulate=sim)
    timeline = result.timeline.for_rank(0)
    names = {e.name for e in timeline.filter(kind=dt.tracing.COMPUTE)}
    assert {"forward", "backward"} <= names
    buckets = [e for e in timeline.filter(kind=dt.tracing.COMM)
               if e.name.startswith("bucket")]
    assert buckets and all(a.end <= b.start for a, b in zip(buckets, buckets[1:]))
    assert 0 < timeline.mean_overlap() < 1  # some hidden behind backward
    figure = result.timeline.plot()
    assert sim.label in figure.axes[0].get_xlabel()


@pytest.mark.parametrize("link", ["PCIe 4 x16", "NVLink 4"])
@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_simulated_steps_equal_the_predicted_schedule(link, world_size):
    """Within 2% (the issue's bar); the simulator and the predictor share the
    cost model, so here they agree to rounding."""
    sim = Simulation("A100 80GB", link)
    prof = predict.profile(make_model(), loss_of, sim)
    naive = dt.run(step_times, world_size, args=("naive",), simulate=sim)
    bucketed = dt.run(step_times, world_size, args=("ddp", CAPS_MB), simulate=sim)
    assert max(r[0][None] for r in naive) == pytest.approx(
        predict.naive_ddp(prof, world_size), rel=0.02)
    for cap in CAPS_MB:
        assert max(r[0][cap] for r in bucketed) == pytest.approx(
            predict.bucketed_ddp(prof, world_size, cap), rel=0.02), cap
    assert predict.compute_only(prof) < predict.bucketed_ddp(prof, world_size, 4)


def train_with_adam(rank, world_size):
    model = dt.ddp.DistributedDataParallel(dt.trace_layers(make_model()))
    optimizer = torch.optim.Adam(model.parameters())
    loss_of(model, rank).backward()
    optimizer.step()


def test_the_optimizer_step_is_its_own_phase_and_layer_marks_give_way():
    result = dt.run(train_with_adam, 2, simulate=Simulation("RTX 4090", "PCIe 4 x16"))
    phases = [e.name for e in result.timeline.for_rank(0).filter(
        kind=dt.tracing.COMPUTE)]
    assert phases[-1] == "optimizer" and "backward" in phases[:-1]
    # the phases replace the program's own marks: no per-layer events
    assert set(phases) <= {"forward", "backward", "optimizer"}


def torch_ddp_step(rank, world_size):
    model = torch.nn.parallel.DistributedDataParallel(make_model(), bucket_cap_mb=0.3)
    for _ in range(2):  # torch's DDP rebuilds its buckets after the first step
        model.zero_grad()
        loss_of(model, rank).backward()
    return dt.tracing.now(), [p.grad.clone() for p in model.parameters()]


def test_torch_ddp_is_simulated_too_and_waits_for_its_buckets():
    sim = Simulation("A100 80GB", "10GbE")
    simulated = dt.run(torch_ddp_step, 2, simulate=sim)
    real = dt.run(torch_ddp_step, 2)
    for (_, got), (_, want) in zip(simulated, real):
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    buckets = [e for e in simulated.timeline.for_rank(0) if e.name.startswith("ddp bucket")]
    assert len({e.name for e in buckets}) >= 2
    # backward() returned only once every bucket had arrived, in virtual time
    assert simulated[0][0] >= max(e.end for e in buckets)


def test_bad_simulate_arguments_are_refused_before_anything_starts():
    args = ("naive",)
    with pytest.raises(TypeError, match="dt.sim.Simulation"):
        dt.run(step_times, 2, args=args, simulate="A100")
    with pytest.raises(ValueError, match="not both"):
        dt.run(step_times, 2, args=args, simulate=Simulation(),
               network=dt.cost.Link(1e-3, 1e-9))
    with pytest.raises(ValueError, match="cannot be simulated"):
        dt.run(step_times, 2, args=args, simulate=Simulation(), backend="nccl")
