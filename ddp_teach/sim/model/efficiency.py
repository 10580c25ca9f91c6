"""What a GPU reaches in practice, not its datasheet peak, per kind of kernel.

A roofline at datasheet peak (`hardware.Device.op_seconds`) is what a lesson
that counts FLOPs wants, and it is optimistic: large bf16 matrix products
reach about 80% of an H100's peak, a streaming kernel about 88% of its
memory bandwidth, fused attention about a third of peak, and a kernel
never takes less than a few microseconds. `Achieved` holds those fractions
for one GPU, each calibrated on one published measurement (the presets of
`ddp_teach.sim.model.calibrated` name theirs; `benchmarks/sim_vs_published.md`
shows them with the measurements they are checked against), and the
functions here use them:

- matrix products run in tiles, one tile per streaming multiprocessor
  (SM) at a time: a product of M x N takes ceil(tiles / SMs) "waves" of a
  tile's work, so a product whose tiles do not fill the last wave wastes
  the rest of it (tile and wave quantization, NVIDIA's "Matrix
  Multiplication Background User's Guide"). cuBLAS picks the tile shape;
  we take the one that gives the fewest tile-FLOPs per SM. Each SM runs at
  `matmul` x its share of the peak on the tensor cores; fp32 products run
  on the CUDA cores at `matmul_fp32` of the fp32 peak (nearly all of it on
  an A100, less on an H100), and a 16-bit type the GPU has no units for
  (bf16 on a T4 or a V100) at `calibrated.EMULATED` of that;
- convolutions (cuDNN) on the tensor cores at `conv` x peak (fp32 ones,
  which torch runs in TF32 on Ampere and later GPUs, at `conv_tf32` x the
  TF32 peak), and on the CUDA cores (fp32 where a GPU has no TF32 or it is
  turned off) at `conv_fp32` x the fp32 peak; cuDNN picks its fastest
  kernel, so that is the floor for every type the GPU has units for, and a
  16-bit type it has none for runs at `calibrated.EMULATED` of it;
- fused attention at the fraction
  of the kernel that runs it (below); everything else streams its bytes at
  `memory` x the memory bandwidth; whichever of arithmetic and bytes is
  longer wins, as in a roofline;
- every kernel costs at least `kernel_s` of GPU time (start-up and drain);
- `sustained`: in a training run, tensor-core kernels (16-bit and TF32
  products, convolutions and fused attention) reach only this fraction of
  the rates that short kernel benchmarks measure: under hours of full load
  the tensor cores drive the GPU to its power limit and its clock down,
  and a real model's shapes fall short of the benchmarked ones. It is
  solved from hours of MPT training on H100s and A100s. CUDA-core fp32
  work and memory-bound kernels keep their benchmarked rates (the clock
  hardly moves memory traffic): the course's own GPU-bound fp32 step on
  an H100 and an H200 (`capstone-ddp-step-width-2048-*-ours`) came out
  1.22-1.23 times too slow with the share on every kernel, 0.89-0.90 with
  it on the tensor cores alone. Kernel benchmarks are modelled with
  `burst=True`.

Fused attention: torch's `scaled_dot_product_attention` picks a kernel by
a fixed priority (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp).
Up to torch 2.10 that is FlashAttention-2 ("flash", `attention`) for 16-bit
inputs. From torch 2.11, whose wheels bundle cuDNN 9.19, torch puts cuDNN's
fused attention first on Hopper GPUs ("cudnn", `attention_cudnn`: the
function `check_prefer_cudnn_attention` there asks for sm90 or sm100 and
cuDNN newer than 9.15.1); on Ampere cuDNN is not preferred. The two differ
by 1.7 to 1.8 times on an H100. fp32 inputs run neither (torch uses its
memory-efficient kernel), and are charged at `attention` of the fp32 peak.
A causal mask halves the work (the FLOPs counted are halved too), but the
kernel does that half at `causal` of its full-mask rate: the tiles on the
diagonal are computed whole and then masked, and the query blocks near
the start of the sequence (block i sees i + 1 key blocks) have little
work to spread their fixed costs over. One fraction for every GPU and
kernel (a stated simplification: cuDNN keeps 85-94% from 4k to 64k
tokens, FlashAttention-2 87-100%).

The host side: an eager PyTorch program issues one kernel per operation
from Python, and each costs `host_s_per_op` of CPU time whatever its size
(dispatch and launch); a kernel starts when the host has issued it and
the stream is free (`ddp_teach.sim.runtime.recorder`), so a model of small layers
runs at the host's pace. And `overlap_slowdown`: compute that runs while a
collective does is that much slower, since NCCL's kernels take SMs and
memory bandwidth from it.
"""
import math
from dataclasses import dataclass

from ddp_teach.sim.model import calibrated

# tile shapes (rows x columns of the output) that cuBLAS's kernels use
TILES = ((256, 128), (128, 256), (256, 64), (64, 256), (128, 128), (128, 64),
         (64, 128))


ATTENTION_KERNELS = ("flash", "cudnn")
# A 16-bit product on a GPU with no units for its dtype (bf16 before Ampere:
# V100, T4) is converted and multiplied on the CUDA cores, at
# `calibrated.EMULATED` of the fp32 product's rate (the survey's T4: 2.46
# against 4.17 TFLOP/s; its other GPUs without bf16 units, from P100 to RTX
# 2080 and the T4 on Kaggle, 0.51 to 0.63; V100S 0.73). A causal mask keeps
# `calibrated.CAUSAL` of a fused attention kernel's full-mask rate (cuDNN 9.1,
# batch 2, 16 heads of 128, 8192 tokens, bf16, on an H200, H100's chip).
SIXTEEN_BIT = ("float16", "bfloat16")


@dataclass(frozen=True)
class Achieved:
    """Fractions of a device's peaks that real kernels reach (see the module's
    doc), GPU-side seconds per kernel, and host-side seconds per operation.
    attention: FlashAttention-2's fraction; attention_cudnn: cuDNN's fused
    attention, on GPUs where torch prefers it (None elsewhere); causal: the
    share of its full-mask rate a kernel keeps with a causal mask;
    matmul_fp32: the fraction fp32 products reach on the CUDA cores, which
    differs from the tensor cores' `matmul` (None: the same); conv_tf32: the
    fraction of the TF32 peak fp32 convolutions reach on the tensor cores
    (None: `conv`); conv_fp32: the fraction of the fp32 peak they reach on
    the CUDA cores (None: `conv`)."""
    sms: int
    matmul: float
    memory: float
    attention: float
    conv: float
    kernel_s: float
    host_s_per_op: float = calibrated.HOST_S_PER_OP
    overlap_slowdown: float = calibrated.OVERLAP_SLOWDOWN
    sustained: float = 1.0
    attention_cudnn: float | None = None
    causal: float = calibrated.CAUSAL
    matmul_fp32: float | None = None
    conv_tf32: float | None = None
    conv_fp32: float | None = None

    def __post_init__(self):
        if isinstance(self.sms, bool) or not isinstance(self.sms, int) or self.sms < 1:
            raise ValueError(f"sms must be an int >= 1; got {self.sms!r}")
        for name in ("matmul", "memory", "attention", "conv", "sustained", "causal"):
            value = getattr(self, name)
            if not (0 < value <= 1):
                raise ValueError(f"Achieved.{name} is a fraction of the peak, "
                                 f"in (0, 1]; got {value!r}")
        for name in ("attention_cudnn", "matmul_fp32", "conv_tf32", "conv_fp32"):
            value = getattr(self, name)
            if value is not None and not (0 < value <= 1):
                raise ValueError(f"Achieved.{name} is a fraction of the peak, in "
                                 f"(0, 1], or None; got {value!r}")
        for name in ("kernel_s", "host_s_per_op"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"Achieved.{name} must be >= 0 seconds; got {value!r}")
        if not (self.overlap_slowdown >= 1 and math.isfinite(self.overlap_slowdown)):
            raise ValueError("overlap_slowdown must be >= 1 (1: no slowdown); "
                             f"got {self.overlap_slowdown!r}")

    def attention_fraction(self, kernel: str, dtype: str, causal: bool = False) -> float:
        """The fraction of peak `kernel` reaches on `dtype` inputs (cuDNN's
        only for 16-bit ones, which are all it runs), with a causal mask or
        without."""
        sixteen_bit = dtype in ("float16", "bfloat16")
        fraction = self.attention_cudnn if kernel == "cudnn" and sixteen_bit \
            else self.attention
        return fraction * (self.causal if causal else 1.0)


def attention_kernel(achieved: Achieved | None, requested: str | None = None) -> str:
    """The fused-attention kernel charged on a GPU with `achieved` figures
    (None: it has none, so only "flash" means anything): `requested`
    ("flash" or "cudnn"), or None for the one torch 2.11 and later pick."""
    if requested is not None and requested not in ATTENTION_KERNELS:
        raise ValueError(f"unknown attention kernel {requested!r}; valid: "
                         f"{', '.join(ATTENTION_KERNELS)} (or None: torch's choice)")
    has_cudnn = achieved is not None and achieved.attention_cudnn is not None
    if requested is None:
        return "cudnn" if has_cudnn else "flash"
    if requested == "cudnn" and not has_cudnn:
        raise ValueError("torch does not run cuDNN's attention by default on this "
                         "GPU and the simulator has no figure for it; use "
                         "attention='flash' (or None)")
    return requested


def matmul_seconds(device, achieved: Achieved, m: int, n: int, k: int,
                   batch: int = 1, dtype: str = "float32", nbytes: float = 0,
                   burst: bool = False) -> float:
    """A (batch of) m x k by k x n product: the fewest waves of tiles, each
    SM at its share of the peak times `matmul` (tensor cores) or
    `matmul_fp32` (CUDA cores: fp32, and 16-bit types the GPU has no units
    for, at calibrated.EMULATED of that); or its bytes, if they take longer.
    burst: as a kernel benchmark runs it, else as a training run does."""
    if min(m, n, k, batch) <= 0:
        return achieved.kernel_s
    dtype = _on_device(device, dtype)
    fraction = achieved.matmul
    if dtype not in device.flops or dtype == "float32":  # on the CUDA cores
        fraction = achieved.matmul_fp32 or fraction
        if dtype in SIXTEEN_BIT:  # converted first: no units of its own
            fraction *= calibrated.EMULATED
    per_sm = _peak(device, dtype) * fraction / achieved.sms
    tile_flops = min(math.ceil(batch * math.ceil(m / tm) * math.ceil(n / tn)
                               / achieved.sms) * 2 * tm * tn * k for tm, tn in TILES)
    busy = max(tile_flops / per_sm, _streaming(device, achieved, nbytes))
    tensor_cores = dtype in device.flops and dtype != "float32"
    return achieved.kernel_s + busy / _sustained(achieved, burst, tensor_cores)


def rate_seconds(device, achieved: Achieved, kind: str, flops: float,
                 nbytes: float, dtype: str = "float32", burst: bool = False,
                 attention: str = "flash", causal: bool = False) -> float:
    """A convolution ("conv"), fused attention ("attention", run by the
    `attention` kernel, with a `causal` mask or without) or any other kernel
    ("memory"): its arithmetic at the kind's fraction of peak (full peak for
    "memory") or its bytes, whichever takes longer."""
    dtype = _on_device(device, dtype)
    if kind == "conv":
        rate, tensor_cores = _conv_rate(device, achieved, dtype)
    else:
        rate = _peak(device, dtype) * {"memory": 1.0, "attention": achieved.attention_fraction(
            attention, dtype, causal)}[kind]
        tensor_cores = kind == "attention" and dtype in SIXTEEN_BIT
    busy = max(flops / rate, _streaming(device, achieved, nbytes))
    return achieved.kernel_s + busy / _sustained(achieved, burst, tensor_cores)


def _sustained(achieved: Achieved, burst: bool, tensor_cores: bool) -> float:
    """What a kernel keeps of its benchmarked rate in a training run: the
    `sustained` share on the tensor cores, whose hours of full load drive
    the GPU to its power limit and its clock down; all of it on the CUDA
    cores and in memory-bound kernels, and in a benchmark's short burst."""
    return achieved.sustained if tensor_cores and not burst else 1.0


def attention_flops(batch: int, heads: int, queries: int, keys: int,
                    head_dim: int, causal: bool, backward: bool = False) -> float:
    """FLOPs of fused attention as FlashAttention-2's benchmark counts them
    (Dao, "FlashAttention-2", 2023): the two products QK^T and PV, 4 x B x
    H x Lq x Lk x d, halved with a causal mask; backward does 2.5 times the
    forward's (five products, the first one recomputed)."""
    forward = 4 * batch * heads * queries * keys * head_dim / (2 if causal else 1)
    return forward * (2.5 if backward else 1.0)


def overlapped_end(start: float, work: float, busy, slowdown: float) -> float:
    """When `work` seconds of compute begun at `start` end, each stretch of
    it that overlaps one of the `busy` (start, end) intervals of the
    communication channel (sorted, disjoint) running `slowdown` times slower."""
    t = start
    for begin, end in busy:
        if end <= t:
            continue
        if begin > t:
            step = min(work, begin - t)
            t, work = t + step, work - step
        if work <= 0:
            break
        step = min(work * slowdown, end - max(begin, t))
        t, work = t + step, work - step / slowdown
    return t + max(work, 0.0)


def _conv_rate(device, achieved: Achieved, dtype: str) -> float:
    """FLOP/s of a convolution in `dtype`. cuDNN picks the fastest kernel it
    has, so a convolution the tensor cores run (16-bit, TF32) is never
    slower than the CUDA cores' fp32 one (a gaming card's tensor cores are
    not far ahead of its CUDA cores); a 16-bit type the GPU has no units
    for is converted and computed on the CUDA cores, at calibrated.EMULATED of that."""
    cuda_cores = device.flops["float32"] * (achieved.conv_fp32 or achieved.conv)
    if dtype not in device.flops:
        return cuda_cores * (calibrated.EMULATED if dtype in SIXTEEN_BIT else 1.0), False
    if dtype == "float32":
        return cuda_cores, False
    share = (achieved.conv_tf32 if dtype == "tf32" else None) or achieved.conv
    tensor = device.flops[dtype] * share
    return max(tensor, cuda_cores), tensor >= cuda_cores


def _on_device(device, dtype: str) -> str:
    """`dtype`, or "float32" for "tf32" on a GPU without TF32 units (where
    torch computes fp32 in fp32)."""
    return "float32" if dtype == "tf32" and "tf32" not in device.flops else dtype


def _peak(device, dtype: str) -> float:
    return device.flops.get(dtype, device.flops["float32"])


def _streaming(device, achieved: Achieved, nbytes: float) -> float:
    return nbytes / (device.memory_bandwidth * achieved.memory)
