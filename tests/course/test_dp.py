"""Tests for ddp_teach.dp: DataParallel's four primitives on virtual CPU devices."""
import threading

import pytest
import torch
from torch import nn

from ddp_teach.dp import DataParallel, gather, parallel_apply, replicate, scatter


class TiedMLP(nn.Module):
    """An MLP with a tied weight (used twice), an eval-mode BatchNorm with
    non-trivial running statistics, and a registered buffer used in forward."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(4, 6)
        self.hidden = nn.Linear(6, 6)
        self.hidden2 = nn.Linear(6, 6)
        self.hidden2.weight = self.hidden.weight  # tied
        self.norm = nn.BatchNorm1d(6)
        self.out = nn.Linear(6, 3)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 6))
        with torch.no_grad():
            self.norm.running_mean.uniform_(-1, 1)
            self.norm.running_var.uniform_(0.5, 2)
        self.norm.eval()  # train-mode BN would use per-piece statistics

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        h = torch.tanh(self.hidden(h)) * self.scale
        h = self.norm(torch.tanh(self.hidden2(h)))
        return self.out(h)


def make_model(seed=0):
    torch.manual_seed(seed)
    return TiedMLP()


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("n_devices,batch", [(1, 8), (2, 8), (3, 9), (4, 8),
                                             (3, 10), (4, 10), (4, 3)])
def test_data_parallel_matches_single_device(n_devices, batch):
    torch.manual_seed(1)
    x, y = torch.randn(batch, 4), torch.randn(batch, 3)
    ref = make_model()
    ref_out = ref(x)
    nn.functional.mse_loss(ref_out, y).backward()

    model = make_model()
    dp = DataParallel(model, ["cpu"] * n_devices)
    out = dp(x)
    nn.functional.mse_loss(out, y).backward()

    assert out.shape == ref_out.shape
    torch.testing.assert_close(out, ref_out)
    expected = grads(ref)
    got = grads(model)
    assert got.keys() == expected.keys()
    for name in expected:
        assert not torch.equal(expected[name], torch.zeros_like(expected[name]))
        torch.testing.assert_close(got[name], expected[name], msg=name)


def test_data_parallel_replicates_on_every_forward():
    model = make_model()
    dp = DataParallel(model, ["cpu"] * 3)
    x = torch.randn(6, 4)
    before = dp(x).detach()
    with torch.no_grad():
        model.out.bias.add_(1.0)  # an optimiser step on the ORIGINAL
    after = dp(x).detach()
    torch.testing.assert_close(after, before + 1.0)
    torch.testing.assert_close(after, model(x).detach())


def test_data_parallel_output_device_and_dim():
    model = nn.Linear(4, 2)
    dp = DataParallel(model, ["cpu"] * 2, output_device="cpu", dim=1)
    x = torch.randn(4, 6, 4)  # split along dim 1
    torch.testing.assert_close(dp(x), model(x))


def test_data_parallel_batch_sizes_seen_follow_chunk():
    seen = []

    class Recorder(nn.Module):
        def forward(self, x):
            seen.append(x.shape[0])
            return x * 2

    x = torch.arange(10.0).unsqueeze(1)
    out = DataParallel(Recorder(), ["cpu"] * 4)(x)
    expected = [c.shape[0] for c in x.chunk(4)]
    assert expected == [3, 3, 3, 1]
    assert sorted(seen) == sorted(expected) and len(seen) == 4
    torch.testing.assert_close(out, x * 2)  # pieces came back in order

    seen.clear()
    DataParallel(Recorder(), ["cpu"] * 4)(torch.ones(3, 1))
    assert seen == [1, 1, 1]  # batch 3 on 4 devices: 3 pieces, 3 replicas


def test_data_parallel_no_grad_propagates():
    modes = []

    class Probe(nn.Linear):
        def forward(self, x):
            modes.append(torch.is_grad_enabled())
            return super().forward(x)

    dp = DataParallel(Probe(4, 2), ["cpu"] * 2)
    with torch.no_grad():
        out = dp(torch.randn(4, 4))
    assert modes == [False, False] and not out.requires_grad
    modes.clear()
    out = dp(torch.randn(4, 4))
    assert modes == [True, True] and out.requires_grad


# -- scatter / gather -------------------------------------------------------

def test_scatter_chunk_sizes_like_torch_chunk():
    for batch, n in [(10, 3), (10, 4), (3, 4), (8, 2), (1, 3)]:
        x = torch.randn(batch, 2)
        pieces = scatter(x, ["cpu"] * n)
        assert [p.shape[0] for p in pieces] == [c.shape[0] for c in x.chunk(n)]
    assert [p.shape[0] for p in scatter(torch.zeros(10, 2), ["cpu"] * 3)] == [4, 4, 2]
    assert len(scatter(torch.zeros(3, 2), ["cpu"] * 4)) == 3
    assert [p.shape[1] for p in scatter(torch.zeros(2, 5), ["cpu"] * 2, dim=1)] == [3, 2]


def test_scatter_gather_round_trip_nested():
    marker = object()
    a = torch.randn(10, 3)
    d = {"b": torch.randn(10), "c": torch.randn(10, 2, 2)}
    inputs = (a, d, marker)
    pieces = scatter(inputs, ["cpu"] * 3)
    assert len(pieces) == 3
    for i, piece in enumerate(pieces):
        assert type(piece) is tuple and len(piece) == 3
        assert type(piece[1]) is dict and list(piece[1]) == ["b", "c"]
        assert piece[2] is marker  # non-tensors passed by reference
        assert piece[0].shape[0] == [4, 4, 2][i]
        torch.testing.assert_close(piece[1]["b"], d["b"].chunk(3)[i])
    gathered = gather([p[:2] for p in pieces], "cpu")
    assert type(gathered) is tuple and type(gathered[1]) is dict
    assert torch.equal(gathered[0], a)
    assert torch.equal(gathered[1]["b"], d["b"]) and torch.equal(gathered[1]["c"], d["c"])

    as_list = scatter([a, a], ["cpu"] * 2)
    assert all(type(p) is list for p in as_list)
    assert type(gather(as_list, "cpu")) is list


def test_scatter_gather_differentiable():
    x = torch.randn(7, 2, requires_grad=True)
    weights = torch.arange(14.0).reshape(7, 2)
    (gather(scatter(x, ["cpu"] * 3), "cpu") * weights).sum().backward()
    torch.testing.assert_close(x.grad, weights)


def test_gather_scalars_stacked():
    out = gather([torch.tensor(1.0), torch.tensor(2.0)], "cpu")
    assert torch.equal(out, torch.tensor([1.0, 2.0]))


# -- replicate ---------------------------------------------------------------

def test_replicate_grads_reach_original():
    model = make_model()
    replicas = replicate(model, ["cpu"] * 2)
    assert len(replicas) == 2 and all(type(r) is TiedMLP for r in replicas)
    assert all(p.grad is None for p in model.parameters())
    replicas[1](torch.randn(5, 4)).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name


def test_replicate_params_are_differentiable_copies():
    model = make_model()
    replica = replicate(model, ["cpu"])[0]
    assert list(replica.parameters()) == []  # documented: no Parameters in a replica
    w = replica.inp.weight
    assert not isinstance(w, nn.Parameter) and w.grad_fn is not None
    assert w is not model.inp.weight and torch.equal(w, model.inp.weight)
    assert w.data_ptr() != model.inp.weight.data_ptr()


def test_replicate_shared_params_stay_shared():
    model = make_model()
    for replica in replicate(model, ["cpu"] * 3):
        assert replica.hidden.weight is replica.hidden2.weight
        assert replica.hidden.bias is not replica.hidden2.bias
    a, b = replicate(model, ["cpu"] * 2)
    assert a.hidden.weight is not b.hidden.weight


def test_replicate_shared_submodule_stays_shared():
    lin = nn.Linear(2, 2)
    seq = nn.Sequential(lin, nn.Tanh(), lin)
    replica = replicate(seq, ["cpu"])[0]
    assert replica[0] is replica[2] and replica[0] is not lin


def test_replicate_buffers_equal_and_independent():
    model = make_model()
    replica = replicate(model, ["cpu"])[0]
    assert torch.equal(replica.scale, model.scale)
    assert torch.equal(replica.norm.running_mean, model.norm.running_mean)
    assert not replica.scale.requires_grad
    original = model.scale.clone()
    replica.scale.add_(10.0)
    replica.norm.running_mean.zero_()
    assert torch.equal(model.scale, original)
    assert not torch.equal(model.norm.running_mean, torch.zeros(6))
    assert dict(replica.named_buffers()).keys() == dict(model.named_buffers()).keys()


# -- parallel_apply -----------------------------------------------------------

def test_parallel_apply_order_and_threads():
    n = 3
    barrier = threading.Barrier(n, timeout=10)  # only passes if all run at once
    idents = {}

    class Worker(nn.Module):
        def __init__(self, k):
            super().__init__()
            self.k = k

        def forward(self, x, y=0):
            barrier.wait()
            idents[self.k] = threading.get_ident()
            return x * self.k + y

    replicas = [Worker(k) for k in range(n)]
    inputs = [torch.ones(2), (torch.ones(2), 5), torch.ones(2)]
    outs = parallel_apply(replicas, inputs, ["cpu"] * n)
    assert [o.tolist() for o in outs] == [[0, 0], [6, 6], [2, 2]]
    assert len(set(idents.values())) == n
    assert threading.get_ident() not in idents.values()


def test_parallel_apply_exception_names_replica_and_device():
    class Boom(nn.Module):
        def __init__(self, fail):
            super().__init__()
            self.fail = fail

        def forward(self, x):
            if self.fail:
                raise ValueError("bad shape in the middle")
            return x

    replicas = [Boom(False), Boom(True), Boom(False)]
    with pytest.raises(RuntimeError) as info:
        parallel_apply(replicas, [torch.ones(1)] * 3, ["cpu"] * 3)
    msg = str(info.value)
    assert "replica 1" in msg and "cpu:1" in msg
    assert "ValueError" in msg and "bad shape in the middle" in msg
    assert "Traceback" in msg and "in forward" in msg
    assert isinstance(info.value.__cause__, ValueError)


def test_parallel_apply_length_mismatch():
    with pytest.raises(ValueError):
        parallel_apply([nn.Identity()], [torch.ones(1)] * 2, ["cpu"])
