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

One machine's row of a GPU calibrates (`calibrated` names it); another
machine's row of the same GPU validates, so it checks how far one copy's
figure carries to the next, and the H100's size-by-size rows check the
tile model's shapes. The bandwidth rows only validate: the T4 and RTX 4090
take A100's share of their memory bandwidth, a stated assumption.
"""
from ddp_teach.sim.benchmark_figures import matmul_tflops, stream_tbps
from ddp_teach.sim.measurement import Measurement

SQUARE_SIZES = (1024, 2048, 4096, 8192, 10240)

SURVEY = "zzc0721/torch-performance-test-data, database.md (commit 0785868)"
SURVEY_79 = "zzc0721/torch-performance-test-data, issue 79 (2025-10; torch 2.7.0+cu128)"
BANDWIDTH = "chsasank/device-benchmarks, README.md (commit 02b8262)"
COPY_ELEMENTS = 94_906_265  # int(2 ** 26.5): the largest copy of benchmark.py
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "tf32": "tf32"}


def best_square_tflops(device: str, dtype: str) -> float:
    """The survey's figure for a simulated `device`: the best TFLOP/s of an
    n x n product over its sizes."""
    return max(matmul_tflops(device, n, n, n, dtype) for n in SQUARE_SIZES)


def copy_gbps(device: str) -> float:
    """GB/s of the bandwidth survey's copy on a simulated `device`."""
    return stream_tbps(device, 2, elements=COPY_ELEMENTS, element_bytes=4) * 1e3


def _copy(gpu, figure):
    return Measurement(
        "kernel", f"copy 380 MB, {gpu}", "Tensor.copy_ of 94,906,265 fp32 elements, "
        "bytes read and written", BANDWIDTH, figure, "GB/s", "validate",
        lambda: copy_gbps(gpu))


def _best(gpu, preset, dtype, machine, figure, role="validate"):
    """One GPU's best size, as the survey lists it; `gpu` names the machine
    where the survey has two of the kind."""
    return Measurement(
        "kernel", f"{dtype} square matmul, best size, {gpu}", f"{machine}; torch.mm of "
        "n x n, n = 1,024 to 10,240, the best n", SURVEY, figure, "TFLOP/s", role,
        lambda: best_square_tflops(preset, DTYPES[dtype]))


def _size(n, dtype, figure, note=""):
    """One size of the H100 of the survey's issue 79 (tf32: fp32 inputs with
    TF32 products allowed)."""
    allowed = ", fp32 with TF32 allowed" if dtype == "tf32" else ""
    return Measurement(
        "kernel", f"{dtype} matmul {n}^3, H100 (survey)", "H100 80GB HBM3 in a container, "
        f"torch.mm, 30 after 6 warm-ups{allowed}", SURVEY_79, figure, "TFLOP/s", "validate",
        lambda: matmul_tflops("H100 SXM", n, n, n, DTYPES[dtype]), note)


T4_COLAB, T4_KAGGLE = "T4 16GB on Google Colab, torch 2.8.0", "T4 16GB on Kaggle, torch 2.6.0"
RTX_A = "RTX 4090 24GB, bare metal, torch 2.4.0"
RTX_B = "another RTX 4090 24GB, bare metal, torch 2.4.1"
MEASUREMENTS = [
    _best("H100", "H100 SXM", "fp32", "H100 80GB HBM3, bare metal", 52.11, "calibrate"),
    _best("H100", "H100 SXM", "bf16", "as above", 783.66),
    _best("A100", "A100 80GB", "fp32", "A100 SXM4 80GB in a container, torch 2.8.0", 19.18,
          "calibrate"),
    _best("A100", "A100 80GB", "bf16", "as above", 264.53),
    _best("A800 (A100's chip)", "A100 80GB", "fp32", "A800 SXM4 80GB in a container, "
          "torch 2.8.0", 19.08),
    _best("T4 (Colab)", "T4", "fp16", T4_COLAB, 41.91, "calibrate"),
    _best("T4 (Colab)", "T4", "fp32", T4_COLAB, 4.17, "calibrate"),
    _best("T4 (Kaggle)", "T4", "fp16", T4_KAGGLE, 42.71),
    _best("T4 (Kaggle)", "T4", "fp32", T4_KAGGLE, 4.43),
    _best("T4 (Colab)", "T4", "bf16", T4_COLAB, 2.46, "calibrate"),  # no bf16 units: EMULATED
    _best("T4 (Kaggle)", "T4", "bf16", T4_KAGGLE, 2.27),
    _best("RTX 4090 (a)", "RTX 4090", "fp16", RTX_A, 165.08, "calibrate"),
    _best("RTX 4090 (a)", "RTX 4090", "fp32", RTX_A, 55.01, "calibrate"),
    _best("RTX 4090 (b)", "RTX 4090", "bf16", RTX_B, 173.31),
    _best("RTX 4090 (b)", "RTX 4090", "fp32", RTX_B, 54.77),
    _copy("T4", 240),
    _copy("RTX 4090", 912),
    _size(1024, "fp32", 37.39, note=(
        "a 1,024 x 1,024 output has too few tiles to fill 132 SMs evenly; the tile "
        "model takes the tiling that fills them best, cuBLAS's fp32 kernels did less well")),
    _size(2048, "fp32", 49.58),
    _size(2048, "bf16", 676.59),
    _size(2048, "tf32", 334.99),
    _size(4096, "tf32", 402.15),
    _size(8192, "tf32", 372.05),
    _size(10240, "bf16", 719.72, note=(
        "this H100 ran its largest product slower than 8,192^3 (720 against 798 TFLOP/s): "
        "a long product at full power lowers the clock, and a kernel benchmark here is "
        "simulated without that (`sustained` discounts training runs only)")),
]
