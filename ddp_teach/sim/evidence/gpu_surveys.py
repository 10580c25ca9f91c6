"""Benchmarks GPU owners ran on many GPUs: the GPUs learners have.

The cards a learner meets first are a T4 (Colab, Kaggle) or a gaming card
like the RTX 4090, not an H100, and fp32 products run on a GPU's CUDA cores,
not its tensor cores, at a fraction of their own. Two public surveys time
the same small programs on each GPU their owners have:

- square products (zzc0721/torch-performance-test-data: test.py, and
  database.md at commit 0785868; its issue 79 for one H100's figures size
  by size, fp32 with TF32 allowed among them): torch.mm of two random n x n matrices for n from 1,024 to
  10,240 (`SQUARE_SIZES`), 30 products after 6 warm-ups between
  two synchronizations, 2 n^3 FLOPs each, each GPU's best size in TFLOP/s.
  `best_square_tflops` runs that sweep on a simulated GPU. Issue 79's bf16
  and fp16 products at 1,024 are not kept: 30 products of a few
  microseconds each are timed by the wall clock, so they measure how fast
  the host issues them (12 us each on that H100, where a 4096^3 product
  takes 174 us);
- memory bandwidth (chsasank/device-benchmarks, benchmark.py and
  README.md at commit 02b8262): one Tensor.copy_ of 94,906,265 fp32
  elements (380 MB) between two synchronizations, bytes read and written
  over the wall clock. `copy_gbps` simulates it; the host's few
  microseconds around one copy of a millisecond or more are left out.

The rows are data (`ddp_teach/sim/evidence/gpu_surveys.toml`, with their
sources in the manifest). One machine's row of a GPU calibrates (`calibrated` names it); another
machine's row of the same GPU validates, so it checks how far one copy's
figure carries to the next, and the H100's size-by-size rows check the
tile model's shapes. The bandwidth rows only validate: the T4 and RTX 4090
take A100's share of their memory bandwidth, a stated assumption.
"""
from ddp_teach.sim.evidence.benchmark_figures import matmul_tflops, stream_tbps
from ddp_teach.sim.evidence import loader

SQUARE_SIZES = (1024, 2048, 4096, 8192, 10240)
COPY_ELEMENTS = 94_906_265  # int(2 ** 26.5): the largest copy of benchmark.py


def best_square_tflops(device: str, dtype: str) -> float:
    """The survey's figure for a simulated `device`: the best TFLOP/s of an
    n x n product over its sizes."""
    return max(matmul_tflops(device, n, n, n, dtype) for n in SQUARE_SIZES)


def copy_gbps(device: str) -> float:
    """GB/s of the bandwidth survey's copy on a simulated `device`."""
    return stream_tbps(device, 2, elements=COPY_ELEMENTS, element_bytes=4) * 1e3


MEASUREMENTS = loader.measurements(["gpu_surveys.toml"], {
    "best_square_tflops": best_square_tflops, "copy_gbps": copy_gbps,
    "matmul_tflops": matmul_tflops})
