"""dt.amp: the loss scaler against torch.amp.GradScaler, and 16-bit gradient
communication against fp32 DDP."""
import math

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import ddp_teach as dt
from ddp_teach.amp import LossScaler, bf16_allreduce_hook, fp16_allreduce_hook, next_scale

# finite (True) / non-finite (False) gradients, step by step
SCRIPT = [True] * 5 + [False] + [True] * 7 + [False, False] + [True] * 4 + [False]


def scripted_steps(scaler, script, bad_value=math.inf):
    """Run `scaler` over a scripted sequence; returns (scales after each
    update, whether each step reached the optimizer, the parameter)."""
    param = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([param], lr=0.1)
    scales, stepped = [], []
    for finite in script:
        optimizer.zero_grad()
        scaler.scale((param * 2.0).sum()).backward()
        if not finite:
            param.grad[1] = bad_value
        before = param.detach().clone()
        scaler.step(optimizer)
        scaler.update()
        stepped.append(not torch.equal(before, param.detach()))
        scales.append(scaler.get_scale())
    return scales, stepped, param.detach()


@pytest.mark.parametrize("bad_value", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("kwargs", [
    dict(init_scale=8.0, growth_interval=3),
    dict(init_scale=2.0 ** 16, growth_factor=4.0, backoff_factor=0.25, growth_interval=2),
    dict(),
])
def test_scale_sequence_equals_torch_gradscaler(kwargs, bad_value):
    ours = scripted_steps(LossScaler(**kwargs), SCRIPT, bad_value)
    theirs = scripted_steps(torch.amp.GradScaler("cpu", **kwargs), SCRIPT, bad_value)
    assert ours[0] == theirs[0]
    assert ours[1] == theirs[1] == SCRIPT  # skipped exactly on the bad steps
    torch.testing.assert_close(ours[2], theirs[2], rtol=0, atol=0)


def test_scale_grows_and_backs_off_as_documented():
    scales, _, _ = scripted_steps(LossScaler(init_scale=4.0, growth_interval=2),
                                  [True, True, False, True, True, True])
    assert scales == [4.0, 8.0, 4.0, 4.0, 8.0, 8.0]


def test_next_scale_rule():
    assert next_scale(1024.0, 5, True) == (512.0, 0)
    assert next_scale(1024.0, 1998, False) == (1024.0, 1999)
    assert next_scale(1024.0, 1999, False) == (2048.0, 0)
    assert next_scale(3e38, 0, False, growth_interval=1) == (3e38, 0)  # no inf scale


def test_unscale_before_clipping_clips_true_gradients():
    param = torch.nn.Parameter(torch.zeros(4))
    optimizer = torch.optim.SGD([param], lr=1.0)
    scaler = LossScaler(init_scale=1024.0)
    scaler.scale((param * torch.tensor([3.0, 4.0, 0.0, 0.0])).sum()).backward()
    scaler.unscale_(optimizer)
    assert param.grad.tolist() == [3.0, 4.0, 0.0, 0.0]
    norm = torch.nn.utils.clip_grad_norm_([param], max_norm=1.0)
    assert norm.item() == pytest.approx(5.0)
    scaler.step(optimizer)  # no second unscale
    scaler.update()
    torch.testing.assert_close(param.detach(), torch.tensor([-0.6, -0.8, 0.0, 0.0]))


def test_misuse_gets_clear_errors():
    param = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([param], lr=0.1)
    scaler = LossScaler()
    with pytest.raises(RuntimeError, match="call scaler.step"):
        scaler.update()
    scaler.scale(param.sum()).backward()
    scaler.unscale_(optimizer)
    with pytest.raises(RuntimeError, match="already called"):
        scaler.unscale_(optimizer)
    with pytest.raises(ValueError, match="growth_interval"):
        LossScaler(growth_interval=0)
    with pytest.raises(ValueError, match="backoff_factor"):
        LossScaler(backoff_factor=2.0)
    with pytest.raises(TypeError, match="tensor"):
        scaler.scale("loss")


def test_disabled_scaler_is_transparent():
    scaler = LossScaler(enabled=False)
    loss = torch.tensor(3.0)
    assert scaler.scale(loss) is loss and scaler.get_scale() == 1.0


def train_with_hook(rank, world_size, which, hook_name, steps):
    """A few SGD steps of DDP (torch's or ours) with an optional 16-bit hook;
    returns the final parameters and the dtypes that crossed the wire."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 4))
    ddp = TorchDDP(model) if which == "torch" else dt.ddp.DistributedDataParallel(model)
    hooks = {"fp16": fp16_allreduce_hook, "bf16": bf16_allreduce_hook}
    if hook_name:
        ddp.register_comm_hook(None, hooks[hook_name])
    sent = set()
    original = dist.all_reduce

    def spy(tensor, *args, **kwargs):
        sent.add(str(tensor.dtype))
        return original(tensor, *args, **kwargs)
    dist.all_reduce = spy
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        x = torch.randn(8, 16, generator=g)
        optimizer.zero_grad()
        ddp(x).square().mean().backward()
        optimizer.step()
    dist.all_reduce = original
    return [p.detach() for p in model.parameters()], sorted(sent)


@pytest.mark.parametrize("which", ["torch", "ours"])
def test_compressed_ddp_stays_close_to_fp32(which):
    steps = 10
    exact = dt.run(train_with_hook, 2, args=(which, None, steps), timeout=60)
    for hook_name, dtype, tolerance in (("fp16", "torch.float16", 2e-3),
                                        ("bf16", "torch.bfloat16", 2e-2)):
        compressed = dt.run(train_with_hook, 2, args=(which, hook_name, steps),
                            timeout=60)
        for (params, sent), (reference, _) in zip(compressed, exact):
            assert sent == [dtype]
            for p, q in zip(params, reference):
                torch.testing.assert_close(p, q, rtol=0, atol=tolerance)
                assert not torch.equal(p, q) or hook_name == "fp16"
        assert torch.equal(compressed[0][0][0], compressed[1][0][0])  # replicas equal


def test_fp16_hook_divides_before_casting():
    """Each rank holds 40000: the sum (80000) overflows fp16, the mean does not."""
    def worker(rank, world_size):
        model = torch.nn.Linear(1, 1, bias=False)
        ddp = dt.ddp.DistributedDataParallel(model)
        ddp.register_comm_hook(None, fp16_allreduce_hook)
        (ddp(torch.ones(1, 1)) * 40000.0).sum().backward()
        return model.weight.grad.item()
    assert dt.run(worker, 2, timeout=30) == [40000.0, 40000.0]


def test_our_ddp_takes_one_hook_and_checks_it():
    def worker(rank, world_size):
        ddp = dt.ddp.DistributedDataParallel(torch.nn.Linear(2, 2))
        errors = []
        for hook in ("not a function", fp16_allreduce_hook, bf16_allreduce_hook):
            try:
                ddp.register_comm_hook(None, hook)
            except (TypeError, RuntimeError) as error:
                errors.append(str(error))
        return errors
    errors = dt.run(worker, 2, timeout=30)[0]
    assert len(errors) == 2
    assert "hook must be a function" in errors[0]
    assert "already registered" in errors[1]
