"""Tests for ddp_teach.zero: ZeRO-1 (ShardedOptimizer) and ZeRO-2.

The multi-rank cases run several setups per `dt.run` (a module-scoped
fixture per world size); each worker returns what it saw and the
assertions are made here, where a failure can show both sides.
"""
import pytest
import torch
from torch import nn

import ddp_teach as dt
from ddp_teach import memory
from ddp_teach.models import reference_mlp
from ddp_teach.zero import (ShardedOptimizer, Zero2DataParallel, flat_slice,
                            model_state_bytes, paper_comm_volume, shard_size,
                            unflatten)

RUN_TIMEOUT = 60.0
ADAMW = dict(lr=0.05, weight_decay=0.1)
IN, HIDDEN, OUT = 4, 5, 3


def make_net():
    """43 parameters: 43 = 1 mod 2 and mod 3, so every shard layout pads."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, OUT))


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(6, IN, generator=g), torch.randn(6, OUT, generator=g)


def train(model, optimizer, rank, steps):
    for step in range(steps):
        x, y = batch(step, rank)
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()


def params_of(model):
    module = getattr(model, "module", model)
    return {n: p.detach().clone() for n, p in module.named_parameters()}


# ---- the shard helpers, in this process ------------------------------------

def test_shard_size_rounds_up_so_the_padded_vector_splits_evenly():
    assert shard_size(43, 2) == 22 and shard_size(43, 3) == 15
    assert shard_size(42, 3) == 14 and shard_size(1, 4) == 1


def test_flat_slice_reads_across_tensor_boundaries_and_pads_with_zeros():
    a, b = torch.arange(1.0, 7.0).view(2, 3), torch.tensor([7.0, 8.0])
    assert flat_slice([a, b], 0, 8).tolist() == list(range(1, 9))
    assert flat_slice([a, b], 2, 5).tolist() == [3.0, 4.0, 5.0]
    assert flat_slice([a, b], 5, 8).tolist() == [6.0, 7.0, 8.0]
    assert flat_slice([a, b], 6, 9).tolist() == [7.0, 8.0, 0.0]  # padding
    assert flat_slice([a, b], 9, 12).tolist() == [0.0, 0.0, 0.0]  # all padding


def test_unflatten_gives_views_with_the_shapes_and_skips_the_padding():
    flat = torch.arange(10.0)
    weight, bias = unflatten(flat, [torch.Size([2, 3]), torch.Size([3])])
    assert weight.tolist() == [[0, 1, 2], [3, 4, 5]] and bias.tolist() == [6, 7, 8]
    weight[0, 0] = 100.0  # a view, not a copy
    assert flat[0] == 100.0


@pytest.mark.parametrize("params, message", [
    ([{"params": [torch.zeros(2, requires_grad=True)]}], "groups .dicts. are not supported"),
    ([torch.zeros(2, requires_grad=True), torch.zeros(2, dtype=torch.float64,
                                                      requires_grad=True)],
     "one dtype and device"),
    (torch.zeros(2, requires_grad=True), "not a single tensor"),
    ([torch.zeros(2)], "no parameters that require gradients"),
    ([], "no parameters that require gradients"),
    (["weight"], "must be tensors, got str"),
])
def test_bad_params_are_refused_with_a_message_that_says_what_to_do(params, message):
    with pytest.raises(ValueError, match=message):
        ShardedOptimizer(params, torch.optim.AdamW)


# ---- ZeRO-1 and ZeRO-2 on real ranks ----------------------------------------

def sharding_worker(rank, world_size):
    out = {}
    torch_ddp = nn.parallel.DistributedDataParallel
    plain = torch_ddp(make_net())
    train(plain, torch.optim.AdamW(plain.parameters(), **ADAMW), rank, 10)
    out["plain"] = params_of(plain)

    model = torch_ddp(make_net())
    sharded = ShardedOptimizer(model.parameters(), torch.optim.AdamW, **ADAMW)
    out["shard_numel"] = sharded.shard.numel()
    train(model, sharded, rank, 10)
    out["zero1"] = params_of(model)
    out["zero1_state_numel"] = [v.numel() for v in sharded.state[sharded.shard].values()]

    model = dt.ddp.DistributedDataParallel(make_net())  # the course's DDP
    train(model, ShardedOptimizer(model.parameters(), torch.optim.AdamW,
                                  **ADAMW), rank, 10)
    out["zero1_our_ddp"] = params_of(model)

    from torch.distributed.optim import ZeroRedundancyOptimizer  # warns on import
    model = torch_ddp(make_net())
    train(model, ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW,
                                         **ADAMW), rank, 10)
    out["torch_zero"] = params_of(model)

    model = torch_ddp(make_net())
    model.module[0].bias.requires_grad_(False)
    frozen_before = model.module[0].bias.detach().clone()
    sharded = ShardedOptimizer(model.parameters(), torch.optim.AdamW, **ADAMW)
    x, y = batch(0, rank)
    loss = sharded.step(lambda: nn.functional.mse_loss(model(x), y).backward()
                        or torch.tensor(1.5))
    out["closure_loss"] = loss.item()
    out["frozen_unchanged"] = torch.equal(model.module[0].bias, frozen_before)
    out["frozen_count"] = len(sharded.params)
    sharded.zero_grad()
    out["grads_after_zero_grad"] = [p.grad for p in model.parameters()]

    plain = torch_ddp(make_net())
    train(plain, torch.optim.AdamW(plain.parameters(), **ADAMW), rank, 5)
    out["plain5"] = params_of(plain)
    zero2 = Zero2DataParallel(make_net() if rank == 0 else nn.Sequential(
        nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, OUT)),
        torch.optim.AdamW, **ADAMW)  # rank 0's values win at construction
    x, y = batch(0, rank)
    nn.functional.mse_loss(zero2(x), y).backward()
    out["zero2_full_grads"] = [p.grad for p in zero2.module.parameters()]
    out["zero2_shard_grad_numel"] = zero2.optimizer.shard.grad.numel()
    zero2.zero_grad()
    train(zero2, zero2, rank, 5)
    out["zero2"] = params_of(zero2)
    return out


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"world{w}")
def sharded(request):
    return request.param, dt.run(sharding_worker, request.param,
                                 timeout=RUN_TIMEOUT)


def assert_params_equal(got, want, what, exact=True):
    assert got.keys() == want.keys()
    for name in want:
        if exact:
            assert torch.equal(got[name], want[name]), \
                f"{what}, {name}: max difference {(got[name] - want[name]).abs().max()}"
        else:
            torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"{what}, {name}: {m}")


def test_zero1_is_bit_identical_to_plain_adamw_after_10_steps(sharded):
    world_size, results = sharded
    for rank, out in enumerate(results):
        assert_params_equal(out["zero1"], out["plain"], f"world {world_size} rank {rank}")
        # the course's DDP sums in another order than torch's on 3 ranks
        assert_params_equal(out["zero1_our_ddp"], out["plain"],
                            f"with our DDP, world {world_size} rank {rank}",
                            exact=False)


def test_zero1_keeps_optimizer_state_for_one_padded_shard_only(sharded):
    world_size, results = sharded
    for out in results:
        assert out["shard_numel"] == shard_size(43, world_size)  # 22 or 15, not 43
        # Adam's two moments (and the step counter) cover the shard only
        assert sorted(out["zero1_state_numel"]) == [1, out["shard_numel"],
                                                    out["shard_numel"]]


def test_zero1_matches_torchs_zero_redundancy_optimizer(sharded):
    world_size, results = sharded
    for rank, out in enumerate(results):
        assert_params_equal(out["zero1"], out["torch_zero"],
                            f"world {world_size} rank {rank}")


def test_zero1_leaves_frozen_parameters_alone_and_returns_the_closures_loss(sharded):
    _, results = sharded
    for out in results:
        assert out["frozen_count"] == 3  # 4 tensors, one frozen
        assert out["frozen_unchanged"]
        assert out["closure_loss"] == 1.5
        assert out["grads_after_zero_grad"] == [None] * 4


def test_zero2_keeps_only_the_gradient_shard_after_backward(sharded):
    world_size, results = sharded
    for out in results:
        assert out["zero2_full_grads"] == [None] * 4
        assert out["zero2_shard_grad_numel"] == shard_size(43, world_size)


def test_zero2_matches_torch_ddp_with_plain_adamw_after_5_steps(sharded):
    world_size, results = sharded
    for rank, out in enumerate(results):
        assert_params_equal(out["zero2"], out["plain5"],
                            f"world {world_size} rank {rank}", exact=False)


# ---- communication per step, in the paper's count ---------------------------

def one_traced_step_each(rank, world_size):
    model = dt.ddp.DistributedDataParallel(make_net())
    zero1 = ShardedOptimizer(model.parameters(), torch.optim.SGD, lr=0.1)
    zero2 = Zero2DataParallel(make_net(), torch.optim.SGD, lr=0.1)
    for name, model, optimizer in (("zero1", model, zero1),
                                   ("zero2", zero2, zero2)):
        x, y = batch(0, rank)
        with dt.span(name):
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()


def test_zero2_communicates_2_psi_like_plain_dp_and_zero1_after_ddp_3_psi():
    result = dt.run(one_traced_step_each, 2, timeout=RUN_TIMEOUT, trace=True)
    psi, padded_psi = 43, 44  # 43 fp32 parameters, padded to 2 x 22
    for rank in range(2):
        timeline = result.timeline.for_rank(rank)
        volume = {}
        for step in ("zero1", "zero2"):
            (span,) = [e for e in timeline.events if e.name == step]
            volume[step] = paper_comm_volume(
                [e for e in timeline.events if span.start <= e.start <= span.end], 2)
        # DDP's all-reduce (2 Psi), then the all-gather of the parameters (Psi)
        assert volume["zero1"] == 2 * 4 * psi + 4 * padded_psi
        # a reduce-scatter of the gradients and an all-gather of the parameters
        assert volume["zero2"] == 2 * 4 * padded_psi


# ---- memory per rank: measured against the paper's formulas -----------------

def memory_worker(rank, world_size):
    """One AdamW step per stage on a 10.5M-parameter MLP; the bytes this rank
    holds after the step (before zero_grad), then everything is dropped."""
    x = torch.randn(4, 1024)

    def one_step(model, optimizer):
        model(x).square().mean().backward()
        optimizer.step()
        return model_state_bytes(model, optimizer)

    measured = {}
    model = dt.ddp.DistributedDataParallel(reference_mlp(depth=10))
    measured[0] = one_step(model, torch.optim.AdamW(model.parameters()))
    model = dt.ddp.DistributedDataParallel(reference_mlp(depth=10))
    measured[1] = one_step(model, ShardedOptimizer(model.parameters(),
                                                   torch.optim.AdamW))
    model = Zero2DataParallel(reference_mlp(depth=10), torch.optim.AdamW)
    measured[2] = one_step(model, model.optimizer)
    model = dt.zero.FullyShardedDataParallel(reference_mlp(depth=10))
    measured[3] = one_step(model, torch.optim.AdamW(model.parameters()))
    return measured


def test_measured_model_states_per_rank_match_the_zero_formulas():
    results = dt.run(memory_worker, 2, timeout=RUN_TIMEOUT)
    num_params = sum(p.numel() for p in reference_mlp(depth=10).parameters())
    assert num_params >= 10_000_000
    for rank, measured in enumerate(results):
        for stage, sizes in measured.items():
            predicted = memory.zero_bytes_per_device(
                num_params, 2, stage, optimizer_bytes_per_param=8,
                param_bytes=4, grad_bytes=4)
            # the issue asks for 10%; only Adam's step counters differ
            assert abs(sizes["total"] - predicted) <= 0.01 * predicted, \
                (rank, stage, sizes, predicted)
        # each stage saves what the paper says it saves
        totals = [measured[s]["total"] for s in range(4)]
        assert totals[0] > totals[1] > totals[2] > totals[3]
        assert measured[3]["parameters"] < 0.51 * measured[0]["parameters"]
