"""Tests for ddp_teach.debugging: replicas that drift, where a NaN began,
and what the flight recorder holds.

Each helper is run on real ranks with a bug planted the way learners meet
it (no initial broadcast, BatchNorm statistics kept per rank, one rank's
bad batch), and must name the tensor, the ranks and the step or layer.
"""
import pytest
import torch
from torch import nn

import ddp_teach as dt
from ddp_teach.debugging import (FirstNonFinite, Mismatch, ReplicaWatch,
                                 compare_replicas, fingerprint, flight_record,
                                 nonfinite_ranks)

RUN_TIMEOUT = 60.0


def test_fingerprints_tell_equal_tensors_from_one_bit_apart():
    x = torch.linspace(-1, 1, 1000)
    y = x.clone()
    assert fingerprint(x) == fingerprint(y) == fingerprint(x.reshape(10, 100).t().t())
    y.view(torch.int32)[500] ^= 1  # the lowest bit of one number
    assert fingerprint(x) != fingerprint(y)
    assert fingerprint(torch.zeros(3)) != fingerprint(torch.zeros(4))
    assert 0 <= fingerprint(torch.ones(2, dtype=torch.bfloat16)) < 2 ** 63


def drifting_worker(rank, world_size):
    """BatchNorm without buffer broadcast: the parameters stay in step (DDP
    averages their gradients), the running statistics do not. Rank 2 sees
    the same data as rank 0, so the ranks split {0, 2} | {1}."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    ddp = nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
    watch = ReplicaWatch(ddp)
    before = watch.check(0)
    for step in (1, 2):
        x = torch.randn(8, 3, generator=torch.Generator().manual_seed(rank % 2 + step))
        ddp(x).sum().backward()
        watch.check(step)
    return before, watch.first, watch.report(), sorted(watch.first_seen)


def test_a_watch_names_the_buffers_that_drift_the_ranks_and_the_first_step():
    for before, first, report, names in dt.run(drifting_worker, 3, timeout=RUN_TIMEOUT):
        assert before == []
        # num_batches_tracked counts batches: the same on every rank
        assert names == ["module.1.running_mean", "module.1.running_var"]
        step, mismatch = first
        assert step == 1 and mismatch == Mismatch("module.1.running_mean", [[0, 2], [1]])
        assert "step 1: module.1.running_mean: ranks [0, 2] | [1]" in report


def unbroadcast_worker(rank, world_size):
    torch.manual_seed(rank)  # the bug: each rank initialises its own model
    return [str(m) for m in compare_replicas(nn.Linear(2, 2))]


def test_a_model_initialised_on_each_rank_differs_everywhere():
    for out in dt.run(unbroadcast_worker, 2, timeout=RUN_TIMEOUT):
        assert out == ["weight: ranks [0] | [1]", "bias: ranks [0] | [1]"]


def different_models_worker(rank, world_size):
    try:
        compare_replicas(nn.Linear(2, 2, bias=rank == 0))
    except ValueError as error:
        return str(error)


def test_models_of_different_shapes_are_refused_on_every_rank():
    for message in dt.run(different_models_worker, 2, timeout=RUN_TIMEOUT):
        assert "different numbers of parameters and buffers ([2, 1])" in message


def nan_worker(rank, world_size):
    """Rank 1's batch holds a NaN; after DDP's all-reduce every rank's
    gradients are NaN, but only rank 1's loss was not finite."""
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 1)))
    x = torch.ones(4, 3)
    if rank == 1:
        x[2, 0] = float("nan")
    with FirstNonFinite(ddp.module) as probe:
        loss = ddp(x).sum()
        before = nonfinite_ranks(loss)
        loss.backward()
    after = nonfinite_ranks(*[p.grad for p in ddp.parameters()])
    return before, after, probe.forward


def test_nonfinite_ranks_finds_the_rank_before_the_all_reduce_spreads_it():
    for rank, (before, after, first_layer) in enumerate(
            dt.run(nan_worker, 3, timeout=RUN_TIMEOUT)):
        assert before == [1]
        assert after == [0, 1, 2]
        assert first_layer == ("0" if rank == 1 else None)


class Sqrt(nn.Module):
    def forward(self, x):
        return x.sqrt()


def test_the_probe_names_the_layer_whose_backward_made_the_nan():
    """sqrt(0) = 0 is fine going forward; its gradient 1 / (2 sqrt(0)) is
    inf, so the NaN starts in Sqrt's backward, not in ReLU's or Linear's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), Sqrt(), nn.Linear(2, 1))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[1.0, 0.0], [-1.0, 0.0]]))
        model[0].bias.zero_()
    with FirstNonFinite(model) as probe:
        model(torch.tensor([[1.0, 2.0]])).sum().backward()
    assert probe.forward is None and probe.backward == "2"
    hooks = sum(len(m._forward_hooks) for m in model.modules())
    assert hooks == 0  # the probe removed its hooks on leaving


@pytest.mark.parametrize("poisoned, expected", [("1", "1"), ("3", "3")])
def test_the_probe_names_the_first_layer_whose_output_is_not_finite(poisoned, expected):
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2), nn.Tanh(), nn.Linear(2, 1))
    with torch.no_grad():
        model[int(poisoned)].bias.fill_(float("nan"))
    with FirstNonFinite(model) as probe:
        model(torch.ones(1, 2))
    assert probe.forward == expected


def recorded_collectives(rank, world_size):
    """Three all-reduces and a broadcast, then this rank's flight record."""
    for _ in range(3):
        torch.distributed.all_reduce(torch.ones(4))
    torch.distributed.broadcast(torch.ones(2), src=0)
    return [(entry["seq"], entry["op"]) for entry in flight_record()]


@pytest.mark.parametrize("size, kept", [(None, 5), ("3", 3), ("0", 0)])
def test_the_flight_recorder_is_on_by_default_and_its_size_only_shrinks_it(
        size, kept, monkeypatch):
    """No TORCH_FR_BUFFER_SIZE: every collective is recorded (dt.run's
    warm-up all-reduce is the first); a size keeps the last ones; 0 none."""
    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    monkeypatch.delenv("TORCH_NCCL_TRACE_BUFFER_SIZE", raising=False)
    env = {} if size is None else {"TORCH_FR_BUFFER_SIZE": size}
    records = dt.run(recorded_collectives, 2, backend="gloo", env=env,
                     timeout=RUN_TIMEOUT)
    everything = [(seq, "gloo:all_reduce") for seq in (1, 2, 3, 4)] + [(5, "gloo:broadcast")]
    assert records[0] == records[1] == everything[len(everything) - kept:]
