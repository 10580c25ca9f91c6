"""The simulated GPUs' achieved fractions (`efficiency.Achieved`), each solved
from one published measurement, named below with its source.

A fraction solved from a measurement reproduces it by construction; what
tells whether it can be trusted is every other measurement it was not
solved from, which `ddp_teach.sim.published` and the repository's
`benchmarks/sim_vs_published.md` set beside the simulator.

The repository's `tools/calibrate.py` solves each fraction here again from
its rows (`--check` fails when a stored one differs beyond rounding to the
figures it is written with). Most are roots of the simulated figure, rounded
to three figures; `memory`, `attention` and `attention_cudnn` are written as
closed forms (the row's figure over the datasheet peak), which leave out
each kernel's fixed cost, so their rows come back 0.03-0.2% low; A100's
`matmul` and `KERNEL_S` come from two rows together (8192^3 and 1024^3),
KERNEL_S rounded first and `matmul` solved again with it.
"""
from dataclasses import replace

from ddp_teach.sim.efficiency import Achieved

# Each fraction is solved from ONE published measurement
# (benchmarks/sim_vs_published.md lists them as "calibrate" rows):
# - matmul: H100, torch.matmul bf16 2048 x 2048 x 13312 at 794.5 TFLOP/s
#   (stas00/ml-engineering, compute/accelerator, "Maximum Achievable Matmul
#   FLOPS"); A100, cuBLASLt fp16 8192^3 at 253.7 TFLOP/s (Azure/AI-
#   benchmarking-guide, ND A100 v4 results);
# - kernel_s: A100 cuBLASLt fp16 1024^3 at 119.4 TFLOP/s (same page), with
#   `efficiency`'s tile model; the same on every GPU;
# - memory: STREAM triad on the HBM, 2.97 TB/s on H100 and 1.70 TB/s on
#   A100 (Azure/AI-benchmarking-guide, ND H100 v5 and ND A100 v4 results);
# - attention: FlashAttention-2's benchmark, batch 2, 8192 tokens, not
#   causal: 327.9 TFLOP/s on H100 (head dim 128), 179.5 on A100 (head dim
#   64) (same pages);
# - attention_cudnn: cuDNN 9.1's fused attention forward and backward, the
#   FlashAttention-2 row's shape (batch 2, 16 heads of 128, 8192 tokens, not
#   causal): 563.7 TFLOP/s on an H200, H100's chip, clocks locked at 1980
#   MHz (NVIDIA/cudnn-frontend, benchmark/benchmark_results.csv); forward
#   and backward, as the FlashAttention-2 figure is, since training runs both;
# - causal: the same benchmark with a causal mask (`efficiency.CAUSAL`);
# - sustained: llm-foundry's MPT-7B training with FSDP, 2,048 tokens, no
#   activation checkpointing: 10,643 tokens/s per GPU on 8x H100 80GB
#   (micro-batch 6) and 4,641 on 8x A100 80GB (micro-batch 6, 2 micro-
#   steps per step) (mosaicml/llm-foundry, scripts/train/benchmarking/
#   README.md), simulated with FSDP2's schedule (`predict.fsdp2`) and its
#   causal attention at `causal` of FlashAttention-2's rate;
# - conv: ResNet-50 v1.5 training with AMP, batch 256, one A100 80GB, 2,470
#   images/s (NVIDIA DeepLearningExamples, PyTorch ConvNets README), with
#   A100's sustained fraction above;
# - host_s_per_op: about 7 us of wall-clock per eager elementwise op on a
#   tiny CUDA tensor (flagos-ai/FlagGems issue 4812, "~7 us eager" for
#   sigmoid, relu, abs, silu, gelu); the same on every machine;
# - overlap_slowdown: compute overlapped with communication runs 18.9%
#   slower on average on A100 and H100 (Lee et al., "Characterizing
#   Compute-Communication Overlap in GPU-Accelerated Distributed Deep
#   Learning", arXiv 2507.03114, 2025).
# - matmul_fp32, and T4's and RTX 4090's matmul: the best TFLOP/s of
#   torch.mm on square matrices of 1,024 to 10,240 (`gpu_surveys.SQUARE_SIZES`), 30 after
#   6 warm-ups (zzc0721/torch-performance-test-data, database.md, commit
#   0785868): fp32 52.11 on an H100 80GB HBM3 (bare metal) and 19.18 on an
#   A100 SXM4 80GB; a T4 on Colab, 41.91 fp16 and 4.17 fp32 (a 70 W card:
#   its clock falls well below the boost clock its peaks assume); an RTX
#   4090 on bare metal, 165.08 fp16 and 55.01 fp32 (a GeForce card runs
#   above its datasheet's boost clock, so its 16-bit products reach the
#   whole tensor-core peak);
# - conv_tf32: ResNet-50 v1.5 training in fp32 (TF32 convolutions, torch's
#   default; NCHW, as only the README's AMP runs set channels-last), batch
#   256, one A100 80GB, 938 images/s (the same README), with A100's
#   sustained fraction; a TF32 product takes the tensor cores' `matmul`,
#   which an H100's TF32 products check (`gpu_surveys`);
# - conv_fp32: ResNet-50 v1.5 training in fp32 on one V100 16GB (no TF32:
#   the convolutions run on the CUDA cores), batch 112, NCHW, 367 images/s
#   (the same README), with the V100's other fractions (A100's, below). The
#   share is counted against the FLOPs of a direct convolution; cuDNN runs
#   many 3x3 fp32 convolutions with Winograd's algorithm, which does fewer
#   multiplications, so the counted share can come near 1. One share for
#   every GPU, a stated assumption: with it the T4's inference rows (same
#   README) come within the tolerance, the V100's own inference rows do not
#   (a fifth slow; the rows say why).
# H100's conv and conv_tf32 are A100's (no H100 convolution run was used;
# no RTX 4090 one either: its convolution shares are A100's too).
# V100, T4 and RTX 4090 take A100's other fractions with their own SM
# counts (datasheets: 80, 40 and 128 SMs), a stated assumption that the
# ResNet-50 rows of V100 and T4 check (V100: training within the
# tolerance, inference a fifth slow; T4: inference within it); V100's fp32
# products take A100's tensor-core fraction (the survey's V100S, a PCIe
# card without a preset here, reaches 0.83 of its fp32 peak).
KERNEL_S = 3.74e-6
CONV_FP32 = 0.943
ACHIEVED = {
    "H100 SXM": Achieved(sms=132, matmul=0.851, memory=2.97e12 / 3.35e12,
                         attention=327.9 / 989.4, conv=0.436, kernel_s=KERNEL_S,
                         sustained=0.719, attention_cudnn=563.7 / 989.4,
                         matmul_fp32=0.779, conv_tf32=0.258, conv_fp32=CONV_FP32),
    "A100 80GB": Achieved(sms=108, matmul=0.815, memory=1.70e12 / 2.039e12,
                          attention=179.5 / 312, conv=0.436, kernel_s=KERNEL_S,
                          sustained=0.888, matmul_fp32=0.986, conv_tf32=0.258,
                          conv_fp32=CONV_FP32),
}
ACHIEVED["V100 SXM2"] = replace(ACHIEVED["A100 80GB"], sms=80, matmul_fp32=None)
ACHIEVED["T4"] = replace(ACHIEVED["A100 80GB"], sms=40, matmul=0.645, matmul_fp32=0.515)
ACHIEVED["RTX 4090"] = replace(ACHIEVED["A100 80GB"], sms=128, matmul=1.0,
                               matmul_fp32=0.666)
