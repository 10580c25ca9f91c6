"""Timing what a real GPU does: kernels, the host's issue rate, a training step.

`gpu_vs_sim.py` sets these measurements beside the simulator's figures for
the same GPU. Kernels are timed with CUDA events around a run of calls
after warm-ups, so a launch's host time overlaps the previous kernel and
only GPU time is counted; the host's time per operation is timed with the
wall clock while the GPU keeps up; training steps by the wall clock over
whole steps, the GPU drained at both ends. FLOPs of attention are counted
as FlashAttention-2 counts them (`ddp_teach.sim.model.efficiency.attention_flops`).
Needs CUDA.
"""
import time

import torch
import torch.nn.functional as F

from ddp_teach.sim.model import efficiency


def cuda_seconds(fn, warmup=5, iters=20) -> float:
    """Mean seconds of one fn() on the GPU, timed with CUDA events."""
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def matmul_tflops(m: int, n: int, k: int, dtype: str) -> float:
    """TFLOP/s of one m x k by k x n product of random `dtype` matrices."""
    a = torch.randn(m, k, device="cuda", dtype=getattr(torch, dtype))
    b = torch.randn(k, n, device="cuda", dtype=getattr(torch, dtype))
    return 2 * m * n * k / cuda_seconds(lambda: a @ b) / 1e12


def copy_tbps(nbytes: int) -> float:
    """TB/s (bytes read and written) of copying `nbytes` from one GPU buffer
    to another."""
    source = torch.empty(nbytes // 4, device="cuda")
    target = torch.empty_like(source)
    return 2 * nbytes / cuda_seconds(lambda: target.copy_(source)) / 1e12


def attention_tflops(shape, dtype: str, kernel: str) -> float:
    """TFLOP/s of fused attention forward and backward on q, k, v of `shape`
    (batch, heads, tokens, head dim), not causal, with torch's SDPA held to
    `kernel` ("flash": FlashAttention-2, or "cudnn": cuDNN's)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {"flash": SDPBackend.FLASH_ATTENTION,
               "cudnn": SDPBackend.CUDNN_ATTENTION}[kernel]
    q, k, v, grad = (torch.randn(*shape, device="cuda", dtype=getattr(torch, dtype),
                                 requires_grad=i < 3) for i in range(4))

    def attention():
        with sdpa_kernel(backend):
            F.scaled_dot_product_attention(q, k, v).backward(grad)

    flops = 3.5 * efficiency.attention_flops(*shape[:2], shape[2], shape[2], shape[3],
                                             False)
    return flops / cuda_seconds(attention, warmup=3, iters=10) / 1e12


def host_seconds_per_op(ops=2000) -> float:
    """Wall-clock seconds per small eager operation issued from Python."""
    x = torch.zeros(1, device="cuda")
    for _ in range(100):
        x.add_(1)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(ops):
        x.add_(1)
    issued = time.perf_counter() - start
    torch.cuda.synchronize()
    return issued / ops


def resnet50_rate(rank, world_size, batch, ddp=True, steps=10, warmup=5,
                  precision="amp"):
    """Images per second of ResNet-50 training on this rank's GPU, all
    ranks together: in this process (ddp=False), or on dt.run's ranks in
    torch's DDP, whose gradients nccl all-reduces (one rank too).
    precision: "amp" (fp16 autocast, a GradScaler, channels-last), or fp32
    in NCHW with its convolutions in TF32 ("tf32", torch's default) or not
    ("fp32", cudnn.allow_tf32 off), as NVIDIA's DeepLearningExamples
    measure ResNet-50 in TF32 and FP32."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddp_teach.models import resnet50
    if precision not in ("amp", "tf32", "fp32"):
        raise ValueError(f"precision {precision!r}: amp, tf32 or fp32")
    amp = precision == "amp"
    torch.backends.cudnn.allow_tf32 = precision != "fp32"
    layout = torch.channels_last if amp else torch.contiguous_format
    torch.cuda.set_device(rank % torch.cuda.device_count())
    model = resnet50(device="cuda").to(memory_format=layout)
    if ddp:
        model = DDP(model, device_ids=[torch.cuda.current_device()])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
    scaler = torch.amp.GradScaler("cuda", enabled=amp)
    x = torch.randn(batch, 3, 224, 224, device="cuda").to(memory_format=layout)
    labels = torch.randint(0, 1000, (batch,), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            loss = F.cross_entropy(model(x), labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    if ddp:
        dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    torch.backends.cudnn.allow_tf32 = True   # torch's default again
    return world_size * batch * steps / (time.perf_counter() - start)
