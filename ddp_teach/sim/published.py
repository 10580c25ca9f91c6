"""Published measurements of real GPUs, and the simulator's figure for each.

A simulator is worth what it agrees with. Each `Measurement` here is a
figure someone measured on real hardware and published (nccl-tests runs
by NCCL's maintainers and by cloud providers, matrix-product, memory and
attention benchmarks), with its configuration and source, and a function
that simulates the same configuration: collectives on a cluster preset
as NCCL would run them (`ddp_teach.sim.comm`), kernels at their achieved
rates (`ddp_teach.sim.efficiency`). `table()` sets the two side by side.

Each row is "calibrate" (a constant of the simulator was solved from it;
the constant's comment names it) or "validate" (no constant saw it), as
`ddp_teach.sim.measurement` explains, which also holds the tolerance
every row is held to. Surveys GPU owners ran on the GPUs learners have
(T4, RTX 4090), and of fp32 products, are `ddp_teach.sim.gpu_surveys`,
whose rows are added here. Training runs (ResNet-50, BERT, MPT, Llama) are in
`benchmarks/sim_vs_published.py`, which adds them to these rows.

Collectives are in nccl-tests' terms (NVIDIA/nccl-tests, doc/PERFORMANCE.md):
sizes are whole buffers in bytes ("1G" = 2^30), algbw = bytes / time, busbw
= algbw x 2(n-1)/n for all-reduce and x (n-1)/n for all-gather and
reduce-scatter.
"""
from ddp_teach.sim import gpu_surveys, measurement
from ddp_teach.sim.benchmark_figures import (attention_tflops, busbw, matmul_tflops,
                                             micros, stream_tbps)
from ddp_teach.sim.hardware import DEVICES
from ddp_teach.sim.measurement import Measurement

GIB, MIB = 2 ** 30, 2 ** 20
AZURE_H100 = ("Azure/AI-benchmarking-guide, \"Azure Results/ND_H100_v5_results.md\" "
              "(commit f350e7e)")
AZURE_A100 = ("Azure/AI-benchmarking-guide, Azure_Results/ND_A100_v4_results.md "
              "(commit 3bb66ca)")
STAS_NET = "stas00/ml-engineering, network/README.md (snapshot 744d01e)"
STAS_MAMF = ("stas00/ml-engineering, compute/accelerator/README.md, \"Maximum "
             "Achievable Matmul FLOPS\" (snapshot 744d01e)")
NCCL_1244 = "NVIDIA/nccl issue 1244 (2024-04, 2 nodes x 8 H20, NCCL 2.21.5)"
CUDNN_FRONTEND = ("NVIDIA/cudnn-frontend, benchmark/benchmark_results.csv (commit "
                  "505fcfe; cuDNN 9.1, clocks locked at 1980 MHz as its README does "
                  "on an H200, H100's chip)")
TORCH_142132 = ("pytorch/pytorch issue 142132 (2024-12: tritonbench's flash_attention "
                "on an H100, torch 2.6.0.dev20241204+cu124)")
# the course's own measurements, made with its benchmarks/gpu_vs_sim.py
COURSE_H100 = ("measured for this course (benchmarks/gpu_vs_sim.py, 2026-11-26) on one "
               "NVIDIA H100 80GB HBM3, torch 2.11.0+cu130, CUDA 13.0, driver 580.159.04, "
               "a 16-core Intel Xeon virtual machine")
# Notebook 10's DDP step (TinyGPT: 2 layers, width 64, 4 heads, 8 x 64 tokens,
# fp32; AdamW with foreach; torch's DDP on one rank of dt.run over nccl) on
# that H100, in seconds: the whole step (mean of 50 after 10 warm-ups), and
# each phase with the GPU drained after it. An earlier run, on another machine
# of the same kind, took 5.54 ms a step. The simulator cannot reproduce this
# here (there is no GPU), so the figures are kept as measured.
CAPSTONE_STEP_H100 = {"step": 4.24e-3, "forward": 1.75e-3, "backward": 3.13e-3,
                      "optimizer": 0.983e-3}


def _collective(*fields):
    return Measurement("collective", *fields)


# Azure's nccl-tests sweeps of an all-reduce on one VM of 8 GPUs: the row's
# label, configuration, source, cluster preset and forced algorithm
AZURE_SWEEPS = {"H100": ("8 GPUs, NVLS", "as the 8 GiB NVLS row", AZURE_H100, "DGX H100",
                         "nvls"),
                "A100": ("8 A100", "as the 8 GiB A100 row", AZURE_A100, "DGX A100", None)}


def _azure(gpu: str, size: str, nbytes: int, figure: float, role="validate", note=""):
    """One more size of Azure's all-reduce sweep on 8 `gpu`s (busbw)."""
    label, config, source, preset, algorithm = AZURE_SWEEPS[gpu]
    return _collective(f"all-reduce {size}, {label}", config, source, figure,
                       "GB/s busbw", role,
                       lambda: busbw(preset, "all_reduce", nbytes, 8, algorithm), note)


def _kernel(*fields):
    return Measurement("kernel", *fields)


def _cudnn_frontend(kernel: str, length: int, causal: bool, figure: float,
                    role="validate", config=None):
    """A row of NVIDIA's attention benchmark on an H100's chip: forward and
    backward, bf16, 16 heads of 128, `length` tokens (batch 2 at 8192, and
    as many sequences as keep the tokens at 16,384 elsewhere), by cuDNN's
    kernel or by torch's SDPA with its flash kernel."""
    batch = max(1, 16384 // length)
    name = {"cudnn": "cuDNN attention", "flash": "SDPA flash"}[kernel]
    what = (f"{name} fwd + bwd" + (", causal" if causal else "")
            + ("" if length == 8192 else f", {length // 1024}k tokens") + ", H100")
    config = config or (f"as the 8,192-token {'cuDNN' if kernel == 'cudnn' else 'flash'} "
                        f"row, batch {batch}, {length:,} tokens"
                        + (", causal" if causal else ", not causal"))
    return _kernel(what, config, CUDNN_FRONTEND, figure, "TFLOP/s", role,
                   lambda: attention_tflops("H100 SXM", batch, 16, length, 128,
                                            kernel=kernel, causal=causal))


def table(rows=None) -> list:
    """[(measurement, simulated, ratio)] for `rows` (default: every
    collective and kernel measurement here)."""
    return measurement.table(MEASUREMENTS if rows is None else rows)


MEASUREMENTS = [
    _collective(
        "all-reduce 16 GiB, 8 GPUs, ring", "8x H200 (NVLink 4, NVSwitch; the DGX H100 "
        "preset), NCCL 2.27.7, NCCL_NVLS_ENABLE=0", STAS_NET + ", \"SHARP\"", 367.2,
        "GB/s busbw", "calibrate", lambda: busbw("DGX H100", "all_reduce", 16 * GIB, 8, "ring")),
    _collective(
        "all-reduce 8 GiB, 8 GPUs, NVLS", "8x H100 SXM, NCCL 2.18.5, NCCL_ALGO=NVLS, "
        "in place, fp32", AZURE_H100, 478.87, "GB/s busbw", "calibrate",
        lambda: busbw("DGX H100", "all_reduce", 8 * GIB, 8, "nvls")),
    _collective(
        "all-reduce, 32 GPUs in 4 nodes", "4 nodes x 8 H100 SXM, 8x 400 Gb/s InfiniBand "
        "per node, NCCL 2.24.3; peak busbw (simulated at 4 GiB)",
        "Voltage Park / Georgia Tech benchmark (aigatech/vpbenchmarking)", 330.93,
        "GB/s busbw", "calibrate", lambda: busbw("DGX H100", "all_reduce", 4 * GIB, 32)),
    _collective(
        "all-reduce 512 MiB, 16 GPUs in 2 nodes", "2 nodes x 8 H20 (NVLink 4), 8x NDR "
        "400 Gb/s per node, NCCL 2.21.5, NCCL's choice", NCCL_1244, 3219.0, "us",
        "calibrate", lambda: micros("DGX H100", "all_reduce", 512 * MIB, 16)),
    _azure("H100", "64 MiB", 64 * MIB, 361.78, "calibrate"),
    _azure("H100", "1 GiB", GIB, 466.35),
    _azure("H100", "256 MiB", 256 * MIB, 423.38),
    _azure("H100", "16 MiB", 16 * MIB, 234.45),
    _azure("H100", "4 MiB", 4 * MIB, 128.73),
    _azure("H100", "1 MiB", MIB, 43.70),
    _azure("H100", "512 KiB", 512 * 1024, 21.35),
    _azure("H100", "128 KiB", 128 * 1024, 5.40, "calibrate"),
    _azure(
        "H100", "64 KiB", 64 * 1024, 2.72, note="the one channel that works holds half "
        "of its 128 KiB round here, and the simulator charges half of the round's bytes; "
        "the run took the whole round's 42 us, as at 128 KiB, while 32 KiB and less took "
        "25.6 to 33.5 us: a step between 32 and 64 KiB that neither NCCL's model nor the "
        "simulator has"),
    _collective(
        "all-reduce 1 KiB, 8 GPUs, NVLS", "as the 8 GiB NVLS row; busbw 0.07 GB/s "
        "printed with 2 decimals: 24-27 us", AZURE_H100, 1024 * 1.75 / 0.07e9 * 1e6, "us",
        "validate", lambda: micros("DGX H100", "all_reduce", 1024, 8, "nvls")),
    _collective(
        "all-reduce 8 GiB, 6 of 8 GPUs", "8x H200 node, 6 GPUs, NCCL 2.27.7, NCCL's "
        "choice (NVLS)", STAS_NET + ", \"SHARP\"", 435.6, "GB/s busbw", "validate",
        lambda: busbw("DGX H100", "all_reduce", 8 * GIB, 6)),
    _collective(
        "all-gather 16 GiB, 8 GPUs", "8x H200, NCCL 2.27.7, NCCL's choice", STAS_NET
        + ", \"SHARP\"", 361.4, "GB/s busbw", "validate",
        lambda: busbw("DGX H100", "all_gather", 16 * GIB, 8)),
    _collective(
        "reduce-scatter 16 GiB, 8 GPUs", "8x H200, NCCL 2.27.7, NCCL's choice", STAS_NET
        + ", \"SHARP\"", 362.9, "GB/s busbw", "validate",
        lambda: busbw("DGX H100", "reduce_scatter", 16 * GIB, 8)),
    _collective(
        "all-reduce 8 GiB, 8 A100", "8x A100 SXM4 80GB (NVLink 3, NVSwitch), NCCL "
        "2.18.5, in place (NVLS requested, which A100 lacks)", AZURE_A100, 231.58,
        "GB/s busbw", "validate", lambda: busbw("DGX A100", "all_reduce", 8 * GIB, 8)),
    _collective(
        "all-reduce 1 KiB, 8 A100", "as the 8 GiB A100 row; busbw 0.04 GB/s: 40-51 us",
        AZURE_A100, 1024 * 1.75 / 0.04e9 * 1e6, "us", "validate",
        lambda: micros("DGX A100", "all_reduce", 1024, 8),
        "the page says NVLS, which A100s lack; NCCL 2.18.5 cannot run an all-reduce "
        "with NVLS alone there (its enqueue.cc stops with \"no algorithm/protocol "
        "available\"), so this run used NCCL's own choice, ring LL in NCCL's model, "
        "whose 15 us the simulator charges. The run took three times that, in a "
        "virtual machine on AMD EPYC hosts; a bare-metal figure would be the fair "
        "check"),
    _azure("A100", "256 MiB", 256 * MIB, 213.87),
    _azure(
        "A100", "16 MiB", 16 * MIB, 109.22, note="from 4 to 128 MiB this run took 1.3 to "
        "1.5 times the simulated time, which is NCCL's own model of its ring (LL128 "
        "here); from 256 MiB up the two agree within 8%, and below 256 KiB the run sits "
        "on the 45 us floor of the 1 KiB row. No bare-metal 8x A100 sweep was found to "
        "tell this machine from the model, so medium-sized ring all-reduces are the "
        "least checked part of the simulator"),
    _collective(
        "all-reduce 4 GiB, 32 GPUs in 4 nodes (RoCE)", "4 nodes x 8 H100, 8x 400 Gb "
        "RoCE per node, NCCL 2.19.3, 4-8 GB messages: about 320 GB/s",
        "NVIDIA/nccl issue 1221 (2024-03)", 320.0, "GB/s busbw", "validate",
        lambda: busbw("DGX H100", "all_reduce", 4 * GIB, 32)),
    _collective(
        "all-reduce across DGX A100 nodes", "DGX A100 nodes, 8x HDR 200 Gb/s each, "
        "large messages; node count and size not stated (simulated: 4 nodes, 4 GiB)",
        "NVIDIA/nccl issue 812 (NCCL team, 2023-03)", 192.0, "GB/s busbw", "validate",
        lambda: busbw("DGX A100", "all_reduce", 4 * GIB, 32)),
    _collective(
        "all-reduce 512 B, 16 GPUs in 2 nodes, NVLS tree", "as the 512 MiB row, "
        "NCCL_ALGO=NVLSTree", NCCL_1244, 46.5, "us", "validate",
        lambda: micros("DGX H100", "all_reduce", 512, 16, "nvls_tree")),
    _collective(
        "all-reduce 1 MiB, 16 GPUs in 2 nodes", "as the 512 MiB row", NCCL_1244, 121.8,
        "us", "validate", lambda: micros("DGX H100", "all_reduce", MIB, 16),
        "that cluster's times hardly grow from 1 MiB to 4 MiB (121.8 and 127.6 us), "
        "a floor that NCCL's model, which picks the NVLS tree here, does not have; the "
        "issue itself reports the cluster as slower than it should be (343 GB/s busbw "
        "at large sizes where 460 were expected), and its sweep is uneven (128 MiB took "
        "more than twice as long as 64 MiB), so these rows test the model against one "
        "cluster's troubles as much as against NCCL"),
    _collective(
        "all-reduce 64 MiB, 16 GPUs in 2 nodes", "as the 512 MiB row", NCCL_1244, 468.0,
        "us", "validate", lambda: micros("DGX H100", "all_reduce", 64 * MIB, 16)),
    _collective(
        "all-reduce 1 GiB, 4x RTX 4090 on PCIe", "4x RTX 4090, PCIe 4.0 x16, P2P on "
        "(patched driver), no NVLink", "tinygrad/open-gpu-kernel-modules issue 36",
        25.95, "GB/s busbw", "validate",
        lambda: busbw("4x RTX 4090", "all_reduce", GIB, 4)),
    _kernel(
        "bf16 matmul 2048 x 2048 x 13312, H100", "H100 SXM, torch.matmul, best shape of "
        "a search, torch 2.7", STAS_MAMF, 794.5, "TFLOP/s", "calibrate",
        lambda: matmul_tflops("H100 SXM", 2048, 2048, 13312)),
    _kernel(
        "fp16 matmul 8192^3, A100", "A100 SXM4 80GB, cuBLASLt, 10,000 warm-ups",
        AZURE_A100, 253.7, "TFLOP/s", "calibrate",
        lambda: matmul_tflops("A100 80GB", 8192, 8192, 8192)),
    _kernel(
        "fp16 matmul 1024^3, A100", "as above", AZURE_A100, 119.4, "TFLOP/s",
        "calibrate", lambda: matmul_tflops("A100 80GB", 1024, 1024, 1024)),
    _kernel(
        "fp16 matmul 2048^3, A100", "as above", AZURE_A100, 221.8, "TFLOP/s",
        "validate", lambda: matmul_tflops("A100 80GB", 2048, 2048, 2048)),
    _kernel(
        "fp16 matmul 4096^3, A100", "as above", AZURE_A100, 228.0, "TFLOP/s",
        "validate", lambda: matmul_tflops("A100 80GB", 4096, 4096, 4096)),
    _kernel(
        "fp16 matmul 1024 x 2145 x 1024, A100", "as above", AZURE_A100, 132.8,
        "TFLOP/s", "validate", lambda: matmul_tflops("A100 80GB", 1024, 2145, 1024),
        "the tile model takes the best tiling of the shape; cuBLAS's heuristic picked "
        "a slower one for this odd width"),
    _kernel(
        "bf16 matmul 1024 x 10240 x 5120, A100", "A100 SXM, torch.matmul, best shape "
        "of a search, torch 2.6", STAS_MAMF, 271.2, "TFLOP/s", "validate",
        lambda: matmul_tflops("A100 80GB", 1024, 10240, 5120)),
    _kernel(
        "STREAM triad, H100", "H100 SXM HBM3", AZURE_H100, 2.97, "TB/s", "calibrate",
        lambda: stream_tbps("H100 SXM", 3)),
    _kernel(
        "STREAM triad, A100", "A100 SXM4 80GB HBM2e", AZURE_A100, 1.70, "TB/s",
        "calibrate", lambda: stream_tbps("A100 80GB", 3)),
    _kernel(
        "STREAM copy, H100", "as above", AZURE_H100, 2.90, "TB/s", "validate",
        lambda: stream_tbps("H100 SXM", 2)),
    _kernel(
        "STREAM copy, A100", "as above", AZURE_A100, 1.61, "TB/s", "validate",
        lambda: stream_tbps("A100 80GB", 2)),
    _kernel(
        "FlashAttention-2, H100", "flash-attn benchmark, batch 2, 8192 tokens, head "
        "dim 128, 16 heads, not causal", AZURE_H100, 327.9, "TFLOP/s", "calibrate",
        lambda: attention_tflops("H100 SXM", 2, 16, 8192, 128, kernel="flash")),
    _kernel(
        "FlashAttention-2, A100", "as above, head dim 64, 32 heads", AZURE_A100, 179.5,
        "TFLOP/s", "calibrate",
        lambda: attention_tflops("A100 80GB", 2, 32, 8192, 64, kernel="flash")),
    _cudnn_frontend("cudnn", 8192, False, 563.7, "calibrate", config=(
        "cuDNN's fused attention, bf16, batch 2, 16 heads of 128, 8192 tokens, not causal")),
    _cudnn_frontend("flash", 8192, False, 316.6,
                    config="as the cuDNN row, torch's SDPA with its flash kernel"),
    _cudnn_frontend("cudnn", 8192, True, 490.3, "calibrate", config="as the cuDNN row, causal"),
    _cudnn_frontend("flash", 8192, True, 289.6, config="as the flash row, causal"),
    _cudnn_frontend("cudnn", 4096, False, 550.1),
    _cudnn_frontend("flash", 4096, False, 303.7),
    _cudnn_frontend("cudnn", 4096, True, 467.9),
    _cudnn_frontend("flash", 4096, True, 264.5),
    _cudnn_frontend("cudnn", 16384, True, 520.3),
    _cudnn_frontend("flash", 16384, True, 310.5),
    _kernel(
        "SDPA forward, H100", "torch SDPA, batch 128, 8 heads of 128, 8192 tokens, not "
        "causal, forward; its flash kernel (the figure is FlashAttention-2's: cuDNN's "
        "is twice it)", "pytorch/benchmark PR 2296 (tritonbench flash_attention)",
        287.696, "TFLOP/s", "validate",
        lambda: attention_tflops("H100 SXM", 128, 8, 8192, 128, forward_only=True,
                                 kernel="flash")),
    _kernel(
        "cuDNN attention forward, H100", "torch SDPA held to cuDNN 9.1.0's kernel, "
        "bf16, batch 1, 24 heads of 128, 4608 tokens, not causal, forward",
        TORCH_142132, 631.338, "TFLOP/s", "validate",
        lambda: attention_tflops("H100 SXM", 1, 24, 4608, 128, forward_only=True,
                                 kernel="cudnn")),
    _kernel(
        "SDPA forward, H100, torch 2.6's choice", "as the cuDNN row, torch's own "
        "choice of kernel (flash: torch 2.6 did not prefer cuDNN)", TORCH_142132,
        329.483, "TFLOP/s", "validate",
        lambda: attention_tflops("H100 SXM", 1, 24, 4608, 128, forward_only=True,
                                 kernel="flash")),
    _kernel(
        "bf16 matmul 4096^3, H100 (ours)", "torch.matmul, random inputs, CUDA events, "
        "mean of 20 after 5 warm-ups", COURSE_H100, 800, "TFLOP/s", "validate",
        lambda: matmul_tflops("H100 SXM", 4096, 4096, 4096)),
    _kernel(
        "bf16 matmul 8192^3, H100 (ours)", "as above", COURSE_H100, 799, "TFLOP/s",
        "validate", lambda: matmul_tflops("H100 SXM", 8192, 8192, 8192)),
    _kernel(
        "bf16 matmul 2048 x 2048 x 13312, H100 (ours)", "as above; the shape of the "
        "calibration row", COURSE_H100, 816, "TFLOP/s", "validate",
        lambda: matmul_tflops("H100 SXM", 2048, 2048, 13312)),
    _kernel(
        "copy 1 GiB device to device, H100 (ours)", "Tensor.copy_, bytes read and "
        "written", COURSE_H100, 3.01, "TB/s", "validate",
        lambda: stream_tbps("H100 SXM", 2, elements=2 ** 27)),
    _kernel(
        "SDPA forward + backward, H100 (ours)", "torch's scaled_dot_product_attention, "
        "bf16, the FlashAttention-2 row's shape (batch 2, 16 heads of 128, 8192 "
        "tokens, not causal); torch 2.11 on an H100 picks cuDNN's kernel (its wheel "
        "bundles cuDNN 9.19)", COURSE_H100, 595, "TFLOP/s", "validate",
        lambda: attention_tflops("H100 SXM", 2, 16, 8192, 128, kernel="cudnn")),
    _kernel(
        "host time of one small eager op (ours)", "x.add_(1) on a 1-element CUDA "
        "tensor, 2,000 times from Python, wall clock until issued", COURSE_H100,
        7.56, "us", "validate",
        lambda: DEVICES["H100 SXM"].achieved.host_s_per_op * 1e6),
] + gpu_surveys.MEASUREMENTS
