"""`dt.sim.SimulatedGPUs`: one process driving several simulated GPUs, as
DataParallel does. Real values, virtual time: deterministic, copies on
device 0's port, threads that share the GIL, backward on every device."""
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ddp_teach as dt
import ddp_teach.dp
from ddp_teach.sim import Simulation, SimulatedGPUs
from ddp_teach.tracing import COMM, COMPUTE

PCIE = Simulation("A100 80GB", "PCIe 4 x16")


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))


def batch(rows=40):
    g = torch.Generator().manual_seed(1)
    return torch.randn(rows, 16, generator=g), torch.randn(rows, 1, generator=g)


def dp_step(n, simulation=PCIE, **options):
    """One DataParallel step on n simulated GPUs: (step seconds, gradients,
    the SimulatedGPUs)."""
    model, (x, y) = mlp(), batch()
    gpus = SimulatedGPUs(n, simulation, **options)
    with gpus:
        net = dt.dp.DataParallel(model, gpus.devices)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        start = gpus.synchronize()
        F.mse_loss(net(x), y).backward()
        grads = [p.grad.clone() for p in model.parameters()]
        opt.step()
        seconds = gpus.synchronize() - start
    return seconds, grads, gpus


def as_tuples(timeline):
    return [(e.rank, e.name, e.kind, e.start, e.end, e.nbytes) for e in timeline]


def test_values_are_real_the_gradients_of_one_device():
    _, grads, _ = dp_step(3)
    model, (x, y) = mlp(), batch()
    F.mse_loss(model(x), y).backward()
    for simulated, whole in zip(grads, (p.grad for p in model.parameters())):
        torch.testing.assert_close(simulated, whole)


def test_the_same_run_gives_the_same_virtual_times_twice_and_under_load():
    first, second = dp_step(4), dp_step(4)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(2)]  # both cores busy: the threads' real order changes
    try:
        loaded = dp_step(4)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert first[0] == second[0] == loaded[0]
    assert as_tuples(first[2].timeline) == as_tuples(second[2].timeline) \
        == as_tuples(loaded[2].timeline)


def test_replicate_and_the_gradient_reduction_queue_on_device_0s_port():
    n = 4
    _, _, gpus = dp_step(n)
    link, params = PCIE.link, list(mlp().parameters())
    one_copy = sum(link.alpha + p.numel() * p.element_size() * link.beta
                   for p in params)
    device0 = gpus.timeline.for_rank(0).filter(kind=COMM)
    for name in ("replicate", "reduce grads"):
        copies = [e for e in device0 if e.name.startswith(name)]
        between = [(0, d) if name == "replicate" else (d, 0) for d in range(1, n)]
        assert {e.name for e in copies} == {  # none to device 0 itself
            f"{name} {a}\u2192{b}" for a, b in between}
        assert sum(e.duration for e in copies) == pytest.approx((n - 1) * one_copy)
    busy = sorted((e.start, e.end) for e in device0)
    assert all(a[1] <= b[0] + 1e-15 for a, b in zip(busy, busy[1:]))  # one at a time


def test_every_device_runs_its_replicas_forward_and_backward():
    _, _, gpus = dp_step(3)
    for device in range(3):
        phases = {e.name for e in gpus.timeline.for_rank(device).filter(kind=COMPUTE)}
        assert {"forward", "backward"} <= phases
    assert {e.name for e in gpus.timeline.filter(name="optimizer")} == {"optimizer"}
    assert {e.rank for e in gpus.timeline.filter(name="optimizer")} == {0}


class ManyTinyOps(nn.Module):
    def forward(self, x):
        for _ in range(50):
            x = torch.tanh(x)
        return x


def apply_seconds(n, python_s_per_op, rows=8):
    gpus = SimulatedGPUs(n, PCIE, python_s_per_op=python_s_per_op)
    with gpus, torch.no_grad():
        replicas = dt.dp.replicate(ManyTinyOps(), gpus.devices)
        pieces = dt.dp.scatter(torch.randn(rows, 4), gpus.devices)
        start = gpus.synchronize()
        dt.dp.parallel_apply(replicas, pieces, gpus.devices)
        return gpus.synchronize() - start


def test_threads_issuing_tiny_operations_take_turns_on_the_gil():
    slow_python = 50e-6  # far longer than a tiny kernel: the host is the limit
    one, four = apply_seconds(1, slow_python), apply_seconds(4, slow_python)
    assert four >= 4 * 50 * slow_python > 3.9 * one  # every thread's ops in turn
    # without the GIL's cost the four devices work side by side
    assert apply_seconds(4, 0.0, rows=32) == pytest.approx(apply_seconds(1, 0.0, rows=8))


def test_item_makes_the_host_wait_for_the_device():
    gpus = SimulatedGPUs(1, PCIE)
    with gpus:
        a = torch.randn(512, 512)
        (a @ a).sum().item()
        host = gpus.synchronize()
    last = max(e.end for e in gpus.timeline)
    assert host == last > 0


def test_the_timeline_names_devices_and_the_simulated_hardware():
    _, _, gpus = dp_step(2)
    timeline = gpus.timeline
    assert timeline.lane == "device" and timeline.clock == PCIE.label
    assert timeline.summary_table().startswith("device")
    figure = timeline.plot()
    labels = [t.get_text() for t in figure.axes[0].get_yticklabels()]
    assert labels == ["device 0 compute", "device 0 comm", "device 1 compute",
                      "device 1 comm"]
    assert PCIE.label in figure.axes[0].get_xlabel()


def test_bad_input_and_misuse_are_refused_with_a_reason():
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        SimulatedGPUs(0, PCIE)
    with pytest.raises(ValueError, match="python_s_per_op"):
        SimulatedGPUs(2, PCIE, python_s_per_op=-1)
    gpus = SimulatedGPUs(2, PCIE)
    with pytest.raises(RuntimeError, match="inside `with gpus:`"):
        gpus.synchronize()
    with gpus:
        with pytest.raises(RuntimeError, match="dt.dp.parallel_apply"):
            with gpus.devices[1].running():
                pass
    with pytest.raises(RuntimeError, match="already in use"):
        with gpus:
            pass


def test_a_replica_that_raises_is_reported_and_the_run_goes_on():
    class Picky(nn.Module):
        def forward(self, x):
            if len(x) < 3:
                raise ValueError(f"only {len(x)} rows")
            return x * 2

    gpus = SimulatedGPUs(3, PCIE)
    with gpus:
        with pytest.raises(RuntimeError, match="replica 2 on sim:2"):
            dt.dp.DataParallel(Picky(), gpus.devices)(torch.randn(10, 2))
        out = dt.dp.DataParallel(nn.Identity(), gpus.devices)(torch.ones(9, 2))
    assert torch.equal(out, torch.ones(9, 2))
