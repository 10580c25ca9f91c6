"""Published measurements of real GPUs, and the simulator's figure for each.

A simulator is worth what it agrees with. Each `Measurement` here is a
figure someone measured on real hardware and published (nccl-tests runs
by NCCL's maintainers and by cloud providers, matrix-product, memory and
attention benchmarks), with its configuration and source, and the
simulator's figure for the same configuration: collectives on a cluster
preset as NCCL would run them (`ddp_teach.sim.model.comm`), kernels at their
achieved rates (`ddp_teach.sim.model.efficiency`). `table()` sets the two side
by side.

The rows are data: `ddp_teach/sim/evidence/collectives.toml`,
`kernels.toml` and `gpu_surveys.toml` (the surveys GPU owners ran on the
GPUs learners have, simulated by `ddp_teach.sim.evidence.gpu_surveys`), read by
`evidence.loader` and simulated by the functions of `benchmark_figures`
that each row names. Each row is "calibrate" (a constant of
`ddp_teach.sim.model.calibrated` was solved from it, which names it by id) or
"validate" (no constant saw it), as `ddp_teach.sim.evidence.measurement` explains,
which also holds the tolerance every row is held to. Training runs
(ResNet-50, BERT, MPT, Llama) are `evidence/training.toml`, simulated by
the repository's `benchmarks/published_rows.py`, which adds them to these.
"""
from ddp_teach.sim.evidence import benchmark_figures, gpu_surveys, measurement
from ddp_teach.sim.evidence import loader

# the functions the rows of collectives.toml and kernels.toml name
SIMULATORS = {name: getattr(benchmark_figures, name) for name in (
    "busbw", "micros", "matmul_tflops", "stream_tbps", "attention_tflops",
    "host_us_per_op")}

COURSE_H100 = loader.source("course-h100")  # the course's own H100 measurements
# Notebook 10's DDP step on that H100, in seconds: the whole step (mean of 50
# after 10 warm-ups), and each phase with the GPU drained after it (the row
# capstone-ddp-step-width-64-1-h100-ours of training.toml). The simulator
# cannot reproduce this here (there is no GPU), so the figures are kept as
# measured.
_CAPSTONE = next(row for row in loader.rows("training.toml")
                 if row.id == "capstone-ddp-step-width-64-1-h100-ours")
CAPSTONE_STEP_H100 = {"step": _CAPSTONE.figure * 1e-3,
                      **{phase: ms * 1e-3 for phase, ms in _CAPSTONE.extra["phases_ms"].items()}}


def table(rows=None) -> list:
    """[(measurement, simulated, ratio)] for `rows` (default: every
    collective and kernel measurement here)."""
    return measurement.table(MEASUREMENTS if rows is None else rows)


MEASUREMENTS = loader.measurements(["collectives.toml", "kernels.toml"], SIMULATORS) \
    + gpu_surveys.MEASUREMENTS
