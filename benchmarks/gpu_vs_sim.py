"""The GPUs at hand against the simulator: the course's own real numbers.

`benchmarks/sim_vs_published.md` sets the simulator beside measurements
others published. This script measures the GPUs of the machine it runs on
and sets each figure beside what the simulator predicts for the same GPU
(its preset, picked from the GPU's name):

- a bf16 (fp16 where bf16 is missing) matrix product of three shapes, an
  fp32 one (CUDA cores, not tensor cores), a 1 GiB device-to-device copy, and fused attention forward and backward
  with each kernel the simulator knows for the GPU (FlashAttention-2, and
  cuDNN's where torch prefers it), each timed with CUDA events; the
  simulator's achieved-rate model (`ddp_teach.sim.model.efficiency`, as
  `ddp_teach.sim.evidence.benchmark_figures` gives it);
- the host time of one small eager operation (the simulator's
  `host_s_per_op`);
- ResNet-50 training (AMP, SGD with momentum) on one GPU, and with DDP over
  every GPU through `dt.run` (the course's launcher, whose "auto" backend is
  nccl for CUDA tensors): the nccl path's first run; the simulator's
  `predict.profile` + `predict.bucketed_ddp` on meta tensors;
- the capstone's DDP step (notebook 10: TinyGPT, fp32, AdamW) on one GPU
  through `dt.run`, against `dt.sim.one_rank` on the same preset: a step so
  small that the host's time per operation sets it; and its profile (the
  GPU's busy time, and the kernels and operations issued per step), which
  tells the host's share of the step from the GPU's; at width 2048, where
  the GPU sets the pace, its busy time again, against the simulated
  kernels' (fp32 products on the CUDA cores at their achieved rate);
- with two GPUs or more, an all-reduce sweep (`dt.bandwidth.sweep`, nccl)
  against the cluster preset's NCCL model (`ddp_teach.sim.model.comm`).

Run on a GPU machine: `make bench-gpu` (a few minutes). Writes
benchmarks/gpu_vs_sim.md. Without CUDA it says so and exits 1.
`python benchmarks/gpu_vs_sim.py --dry-run "NVIDIA H100 80GB HBM3" 2` prints
the simulated column alone, for that GPU name and GPU count.
"""
import datetime
import os
import platform
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import ddp_teach as dt  # noqa: E402
from ddp_teach.sim import DEVICES  # noqa: E402
from ddp_teach.sim.evidence import benchmark_figures
from ddp_teach.sim.model import efficiency
from ddp_teach.sim.model.simulation import Simulation  # noqa: E402
from capstone_step import (capstone_profile, capstone_step, simulated_capstone,  # noqa: E402
                           simulated_phases)
from published_runs import resnet50_images_per_s  # noqa: E402
import gpu_timing as timing  # noqa: E402

MATMULS = ((4096, 4096, 4096), (8192, 8192, 8192), (2048, 2048, 13312))
FP32_MATMUL = (8192, 8192, 8192)  # on the CUDA cores: `Achieved.matmul_fp32`
COPY_BYTES = 2 ** 30
ATTENTION = (2, 16, 8192, 128)  # batch, heads, tokens, head dim (as published rows)
CAPSTONE_ROW = "capstone DDP step (notebook 10's TinyGPT, fp32, AdamW), 1 GPU"
# the same step at larger widths, (width, heads): where the GPU, not the host,
# sets the pace
WIDER = ((512, 8), (2048, 32))


def wider_row(width: int) -> str:
    return f"the capstone's step at width {width}, 1 GPU"


def busy_wide_row() -> str:
    """The row of the widest step's GPU busy time (profiled there too)."""
    return f"the capstone's GPU busy time per step at width {WIDER[-1][0]} (profiled)"


def fp32_row() -> str:
    m, n, k = FP32_MATMUL
    return f"float32 matmul {m} x {n} x {k} (CUDA cores)"


def attention_row(dtype: str, kernel: str) -> str:
    return f"{dtype} attention, forward and backward, {kernel} kernel"


def attention_kernels(device: str) -> tuple:
    """The attention kernels the simulator has figures for on `device`."""
    return ("flash",) + (("cudnn",) if DEVICES[device].achieved.attention_cudnn else ())


def phase_row(phase: str) -> str:
    return f"the capstone's {phase}, GPU drained after each phase"


BUSY_ROW = "the capstone's GPU busy time per step (profiled: its kernels' union)"
# a host-bound step's time over the ATen operations its host issued: what the
# host spends per operation in a real training step, beside the simulator's charge
HOST_STEP_ROW = "the capstone's step time per ATen operation it issues (host-bound)"
# measured only, with their units: what the profile counts per step
PROFILE_COUNTS = {"kernels": ("kernels the capstone's step runs on the GPU", "per step"),
                  "aten_ops": ("ATen operations its host issues (outermost ones)",
                               "per step")}

SWEEP_BYTES = [2 ** k for k in (10, 14, 17, 20, 23, 26, 28)]
# (words in the GPU's name, device preset, cluster preset or None, a caveat)
PRESETS = (
    (("h100", "pcie"), "H100 SXM", None, "an H100 PCIe card, simulated as the SXM part"),
    (("h100",), "H100 SXM", "DGX H100", ""),
    (("h200",), "H200 SXM", "DGX H200", ""),
    (("a100", "pcie"), "A100 80GB", None, "an A100 PCIe card, simulated as the SXM part"),
    (("a100",), "A100 80GB", "DGX A100", ""),
    (("t4",), "T4", "2x T4 (Kaggle)", ""),
    (("4090",), "RTX 4090", "4x RTX 4090", ""),
    (("v100",), "V100 SXM2", None, ""),
)


def preset_for(gpu_name: str):
    """(device preset, cluster preset or None, caveat) for a CUDA device
    name such as "NVIDIA H100 80GB HBM3", or None when none fits."""
    name = gpu_name.lower()
    for words, device, cluster, caveat in PRESETS:
        if all(word in name for word in words):
            return device, cluster, caveat
    return None


def dtype_for(device: str) -> str:
    """bf16 where the GPU has it (Ampere and later), else fp16."""
    return "bfloat16" if "bfloat16" in DEVICES[device].flops else "float16"


def host_step_row(measured_rows: dict) -> dict:
    """{HOST_STEP_ROW: microseconds} from the measured step (ms) and the ATen
    operations its profile counted, or {} without both."""
    ops = measured_rows.get(PROFILE_COUNTS["aten_ops"][0])
    step_ms = measured_rows.get(CAPSTONE_ROW)
    return {HOST_STEP_ROW: step_ms * 1e3 / ops} if ops and step_ms else {}


# ---- what the simulator predicts ----------------------------------------------

FP32_PRECISIONS = {"tf32": "fp32, TF32 convolutions (torch's default)",
                   "fp32": "fp32, TF32 off"}


def fp32_resnet_row(precision: str, batch: int) -> str:
    return f"ResNet-50 {FP32_PRECISIONS[precision]}, batch {batch}, 1 GPU"


def ddp_row(batch: int, gpus: int) -> str:
    return f"ResNet-50 AMP, batch {batch}, DDP on {gpus} GPU(s) through dt.run (nccl)"


def simulated(device: str, cluster, gpus: int, batch: int) -> dict:
    """{row name: (simulated value, unit)} for `gpus` GPUs of preset `device`."""
    d, dtype = DEVICES[device], dtype_for(device)
    rows = {}
    for m, n, k in MATMULS:
        rows[f"{dtype} matmul {m} x {n} x {k}"] = (
            benchmark_figures.matmul_tflops(device, m, n, k, dtype), "TFLOP/s")
    rows[fp32_row()] = (benchmark_figures.matmul_tflops(device, *FP32_MATMUL, "float32"),
                        "TFLOP/s")
    rows["copy 1 GiB, device to device"] = (2 * COPY_BYTES / efficiency.rate_seconds(
        d, d.achieved, "memory", 0, 2 * COPY_BYTES, burst=True) / 1e12, "TB/s")
    for kernel in attention_kernels(device):
        rows[attention_row(dtype, kernel)] = (benchmark_figures.attention_tflops(
            device, *ATTENTION, kernel=kernel, dtype=dtype), "TFLOP/s")
    rows["host time of one small eager operation"] = (d.achieved.host_s_per_op * 1e6, "us")
    rows[f"ResNet-50 AMP, batch {batch}, 1 GPU"] = (
        resnet50_images_per_s(device, cluster, 1, batch), "images/s")
    for precision in FP32_PRECISIONS:
        torch.backends.cudnn.allow_tf32 = precision == "tf32"  # the simulator reads it
        try:
            rows[fp32_resnet_row(precision, batch)] = (resnet50_images_per_s(
                device, cluster, 1, batch, torch.float32), "images/s")
        finally:
            torch.backends.cudnn.allow_tf32 = True
    if gpus == 1 or cluster is not None:
        rows[ddp_row(batch, gpus)] = (
            resnet50_images_per_s(device, cluster, gpus, batch), "images/s")
    simulation = Simulation(device, cluster=cluster) if cluster else Simulation(device)
    step = simulated_capstone(simulation)
    rows[CAPSTONE_ROW] = (step.summary()[0]["span_s"] * 1e3, "ms")
    rows[BUSY_ROW] = (step.summary()[0]["compute_s"] * 1e3, "ms")
    rows[HOST_STEP_ROW] = (d.achieved.host_s_per_op * 1e6, "us")
    for phase, seconds in simulated_phases(step).items():
        rows[phase_row(phase)] = (seconds * 1e3, "ms")
    for width, heads in WIDER:
        wide = simulated_capstone(simulation, width, heads).summary()[0]
        rows[wider_row(width)] = (wide["span_s"] * 1e3, "ms")
        if (width, heads) == WIDER[-1]:
            rows[busy_wide_row()] = (wide["compute_s"] * 1e3, "ms")
    if gpus > 1 and cluster is not None:
        sim = Simulation(device, cluster=cluster, compute="peak")
        for nbytes in SWEEP_BYTES:
            rows[f"all-reduce {dt.memory.format_bytes(nbytes)}, {gpus} GPUs"] = (
                sim.collective_seconds("all_reduce", nbytes, gpus) * 1e6, "us")
    return rows


# ---- what the GPUs do (timed by gpu_timing.py) -----------------------------------

def measure_kernels(dtype: str) -> dict:
    rows = {f"{dtype} matmul {m} x {n} x {k}": timing.matmul_tflops(m, n, k, dtype)
            for m, n, k in MATMULS}
    rows[fp32_row()] = timing.matmul_tflops(*FP32_MATMUL, "float32")
    rows["copy 1 GiB, device to device"] = timing.copy_tbps(COPY_BYTES)
    return rows


def measured(device: str, gpus: int, batch: int, failures: list) -> dict:
    """{row name: measured value}; a part that fails is named in `failures`
    (with its error) and the others still run."""
    rows = {}

    def attempt(what, fn):
        try:
            fn()
        except Exception as error:  # reported in the table and the exit status
            failures.append(f"{what}: {type(error).__name__}: {error}")

    attempt("kernels", lambda: rows.update(measure_kernels(dtype_for(device))))
    for kernel in attention_kernels(device):
        attempt(f"attention, {kernel} kernel", lambda kernel=kernel: rows.__setitem__(
            attention_row(dtype_for(device), kernel), timing.attention_tflops(
                ATTENTION, dtype_for(device), kernel)))
    attempt("host", lambda: rows.__setitem__(
        "host time of one small eager operation", timing.host_seconds_per_op() * 1e6))
    attempt("ResNet-50 on 1 GPU", lambda: rows.__setitem__(
        f"ResNet-50 AMP, batch {batch}, 1 GPU", timing.resnet50_rate(0, 1, batch, ddp=False)))
    for precision in FP32_PRECISIONS:
        attempt(f"ResNet-50 in {precision}", lambda precision=precision: rows.__setitem__(
            fp32_resnet_row(precision, batch), timing.resnet50_rate(
                0, 1, batch, ddp=False, precision=precision)))
    attempt("ResNet-50 with DDP through dt.run", lambda: rows.__setitem__(
        ddp_row(batch, gpus), sum(dt.run(timing.resnet50_rate, gpus, args=(batch,),
                                         timeout=300)) / gpus))
    attempt("capstone step through dt.run", lambda: rows.__setitem__(
        CAPSTONE_ROW, dt.run(capstone_step, 1, args=("cuda", 50, 10),
                             timeout=300)[0] * 1e3))

    def phases():
        (spent,) = dt.run(capstone_step, 1, args=("cuda", 50, 10),
                          kwargs={"phases": True}, timeout=300)
        rows.update({phase_row(phase): s * 1e3 for phase, s in spent.items()})
    attempt("capstone phases through dt.run", phases)

    def profiled():
        (counts,) = dt.run(capstone_profile, 1, args=("cuda",), timeout=300)
        rows[BUSY_ROW] = counts["gpu_busy_s"] * 1e3
        rows.update({PROFILE_COUNTS[key][0]: counts[key] for key in PROFILE_COUNTS})
    attempt("capstone profile through dt.run", profiled)

    def profiled_wide():
        width, heads = WIDER[-1]
        (counts,) = dt.run(capstone_profile, 1, args=("cuda",),
                           kwargs={"width": width, "heads": heads}, timeout=300)
        rows[busy_wide_row()] = counts["gpu_busy_s"] * 1e3
    attempt("capstone profile at the widest width", profiled_wide)
    rows.update(host_step_row(rows))
    for width, heads in WIDER:
        attempt(f"capstone step at width {width}", lambda w=width, h=heads: rows.__setitem__(
            wider_row(w), dt.run(capstone_step, 1, args=("cuda", 20, 5),
                                 kwargs={"width": w, "heads": h}, timeout=300)[0] * 1e3))
    if gpus > 1:
        def sweep():  # sizes rounded to whole elements per rank: named as asked
            swept = dt.bandwidth.sweep(gpus, SWEEP_BYTES, iters=20, warmup=5,
                                       timeout=300)
            for nbytes, row in zip(SWEEP_BYTES, swept.rows):
                rows[f"all-reduce {dt.memory.format_bytes(nbytes)}, {gpus} GPUs"] = \
                    row.seconds * 1e6
        attempt("all-reduce sweep", sweep)
    return rows


# ---- the report -----------------------------------------------------------------

def _nccl_version() -> str:
    version = torch.cuda.nccl.version()  # a tuple, or an int on older torch
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def report(gpu_name, gpus, preset, simulated_rows, measured_rows, failures, took_s,
           dry=False):
    device, cluster, caveat = preset
    machine = (f"a dry run (simulated column only) for {gpus} x {gpu_name}" if dry else
               f"{gpus} x {gpu_name}; torch {torch.__version__}, CUDA "
               f"{torch.version.cuda}, NCCL {_nccl_version()}")
    lines = [
        "# The GPUs at hand against the simulator",
        "",
        f"Date: {datetime.date.today()}. {machine}; {platform.platform()}.",
        "",
        f"Simulated as `{device}`" + (f" in `{cluster}` nodes" if cluster else "")
        + (f" ({caveat})" if caveat else "") + ". Ratio = simulated / measured, "
        "in the row's unit (a rate or a time).",
        "",
        "| measurement | measured | simulated | unit | ratio |",
        "|---|---|---|---|---|",
    ]
    for what, (value, unit) in simulated_rows.items():
        real = measured_rows.get(what)
        lines.append(f"| {what} | {'-' if real is None else f'{real:,.3g}'} | "
                     f"{value:,.3g} | {unit} | "
                     f"{'-' if real is None else f'{value / real:.3f}'} |")
    for what, unit in PROFILE_COUNTS.values():  # measured only
        if what in measured_rows:
            lines.append(f"| {what} | {measured_rows[what]:,.3g} | - | {unit} | - |")
    lines += ["", "## Failed parts", ""] + [f"- {f}" for f in failures or ["none"]]
    lines += ["", f"Benchmark wall time: {took_s:.0f} s.", ""]
    return "\n".join(lines)


def main(argv) -> int:
    started = time.perf_counter()
    dry = argv[:1] == ["--dry-run"]
    if dry:
        name, gpus = argv[1], int(argv[2]) if len(argv) > 2 else 1
    elif not torch.cuda.is_available():
        print("no CUDA GPU here: run this on a GPU machine (make bench-gpu), or "
              "`--dry-run NAME [GPUS]` for the simulated column alone")
        return 1
    else:
        name, gpus = torch.cuda.get_device_name(0), torch.cuda.device_count()
    preset = preset_for(name)
    if preset is None:
        print(f"no simulator preset for {name!r}: the presets are "
              f"{', '.join(DEVICES)}; add one to PRESETS to compare")
        return 1
    device, cluster, _ = preset
    batch = 256 if DEVICES[device].memory_bytes >= 40e9 else 128
    simulated_rows = simulated(device, cluster, gpus, batch)
    failures = []
    measured_rows = {} if dry else measured(device, gpus, batch, failures)
    text = report(name, gpus, preset, simulated_rows, measured_rows, failures,
                  time.perf_counter() - started, dry)
    if not dry:
        with open(os.path.join(HERE, "gpu_vs_sim.md"), "w") as f:
            f.write(text)
    print(text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
