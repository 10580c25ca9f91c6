"""Tests for the course FSDP's mixed precision and replicated parameters.

`compute_dtype` must do exactly what a plain model does when it casts its
weights and inputs the same way (fp32 master weights, 16-bit compute); it
must agree with torch's FSDP2 under the same MixedPrecisionPolicy; and the
bytes on the wire must halve. `rest="replicate"` must keep the parameters
outside the units whole and identical on every rank.
"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ddp_teach as dt
from ddp_teach.fsdp import FullyShardedDataParallel
from ddp_teach.zero import paper_comm_volume

from test_fsdp import RUN_TIMEOUT, STEPS, batch, make_net

BF16 = torch.bfloat16
SGD = dict(lr=0.1, momentum=0.9)
VARIANTS = {  # name: FSDP keyword arguments besides compute_dtype
    "root sharded": dict(),
    "root replicated": dict(rest="replicate"),
    "blocks replicated": dict(units=["embed", "head"], rest="replicate"),
}


def reference_forward(net, x, variant):
    """Net.forward written out with the casts FSDP makes: sharded weights and
    every unit's input in bf16; replicated modules in fp32, inputs cast to
    fp32; the buffer `shift` untouched (fp32, so `+ shift` gives fp32)."""
    w = {name: p.to(BF16) for name, p in net.named_parameters()}
    if variant != "root sharded":
        w["scale"] = net.scale
    blocks_dtype = torch.float32 if variant == "blocks replicated" else BF16
    if blocks_dtype == torch.float32:
        w.update({name: p for name, p in net.named_parameters()
                  if name.startswith("blocks.")})
    h = torch.tanh(F.linear(x.to(BF16), w["embed.weight"], w["embed.bias"]))
    h = (h + net.shift).to(blocks_dtype)
    h = torch.tanh(F.linear(h, w["blocks.0.weight"], w["blocks.0.bias"]))
    h = F.linear(h, w["blocks.0.weight"], w["blocks.2.bias"])  # tied
    h = torch.tanh(h).to(BF16)
    return F.linear(h, w["head.weight"], w["head.bias"]) * w["scale"]


def same_data_worker(rank, world_size):
    """Every rank trains on the same batches, so the average over ranks is
    exact ((g/2 + g/2) = g in any dtype): FSDP must equal the reference
    model bit for bit."""
    out = {}
    for variant, kwargs in VARIANTS.items():
        fsdp = FullyShardedDataParallel(make_net(), compute_dtype=BF16, **kwargs)
        optimizer = torch.optim.SGD(fsdp.parameters(), **SGD)
        reference = make_net()
        ref_optimizer = torch.optim.SGD(reference.parameters(), **SGD)
        outputs = []
        for step in range(STEPS):
            x, y = batch(step, 0)
            for model, opt, forward in (
                    (fsdp, optimizer, fsdp),
                    (reference, ref_optimizer,
                     lambda x, v=variant: reference_forward(reference, x, v))):
                prediction = forward(x)
                outputs.append(prediction.dtype)
                F.mse_loss(prediction.float(), y).backward()
                opt.step()
                opt.zero_grad()
        out[variant] = dict(
            fsdp=fsdp.gather_full_params(),
            reference={n: p.detach().clone() for n, p in reference.named_parameters()},
            dtypes={(p.dtype, p.grad is None) for p in fsdp.parameters()},
            outputs=outputs[:2])
    return out


@pytest.fixture(scope="module")
def same_data():
    return dt.run(same_data_worker, 2, timeout=RUN_TIMEOUT)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_bf16_compute_equals_a_model_that_casts_the_same_way(same_data, variant):
    for out in same_data:
        got, want = out[variant]["fsdp"], out[variant]["reference"]
        assert list(got) == list(want)
        for name in want:
            assert got[name].dtype == torch.float32, name  # master weights
            assert torch.equal(got[name], want[name]), (
                variant, name, (got[name] - want[name]).abs().max())


def test_the_master_weights_and_their_gradients_stay_fp32(same_data):
    for out in same_data:
        for variant in VARIANTS:
            # after zero_grad: fp32 shards (and replicated params), no grads
            assert out[variant]["dtypes"] == {(torch.float32, True)}
        # the root unit computes in bf16; a replicated fp32 scale promotes
        assert out["root sharded"]["outputs"] == [BF16, BF16]
        assert out["root replicated"]["outputs"] == [torch.float32] * 2


def fsdp2_worker(rank, world_size):
    """Different data on each rank: ours against torch's FSDP2 with the same
    policy, and against fp32 to show that bf16 was really used."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    out = {}
    policy = MixedPrecisionPolicy(param_dtype=BF16, reduce_dtype=BF16)
    torch2 = make_net()
    for child in (torch2.embed, torch2.blocks, torch2.head):
        fully_shard(child, mp_policy=policy)
    fully_shard(torch2, mp_policy=policy)
    models = {"fsdp2": torch2,
              "ours": FullyShardedDataParallel(make_net(), compute_dtype=BF16),
              "ours fp32": FullyShardedDataParallel(make_net())}
    for name, model in models.items():
        optimizer = torch.optim.SGD(model.parameters(), **SGD)
        for step in range(STEPS):
            x, y = batch(step, rank)
            F.mse_loss(model(x).float(), y).backward()
            optimizer.step()
            optimizer.zero_grad()
        out[name] = ({n: p.full_tensor() for n, p in model.named_parameters()}
                     if name == "fsdp2" else model.gather_full_params())
    return out


def test_bf16_training_agrees_with_torch_fsdp2_under_the_same_policy():
    for out in dt.run(fsdp2_worker, 2, timeout=RUN_TIMEOUT):
        ours, fp32 = out["ours"], out["ours fp32"]
        theirs = {name: out["fsdp2"][name] for name in ours}
        for name in ours:
            torch.testing.assert_close(ours[name], theirs[name],
                                       rtol=0, atol=1e-2, msg=name)
        gap_to_torch = max((ours[n] - theirs[n]).abs().max() for n in ours)
        gap_to_fp32 = max((ours[n] - fp32[n]).abs().max() for n in ours)
        assert gap_to_fp32 > 1e-4   # bf16 rounding is really there
        assert gap_to_torch < gap_to_fp32


def traffic_worker(rank, world_size):
    for kwargs in ({}, dict(compute_dtype=BF16),
                   dict(compute_dtype=BF16, reduce_dtype=torch.float32)):
        model = FullyShardedDataParallel(make_net(), **kwargs)
        x, y = batch(0, rank)
        with dt.span(str(kwargs)):
            F.mse_loss(model(x).float(), y).backward()


def test_bf16_halves_the_all_gathers_and_the_reduce_scatters_if_asked():
    timeline = dt.run(traffic_worker, 2, timeout=RUN_TIMEOUT, trace=True).timeline
    events = timeline.for_rank(0).events
    spans = [e for e in events if e.kind == dt.tracing.COMPUTE]
    assert len(spans) == 3

    def traffic(span, kind):
        inside = [e for e in events if e.kind == dt.tracing.COMM
                  and span.start <= e.start <= span.end and kind in e.name]
        return paper_comm_volume(inside, 2)
    fp32, bf16, bf16_fp32_reduce = spans
    for kind in ("all-gather", "reduce-scatter"):
        assert traffic(fp32, kind) > 0
    assert traffic(bf16, "all-gather") == traffic(fp32, "all-gather") / 2
    assert traffic(bf16, "reduce-scatter") == traffic(fp32, "reduce-scatter") / 2
    assert traffic(bf16_fp32_reduce, "all-gather") == traffic(bf16, "all-gather")
    assert traffic(bf16_fp32_reduce, "reduce-scatter") == \
        traffic(fp32, "reduce-scatter")


def replicated_worker(rank, world_size):
    """Norms replicated, Linear layers sharded, different data on each rank."""
    torch.manual_seed(rank)  # different initial values: the wrap must fix them
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Tanh(),
                          nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 3))
    fsdp = FullyShardedDataParallel(
        model, units=lambda _name, m: isinstance(m, nn.Linear),
        rest="replicate", compute_dtype=BF16)
    optimizer = torch.optim.AdamW(fsdp.parameters(), lr=0.01)
    for step in range(3):
        x, y = batch(step, rank)
        F.mse_loss(fsdp(x).float(), y).backward()
        grads = {n: p.grad.clone() for n, p in fsdp.named_parameters()}
        optimizer.step()
        optimizer.zero_grad()
    return dict(units=[unit.name for unit in fsdp.units],
                replicated=fsdp.replicated.names,
                params={n: p.detach().clone() for n, p in fsdp.named_parameters()},
                grads=grads)


def test_replicated_parameters_and_gradients_are_identical_on_every_rank():
    ranks = dt.run(replicated_worker, 2, timeout=RUN_TIMEOUT)
    for out in ranks:
        assert out["units"] == ["0", "3", "5"]
        assert out["replicated"] == ["1.weight", "1.bias", "4.weight", "4.bias"]
    rank0, rank1 = ranks
    for name in rank0["params"]:
        same = (torch.equal(rank0["params"][name], rank1["params"][name])
                and torch.equal(rank0["grads"][name], rank1["grads"][name]))
        replicated = name.startswith(("module.1.", "module.4."))
        assert same == replicated, name  # shards differ, replicas agree
        if replicated:
            assert rank0["params"][name].dtype == torch.float32


@pytest.mark.parametrize("kwargs, message", [
    (dict(rest="ddp"), "rest='ddp'.*'shard'.*'replicate'"),
    (dict(compute_dtype=torch.int8), "compute_dtype must be a floating-point"),
    (dict(reduce_dtype="bf16"), "reduce_dtype must be a floating-point"),
])
def test_bad_precision_or_rest_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FullyShardedDataParallel(make_net(), **kwargs)


def test_a_unit_mixing_dtypes_is_refused():
    net = make_net()
    net.head.bias.data = net.head.bias.data.double()
    with pytest.raises(ValueError, match="unit head mixes dtypes"):
        FullyShardedDataParallel(net)
