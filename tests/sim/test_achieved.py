"""Achieved compute: matrix products by shape, the host clock that makes
small models host-bound, the slowdown of overlapped compute, determinism,
and the datasheet-peak mode left as it was."""
import math
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
from torch import nn

import ddp_teach as dt
from ddp_teach.sim import DEVICES, Achieved, Simulation, one_rank
from ddp_teach.sim.model.calibrated import EMULATED
from ddp_teach.sim.model.efficiency import matmul_seconds, overlapped_end, rate_seconds

H100 = DEVICES["H100 SXM"]
A100 = DEVICES["A100 80GB"]


def test_large_matmuls_run_at_the_calibrated_fraction_of_peak():
    a = A100.achieved
    m = n = k = 16384
    seconds = matmul_seconds(A100, a, m, n, k, dtype="bfloat16", burst=True)
    rate = 2 * m * n * k / (seconds - a.kernel_s)
    # 128 x 128 tiles: 16384 of them over 108 SMs, 152 waves of which the
    # last is 76% full
    waves = math.ceil(128 * 128 / 108)
    assert rate == pytest.approx(312e12 * a.matmul * (128 * 128) / (waves * 108))
    training = matmul_seconds(A100, a, m, n, k, dtype="bfloat16")
    assert training - a.kernel_s == pytest.approx((seconds - a.kernel_s) / a.sustained)


def test_fp32_products_run_on_cuda_cores_and_missing_16_bit_units_are_emulated():
    def busy(device, dtype):
        a = device.achieved
        return matmul_seconds(device, a, 8192, 8192, 8192, dtype=dtype,
                              burst=True) - a.kernel_s

    a = H100.achieved
    # the same tiles either way: only the fraction of each peak differs
    assert busy(H100, "float32") / busy(H100, "bfloat16") == pytest.approx(
        (989.4 * a.matmul) / (66.9 * a.matmul_fp32))
    assert a.matmul_fp32 < a.matmul < A100.achieved.matmul_fp32
    t4 = DEVICES["T4"]
    assert "bfloat16" not in t4.flops  # Turing has fp16 tensor cores, no bf16
    assert busy(t4, "bfloat16") == pytest.approx(busy(t4, "float32") / EMULATED)
    assert busy(t4, "float16") < busy(t4, "float32") / 8
    # a GPU without figures of its own for fp32 products uses its tensor cores' one
    v100 = DEVICES["V100 SXM2"]
    assert v100.achieved.matmul_fp32 is None
    assert busy(v100, "float32") == pytest.approx(
        busy(v100, "float16") * 125 / 15.7)


def test_fp32_convolutions_use_tf32_as_torch_does_and_products_only_when_asked():
    from ddp_teach.sim.runtime.charges import achieved_seconds, math_type
    aten = torch.ops.aten
    conv, mm = aten.convolution.default, aten.mm.default
    assert torch.backends.cudnn.allow_tf32                       # torch's defaults
    assert torch.get_float32_matmul_precision() == "highest"
    assert math_type(A100, conv, "float32") == "tf32"
    assert math_type(A100, mm, "float32") == "float32"
    assert math_type(A100, conv, "bfloat16") == "bfloat16"
    assert math_type(DEVICES["T4"], conv, "float32") == "float32"  # Turing: no TF32
    a, b = torch.empty(4096, 4096, device="meta"), torch.empty(4096, 4096, device="meta")
    fp32_s = achieved_seconds(A100, A100.achieved, mm, (a, b), {}, a)
    try:
        torch.set_float32_matmul_precision("high")
        assert math_type(A100, mm, "float32") == "tf32"
        tf32_s = achieved_seconds(A100, A100.achieved, mm, (a, b), {}, a)
        torch.backends.cudnn.allow_tf32 = False
        assert math_type(A100, conv, "float32") == "float32"
    finally:
        torch.set_float32_matmul_precision("highest")
        torch.backends.cudnn.allow_tf32 = True
    # TF32 products run on the tensor cores: 156 TFLOP/s of peak against 19.5,
    # at the tensor cores' sustained share of it in a training run
    assert fp32_s / tf32_s == pytest.approx(
        (156 * A100.achieved.matmul) / (19.5 * A100.achieved.matmul_fp32)
        * A100.achieved.sustained, rel=0.02)
    # and TF32 convolutions at their own, calibrated share of the TF32 peak
    x = torch.empty(64, 256, 56, 56, device="meta")
    w = torch.empty(256, 256, 3, 3, device="meta")
    out = torch.empty(64, 256, 56, 56, device="meta")
    args = (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    busy = achieved_seconds(A100, A100.achieved, conv, args, {}, out) - A100.achieved.kernel_s
    flops = 2 * 64 * 256 * 56 * 56 * 256 * 9
    assert busy == pytest.approx(
        flops / (156e12 * A100.achieved.conv_tf32) / A100.achieved.sustained, rel=1e-6)


def test_fp32_convolutions_on_the_cuda_cores_take_their_own_share():
    """Without TF32 (a T4; an A100 with it turned off) an fp32 convolution
    runs on the CUDA cores at `conv_fp32` of the fp32 peak, not at the
    tensor cores' `conv` share of it."""
    from ddp_teach.sim.runtime.charges import achieved_seconds
    conv = torch.ops.aten.convolution.default
    x = torch.empty(64, 256, 56, 56, device="meta")
    w = torch.empty(256, 256, 3, 3, device="meta")
    args = (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    flops = 2 * 64 * 256 * 56 * 56 * 256 * 9

    def busy(device):
        a = device.achieved
        return achieved_seconds(device, a, conv, args, {}, x) - a.kernel_s

    t4 = DEVICES["T4"]
    assert t4.achieved.conv_fp32 != t4.achieved.conv
    assert busy(t4) == pytest.approx(
        flops / (8.1e12 * t4.achieved.conv_fp32), rel=1e-6)   # CUDA cores: no `sustained`
    try:
        torch.backends.cudnn.allow_tf32 = False
        assert busy(A100) == pytest.approx(
            flops / (19.5e12 * A100.achieved.conv_fp32), rel=1e-6)
        no_share = replace(A100, achieved=replace(A100.achieved, conv_fp32=None))
        assert busy(no_share) == pytest.approx(   # None: the tensor cores' `conv`
            flops / (19.5e12 * A100.achieved.conv), rel=1e-6)
    finally:
        torch.backends.cudnn.allow_tf32 = True


def test_no_convolution_type_is_slower_than_fp32_on_the_cuda_cores_unless_emulated():
    """cuDNN picks its fastest kernel: on every preset a 16-bit or TF32
    convolution takes at most the fp32 one's time, also on a card whose
    tensor cores' `conv` share alone would make fp16 slower (made here from
    the RTX 4090, whose tensor cores are only twice its CUDA cores in 16
    bits); bf16 on a GPU without bf16 units is converted and takes
    1 / EMULATED times the fp32 time."""
    def busy(device, dtype):
        a = device.achieved
        return rate_seconds(device, a, "conv", 1e12, 0, dtype, burst=True) - a.kernel_s

    for name, device in DEVICES.items():
        fp32 = busy(device, "float32")
        assert busy(device, "tf32") <= fp32, name
        for dtype in ("float16", "bfloat16"):
            if dtype in device.flops:
                assert busy(device, dtype) <= fp32, (name, dtype)
            else:
                assert busy(device, dtype) == pytest.approx(fp32 / EMULATED), (name, dtype)
    rtx = DEVICES["RTX 4090"]
    weak = replace(rtx, achieved=replace(rtx.achieved, conv=0.1))
    assert weak.flops["float16"] * 0.1 < weak.flops["float32"] * weak.achieved.conv_fp32
    assert busy(weak, "float16") == pytest.approx(busy(weak, "float32"))


def test_torchs_newer_tf32_settings_are_read_and_gpus_without_tf32_compute_fp32():
    from ddp_teach.sim.runtime.charges import math_type
    from ddp_teach.sim.model.efficiency import rate_seconds
    mm, conv = torch.ops.aten.mm.default, torch.ops.aten.convolution.default
    try:  # the per-backend settings of torch 2.9 and later
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        torch.backends.cudnn.conv.fp32_precision = "ieee"
        assert math_type(H100, mm, "float32") == "tf32"
        assert math_type(H100, conv, "float32") == "float32"
    finally:
        torch.backends.cuda.matmul.fp32_precision = "none"
        torch.backends.cudnn.conv.fp32_precision = "tf32"
    assert torch.get_float32_matmul_precision() == "highest"  # restored

    def busy(device, dtype, kind=None):
        a = device.achieved
        if kind:
            return rate_seconds(device, a, kind, 1e12, 0, dtype, burst=True) - a.kernel_s
        return matmul_seconds(device, a, 8192, 8192, 8192, dtype=dtype,
                              burst=True) - a.kernel_s

    t4, rtx = DEVICES["T4"], DEVICES["RTX 4090"]
    assert busy(t4, "tf32") == busy(t4, "float32")           # no TF32 units: fp32
    assert busy(t4, "float64") == busy(t4, "float32")        # not a 16-bit emulation
    # the RTX 4090's TF32 peak is its fp32 one: TF32 never makes it slower
    assert busy(rtx, "tf32", "conv") <= busy(rtx, "float32", "conv")
    assert busy(rtx, "tf32") < busy(rtx, "float32")


def test_a_matmul_just_past_a_wave_pays_for_part_of_an_empty_wave():
    a = H100.achieved
    # 132 SMs: 132 tiles of 128 x 128 fill one wave. One more row of tiles
    # needs a second wave of 128 x 128 tiles, or three of half-size 128 x 64
    # tiles (266 of them): 1.5 times the full wave's time, for 1% more work
    one_wave = matmul_seconds(H100, a, 128 * 132, 128, 4096, dtype="bfloat16", burst=True)
    past = matmul_seconds(H100, a, 128 * 133, 128, 4096, dtype="bfloat16", burst=True)
    assert past - a.kernel_s == pytest.approx(1.5 * (one_wave - a.kernel_s))


def test_streaming_kernels_reach_the_measured_bandwidth_and_no_kernel_is_free():
    a = H100.achieved
    nbytes = 3 * 2 ** 31
    seconds = rate_seconds(H100, a, "memory", 0, nbytes, burst=True)
    # the measured 2.97 TB/s (STREAM triad), to the rounding of its fraction,
    # which calibrated.py writes with four figures (half a unit of 0.8866)
    assert nbytes / (seconds - a.kernel_s) == pytest.approx(2.97e12, rel=0.5e-4 / a.memory)
    assert rate_seconds(H100, a, "memory", 0, 8, burst=True) == pytest.approx(
        a.kernel_s, rel=1e-3)


def test_overlapped_compute_runs_slower_only_where_it_overlaps():
    busy = [(1.0, 2.0), (5.0, 6.0)]
    assert overlapped_end(0.0, 0.5, busy, 2.0) == 0.5      # before any
    assert overlapped_end(1.0, 0.5, busy, 2.0) == 2.0      # inside: twice as long
    assert overlapped_end(0.5, 1.0, busy, 2.0) == 2.0      # half out, half in
    assert overlapped_end(1.5, 1.0, busy, 2.0) == 2.75     # in, then out
    assert overlapped_end(3.0, 1.0, busy, 1.0) == 4.0


def tiny_steps(rank, world_size, width=16, layers=8):
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    x = torch.randn(4, width)
    dist.barrier()
    start = dt.tracing.now()
    model(x).sum().backward()
    return dt.tracing.now() - start


def test_a_small_model_is_host_bound_and_peak_mode_has_no_host():
    achieved = Simulation("H100 SXM", cluster="DGX H100")
    took, timeline = one_rank(tiny_steps, 1, achieved)
    host = achieved.achieved.host_s_per_op
    # every op costs the host 7 us and the GPU about kernel_s (3.74 us): the
    # step is the host's, and the GPU idles between kernels
    assert took == pytest.approx(_count_ops(achieved) * host, rel=0.05)
    compute = timeline.after_last_barrier().filter(kind="compute")
    assert sum(e.duration for e in compute) < 0.6 * took
    peak = Simulation("H100 SXM", cluster="DGX H100", compute="peak")
    took_peak, _ = one_rank(tiny_steps, 1, peak)
    assert took_peak == pytest.approx(_count_ops(peak) * H100.launch_s, rel=0.05)


def _count_ops(simulation):
    from ddp_teach.sim.runtime.recorder import SimulatedRecorder
    recorder = SimulatedRecorder(0, simulation)
    count = [0]
    original = recorder.kernel
    recorder.kernel = lambda seconds: (count.__setitem__(0, count[0] + 1),
                                       original(seconds))
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(8)])
    x = torch.randn(4, 16)
    with recorder.running():
        model(x).sum().backward()
    return count[0]


def zero3_step(rank, world_size):
    with torch.device("meta"):
        model = dt.fsdp.FullyShardedDataParallel(dt.models.reference_mlp(1024, 4),
                                                 compute_dtype=torch.bfloat16)
        x = torch.randn(2048, 1024)
    dist.barrier()
    model(x).square().mean().backward()


def test_cluster_runs_are_deterministic_and_charge_the_network_across_nodes():
    sim = Simulation("H100 SXM", cluster="DGX H100")
    first = one_rank(zero3_step, 16, sim)[1].events
    again = one_rank(zero3_step, 16, sim)[1].events
    assert first == again
    inside = one_rank(zero3_step, 8, sim)[1].after_last_barrier()
    across = one_rank(zero3_step, 16, sim)[1].after_last_barrier()
    span = [max(e.end for e in t) - min(e.start for e in t) for t in (inside, across)]
    assert span[1] > span[0], "16 ranks span two nodes and go over the NICs"


def test_bad_achieved_figures_are_refused():
    with pytest.raises(ValueError, match="fraction of the peak"):
        Achieved(sms=10, matmul=1.5, memory=0.9, attention=0.3, conv=0.4, kernel_s=1e-6)
    with pytest.raises(ValueError, match="conv_tf32 is a fraction"):
        Achieved(sms=10, matmul=0.8, memory=0.9, attention=0.3, conv=0.4, kernel_s=1e-6,
                 conv_tf32=0)
    with pytest.raises(ValueError, match="conv_fp32 is a fraction"):
        Achieved(sms=10, matmul=0.8, memory=0.9, attention=0.3, conv=0.4, kernel_s=1e-6,
                 conv_fp32=-0.5)
    with pytest.raises(ValueError, match="matmul_fp32 is a fraction"):
        Achieved(sms=10, matmul=0.8, memory=0.9, attention=0.3, conv=0.4, kernel_s=1e-6,
                 matmul_fp32=1.2)
    with pytest.raises(ValueError, match="causal is a fraction"):
        Achieved(sms=10, matmul=0.8, memory=0.9, attention=0.3, conv=0.4, kernel_s=1e-6,
                 causal=0)
    with pytest.raises(ValueError, match="sms"):
        Achieved(sms=0, matmul=0.8, memory=0.9, attention=0.3, conv=0.4, kernel_s=1e-6)
    with pytest.raises(ValueError, match="overlap_slowdown"):
        Achieved(sms=10, matmul=0.8, memory=0.9, attention=0.3, conv=0.4,
                 kernel_s=1e-6, overlap_slowdown=0.5)
    with pytest.raises(TypeError, match="Achieved"):
        dt.sim.Device("x", {"float32": 1e12}, 1e9, 1e9, achieved=0.8)
    bare = dt.sim.Device("x", {"float32": 1e12}, 1e9, 1e9)
    with pytest.raises(ValueError, match="no achieved figures"):
        Simulation(bare, cluster="DGX H100")
    assert Simulation(bare, cluster="DGX H100", compute="peak").achieved is None


def products_beside_a_collective(rank, world_size, collective_bytes):
    with torch.device("meta"):
        x = torch.empty(8192, 8192, dtype=torch.bfloat16)
        grads = torch.empty(collective_bytes // 2, dtype=torch.bfloat16)
    dist.barrier()
    start = dt.tracing.now()
    work = dist.all_reduce(grads, async_op=True) if collective_bytes else None
    for _ in range(4):
        x = x @ x
    after = dt.tracing.now() - start
    if work is not None:
        work.wait()
    return after


def test_compute_beside_a_running_collective_is_slowed_by_the_stated_factor():
    sim = Simulation("H100 SXM", cluster="DGX H100")
    alone, _ = one_rank(products_beside_a_collective, 8, sim, args=(0,))
    # 16 GiB on NVLS takes ~60 ms: the four products run inside it
    beside, _ = one_rank(products_beside_a_collective, 8, sim, args=(2 ** 34,))
    host = sim.achieved.host_s_per_op  # to issue the first product (and the all-reduce)
    assert beside - 2 * host == pytest.approx(
        (alone - host) * sim.achieved.overlap_slowdown, rel=1e-9)


def ddp_step(rank, world_size):
    torch.manual_seed(0)
    model = dt.ddp.DistributedDataParallel(nn.Sequential(
        *[nn.Linear(64, 64) for _ in range(4)]), bucket_cap_mb=0.01)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(32, 64, generator=g)
    dist.barrier()
    start = dt.tracing.now()
    model(x).square().mean().backward()
    if rank == 0:
        dist.send(torch.ones(1024), dst=1)
    else:
        dist.recv(torch.empty(1024), src=0)
    took = dt.tracing.now() - start
    return took, [p.grad.clone() for p in model.parameters()]


def test_a_cluster_run_on_real_ranks_is_real_and_repeats_its_virtual_times():
    sim = Simulation("H100 SXM", cluster="DGX H100")
    first = dt.run(ddp_step, 2, simulate=sim)
    again = dt.run(ddp_step, 2, simulate=sim)
    real = dt.run(ddp_step, 2)
    assert [t for t, _ in first] == [t for t, _ in again]
    assert first.timeline.events == again.timeline.events
    for (_, got), (_, want) in zip(first, real):
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert first.timeline.clock == sim.label


def test_the_optimizers_step_counters_are_host_work_that_waits_for_no_kernel():
    """AdamW reads each parameter's step counter (a 0-dim CPU tensor) with
    .item(): on a real GPU that waits for nothing, so the host goes on issuing
    the update while a long kernel still runs; a loss's .item() does wait."""
    from ddp_teach.sim.runtime.recorder import SimulatedRecorder
    clock = SimulatedRecorder(0, Simulation("H100 SXM", cluster="DGX H100"))
    big = torch.randn(2048, 2048)
    params = [nn.Parameter(torch.randn(8)) for _ in range(4)]
    for p in params:
        p.grad = torch.ones(8)
    optimizer = torch.optim.AdamW(params, foreach=True)
    with clock.running():
        big @ big                          # a kernel of about 20 us on the GPU
        busy_until = clock.clock
        optimizer.step()
        issued = clock.host
        big.sum().item()                   # a real .item(): the host waits
    assert issued < busy_until             # the update was issued meanwhile
    assert clock.host >= clock.clock


def test_sustained_slows_tensor_core_work_of_a_training_run_only():
    """`sustained` (the clock under hours of tensor-core load) divides a
    16-bit or TF32 product, convolution or fused attention; not an fp32
    product on the CUDA cores, not a memory-bound kernel, and never a
    benchmark's burst."""
    from ddp_teach.sim.model.efficiency import matmul_seconds, rate_seconds
    h100 = DEVICES["H100 SXM"]
    a = h100.achieved
    assert a.sustained < 1

    def ratio(fn, *args, **kwargs):
        run = fn(h100, a, *args, **kwargs) - a.kernel_s
        burst = fn(h100, a, *args, **kwargs, burst=True) - a.kernel_s
        return run / burst
    assert ratio(matmul_seconds, 4096, 4096, 4096, dtype="bfloat16") == pytest.approx(1 / a.sustained)
    assert ratio(matmul_seconds, 4096, 4096, 4096, dtype="tf32") == pytest.approx(1 / a.sustained)
    assert ratio(matmul_seconds, 4096, 4096, 4096, dtype="float32") == pytest.approx(1)
    assert ratio(rate_seconds, "attention", 1e12, 0, "bfloat16") == pytest.approx(1 / a.sustained)
    assert ratio(rate_seconds, "attention", 1e12, 0, "float32") == pytest.approx(1)
    assert ratio(rate_seconds, "conv", 1e12, 0, "float16") == pytest.approx(1 / a.sustained)
    assert ratio(rate_seconds, "conv", 1e12, 0, "float32") == pytest.approx(1)
    assert ratio(rate_seconds, "memory", 0, 1e9) == pytest.approx(1)
