"""The course's CUDA and nccl paths, on real GPUs (skipped without them; see
conftest.py): the launcher's nccl workers, the backend choice, exported
scripts under torchrun, DataParallel on CUDA devices, the loss scaler and
the 16-bit gradient hooks."""
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import ddp_teach as dt
import ddp_teach.amp
import ddp_teach.dp
import ddp_teach.scripts


def world() -> int:
    return min(2, dt.system.gpu_count())


def all_reduce_on_gpu(rank, world_size):
    tensor = torch.full((4,), float(rank + 1), device="cuda")
    dist.all_reduce(tensor)  # queued on the GPU's stream, not waited for
    assert dist.get_backend() == "nccl"
    assert torch.cuda.current_device() == rank
    return tensor  # a CUDA tensor: the launcher brings it back on the CPU


def test_nccl_workers_each_drive_their_gpu_and_results_come_back_on_the_cpu():
    n = world()
    results = dt.run(all_reduce_on_gpu, n, backend="nccl")
    total = sum(range(1, n + 1))
    for tensor in results:
        assert tensor.device.type == "cpu"
        assert torch.equal(tensor, torch.full((4,), float(total)))


def test_auto_backend_is_nccl_for_gpu_tensors_and_gloo_for_cpu_ones():
    assert dt.system.choose_backend("auto", world()) == dt.system.GPU_AND_CPU
    with pytest.raises(ValueError, match="one CUDA GPU per rank"):
        dt.system.choose_backend("nccl", dt.system.gpu_count() + 1)


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))


def test_data_parallel_on_cuda_devices_gives_one_devices_gradients():
    devices = [f"cuda:{i}" for i in range(world())] * (2 if world() == 1 else 1)
    x, y = torch.randn(10, 16, device="cuda:0"), torch.randn(10, 1, device="cuda:0")
    model = mlp().to("cuda:0")
    F.mse_loss(dt.dp.DataParallel(model, devices)(x), y).backward()
    whole = mlp().to("cuda:0")
    F.mse_loss(whole(x), y).backward()
    for a, b in zip(model.parameters(), whole.parameters()):
        torch.testing.assert_close(a.grad, b.grad)


def test_the_loss_scaler_matches_grad_scaler_on_cuda():
    """fp16 autocast on CUDA, one step overflowing: the same scales and the
    same parameters after every step (skipped steps included)."""
    ours = dt.amp.LossScaler("cuda", init_scale=2.0 ** 16, growth_interval=2)
    theirs = torch.amp.GradScaler("cuda", init_scale=2.0 ** 16, growth_interval=2)
    models = [mlp().cuda() for _ in range(2)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.01) for m in models]
    for step in range(6):
        x = torch.randn(8, 16, device="cuda") * (1e4 if step == 3 else 1)
        for scaler, model, opt in zip((ours, theirs), models, optimizers):
            opt.zero_grad()
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(x).float().square().mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        assert ours.get_scale() == theirs.get_scale(), step
        for a, b in zip(*(m.parameters() for m in models)):
            torch.testing.assert_close(a, b)


def ddp_with_hook(rank, world_size, hook_name):
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(mlp().cuda(), device_ids=[rank])
    model.register_comm_hook(None, getattr(dt.amp, hook_name))
    x = torch.randn(8, 16, device="cuda",
                    generator=torch.Generator("cuda").manual_seed(rank))
    model(x).square().mean().backward()
    return [p.grad for p in model.parameters()]


@pytest.mark.parametrize("hook_name", ["fp16_allreduce_hook", "bf16_allreduce_hook"])
def test_16_bit_hooks_average_gradients_with_torchs_ddp_on_nccl(hook_name):
    n = world()
    got = dt.run(ddp_with_hook, n, args=(hook_name,), backend="nccl")
    want = None
    for rank in range(n):
        model = mlp().cuda()
        g = torch.Generator("cuda").manual_seed(rank)
        model(torch.randn(8, 16, device="cuda", generator=g)).square().mean().backward()
        grads = [p.grad.cpu() / n for p in model.parameters()]
        want = grads if want is None else [a + b for a, b in zip(want, grads)]
    for a, b in zip(got[0], want):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-3)


def gpu_train(rank, world_size):
    import torch
    import torch.distributed as dist
    tensor = torch.ones(3, device="cuda") * (rank + 1)
    dist.all_reduce(tensor)
    return [dist.get_backend(), tensor.cpu().tolist()]


def test_an_exported_script_picks_nccl_under_torchrun(tmp_path):
    script = dt.scripts.export(gpu_train, tmp_path / "gpu_train.py")
    # the script imports gpu_train from this file, as one exported from a
    # learner's module would: its workers need this folder on their path
    here = str(Path(__file__).parent)
    path = os.pathsep.join(filter(None, (here, os.environ.get("PYTHONPATH"))))
    job = dt.scripts.torchrun(script, nproc_per_node=world(), echo=False,
                              env={"PYTHONPATH": path})
    assert job.ok, job.output
    total = sum(range(1, world() + 1))
    assert job.values == [[dt.system.GPU_AND_CPU, [float(total)] * 3]] * world()


def gpu_and_cpu_collectives(rank, world_size):
    on_gpu, on_cpu = torch.ones(2, device="cuda"), torch.ones(2)
    dist.all_reduce(on_gpu)  # nccl
    dist.all_reduce(on_cpu)  # gloo, in the same group
    return [on_gpu.cpu().tolist(), on_cpu.tolist(), dist.get_backend()]


def test_an_auto_run_takes_gpu_and_cpu_tensors_in_one_group():
    n = world()
    got = dt.run(gpu_and_cpu_collectives, n)
    assert got == [[[float(n)] * 2, [float(n)] * 2, dt.system.GPU_AND_CPU]] * n
