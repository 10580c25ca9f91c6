"""`ddp_teach.syncbn`: SyncBatchNorm on N ranks against nn.BatchNorm on one
process holding the concatenated batch.

How the gradients compare: each rank's loss is sum(output * upstream) over
ITS samples, so the sum of the ranks' losses is the full-batch loss
sum(full_output * full_upstream). (A random `upstream` rather than a plain
sum: the sum of a batch norm's output over the batch is constant, so its
input gradient would be zero and prove nothing.) Then each rank's input
gradient must be its rows of the full-batch input gradient, and the SUM
over ranks of the weight and bias gradients the full-batch ones (DDP would
average them: the full-batch gradient divided by the world size).

Per-rank batch sizes are uneven, one rank of four has none, and one has a
single sample. Several cases run per `dt.run` so the file stays fast.
"""
import pytest
import torch
import torch.distributed as dist
from torch import nn

import ddp_teach as dt
from ddp_teach.syncbn import SyncBatchNorm, global_batch_stats

RTOL, ATOL = 1e-4, 1e-5
# The converted CNN runs in float64 on both sides. Its convolution gradient
# passes through batch norm's backward, whose terms nearly cancel: in float32
# the rounding of sums taken in another order (oneDNN's AVX2 and AVX-512
# kernels differ) was seen at 1e-5, 0.7% of the gradient. float64 rounding
# (eps 1.1e-16) amplified the same way stays below 1e-10.
RTOL64, ATOL64 = 1e-7, 1e-10
STEPS = 3
SAMPLE_SHAPES = {"N,C": (3,), "N,C,L": (3, 5), "N,C,H,W": (2, 4, 3)}
BATCH_SIZES = {2: [2, 5], 3: [1, 4, 2], 4: [3, 0, 5, 1]}


def full_batch(kind, total, step):
    """The concatenated batch of every rank and the gradient arriving at the
    output: the same on every rank and in the test process."""
    generator = torch.Generator().manual_seed(1000 * step + len(kind))
    shape = (total, *SAMPLE_SHAPES[kind])
    x = torch.randn(shape, generator=generator) * 2 + 1.5
    return x, torch.randn(shape, generator=generator)


def set_affine(bn, channels):
    generator = torch.Generator().manual_seed(channels)
    with torch.no_grad():
        bn.weight.copy_(1 + 0.5 * torch.randn(channels, generator=generator))
        bn.bias.copy_(torch.randn(channels, generator=generator))
    return bn


def small_cnn():
    """In float64: see RTOL64."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.Sequential(nn.Conv2d(4, 3, 1), nn.BatchNorm2d(3)),
                         nn.Flatten(), nn.Linear(3 * 4 * 3, 5), nn.BatchNorm1d(5)).double()


def cnn_input(total):
    return torch.randn(total, 2, 4, 3, generator=torch.Generator().manual_seed(9),
                       dtype=torch.float64)


def on_ranks(rank, world_size, sizes):
    """Every case on this rank: outputs, gradients (parameter gradients
    summed over ranks), running statistics and eval outputs."""
    mine = slice(sum(sizes[:rank]), sum(sizes[:rank + 1]))
    results = {}
    for kind, shape in SAMPLE_SHAPES.items():
        bn = set_affine(SyncBatchNorm(shape[0]), shape[0])
        steps = []
        for step in range(STEPS):
            x, upstream = full_batch(kind, sum(sizes), step)
            x = x[mine].clone().requires_grad_()
            bn.zero_grad()
            out = bn(x)
            (out * upstream[mine]).sum().backward()
            param_grads = torch.stack([bn.weight.grad, bn.bias.grad])
            dist.all_reduce(param_grads)
            steps.append((out.detach(), x.grad, param_grads))
        bn.eval()
        eval_out = bn(full_batch(kind, sum(sizes), STEPS)[0][mine])
        stats = global_batch_stats(full_batch(kind, sum(sizes), 0)[0][mine])
        results[kind] = dict(steps=steps, eval_out=eval_out, stats=stats,
                             running=(bn.running_mean, bn.running_var,
                                      bn.num_batches_tracked))
    cnn = SyncBatchNorm.convert(small_cnn())
    x = cnn_input(sum(sizes))
    out = cnn(x[mine])
    out.pow(2).sum().backward()
    conv_grad = cnn[0].weight.grad.clone()
    dist.all_reduce(conv_grad)
    results["cnn"] = (out.detach(), conv_grad)
    return results


def close(actual, expected, what, rtol=RTOL, atol=ATOL):
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, what
    assert torch.allclose(actual, expected, rtol=rtol, atol=atol), \
        f"{what}: max error {(actual - expected).abs().max()}"


@pytest.mark.parametrize("world_size", sorted(BATCH_SIZES))
def test_matches_batch_norm_over_the_full_batch(world_size):
    sizes = BATCH_SIZES[world_size]
    results = dt.run(on_ranks, world_size, args=(sizes,))
    bounds = [slice(sum(sizes[:r]), sum(sizes[:r + 1])) for r in range(world_size)]
    for kind, shape in SAMPLE_SHAPES.items():
        reference = nn.BatchNorm2d if len(shape) == 3 else nn.BatchNorm1d
        bn = set_affine(reference(shape[0]), shape[0])
        for step in range(STEPS):
            x, upstream = full_batch(kind, sum(sizes), step)
            x.requires_grad_()
            bn.zero_grad()
            out = bn(x)
            (out * upstream).sum().backward()
            for rank, mine in enumerate(bounds):
                got_out, got_x_grad, got_param_grads = results[rank][kind]["steps"][step]
                where = f"{kind} step {step} rank {rank}"
                close(got_out, out.detach()[mine], f"output, {where}")
                close(got_x_grad, x.grad[mine], f"input grad, {where}")
                close(got_param_grads, torch.stack([bn.weight.grad, bn.bias.grad]),
                      f"weight/bias grad, {where}")
        bn.eval()
        eval_out = bn(full_batch(kind, sum(sizes), STEPS)[0])
        first = full_batch(kind, sum(sizes), 0)[0].transpose(0, 1).reshape(shape[0], -1)
        for rank, mine in enumerate(bounds):
            mean, var, count = results[rank][kind]["stats"]
            assert count == first.shape[1]
            close(mean, first.mean(1), f"global mean, {kind} rank {rank}")
            close(var, first.var(1, unbiased=False), f"global var, {kind} rank {rank}")
            running_mean, running_var, batches = results[rank][kind]["running"]
            close(running_mean, bn.running_mean, f"running_mean, {kind} rank {rank}")
            close(running_var, bn.running_var, f"running_var, {kind} rank {rank}")
            assert batches.item() == STEPS
            close(results[rank][kind]["eval_out"], eval_out[mine],
                  f"eval output, {kind} rank {rank}")
    cnn = small_cnn()
    out = cnn(cnn_input(sum(sizes)))
    out.pow(2).sum().backward()
    for rank, mine in enumerate(bounds):
        got_out, got_conv_grad = results[rank]["cnn"]
        close(got_out, out.detach()[mine], f"converted CNN output, rank {rank}",
              RTOL64, ATOL64)
        close(got_conv_grad, cnn[0].weight.grad, f"converted CNN conv grad, rank {rank}",
              RTOL64, ATOL64)


@pytest.mark.parametrize("momentum", [0.1, None])
def test_without_a_process_group_it_is_batch_norm(momentum):
    channels = SAMPLE_SHAPES["N,C,H,W"][0]
    ours = set_affine(SyncBatchNorm(channels, momentum=momentum), channels)
    theirs = set_affine(nn.BatchNorm2d(channels, momentum=momentum), channels)
    for step in range(STEPS):
        x = full_batch("N,C,H,W", 6, step)[0]
        close(ours(x), theirs(x), f"training output, step {step}")
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        assert torch.allclose(getattr(ours, name), getattr(theirs, name)), name
    ours.eval(), theirs.eval()
    x = full_batch("N,C,H,W", 6, STEPS)[0]
    close(ours(x), theirs(x), "eval output")


def test_global_batch_stats_on_one_process():
    x = full_batch("N,C,L", 4, 0)[0]
    mean, var, count = global_batch_stats(x)
    assert count == 4 * 5
    close(mean, x.mean((0, 2)), "mean")
    close(var, x.var((0, 2), unbiased=False), "biased variance")


def test_convert_replaces_every_batch_norm_keeping_parameters_and_buffers():
    model = small_cnn()
    model(cnn_input(4))  # running statistics away from the defaults
    model.eval()
    originals = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    before = model(torch.ones(2, 2, 4, 3, dtype=torch.float64))
    converted = SyncBatchNorm.convert(model)
    assert converted is model
    syncs = [m for m in model.modules() if isinstance(m, SyncBatchNorm)]
    assert len(syncs) == len(originals) == 3
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    for old, new in zip(originals, syncs):
        assert new.weight is old.weight and new.bias is old.bias
        assert torch.equal(new.running_mean, old.running_mean)
        assert torch.equal(new.running_var, old.running_var)
        assert new.num_batches_tracked.item() == 1 and not new.training
        assert (new.num_features, new.eps, new.momentum) == (old.num_features, old.eps,
                                                             old.momentum)
    close(model(torch.ones(2, 2, 4, 3, dtype=torch.float64)), before, "eval output after convert")
    lone = SyncBatchNorm.convert(nn.BatchNorm1d(7, affine=False))
    assert isinstance(lone, SyncBatchNorm) and lone.weight is None


def test_wrong_channel_count_is_refused():
    with pytest.raises(ValueError, match=r"\(N, 3\)"):
        SyncBatchNorm(3)(torch.randn(2, 4))
