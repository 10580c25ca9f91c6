"""ddp_teach: learn distributed data-parallel training by running it.

`run(fn, world_size)` runs a notebook-defined function on real worker
processes; `%load_ext ddp_teach` adds the `%%ddp -n N` cell magic;
`run(..., trace=True)` returns a `Timeline` of what every rank did, with
compute marked by `span` or `trace_layers`.

The modules below are the course, one concept each, in the order the
notebooks teach them; `launcher/`, `tracing/`, `sim/` and `exercises/` are
the tooling that runs, draws, simulates and checks it, and a first reading
can skip them.
"""
# First of all: a torch and a Python the course knows, with a clear message
# where they are not, and torch 2.13's names on an older torch (compat.py).
from ddp_teach import compat
# The course, in notebook order: one module per concept.
from ddp_teach import collectives, cost, bandwidth, diagrams  # 01 collectives
from ddp_teach import dp                                     # 02 DataParallel
from ddp_teach import buckets, ddp                           # 03 DDP
from ddp_teach import sampler, syncbn                        # 04 data and sync
from ddp_teach import precision, amp                         # 05 mixed precision
from ddp_teach import memory, flat, zero, fsdp               # 06 sharding
from ddp_teach import scripts, slurm, checkpoint             # 07 at scale
from ddp_teach import llama, real_job                         # 08 the real job
from ddp_teach import paramserver, pipeline, tensor_parallel  # 09 beyond DP
from ddp_teach import dtensor_traffic                         # 09 beyond DP
from ddp_teach import debugging, diagnosis                   # 10 bugs
from ddp_teach import lm                                     # 11 capstone
from ddp_teach import models, system, widgets                # used throughout
# The tooling: running on ranks, timelines, checked exercises.
from ddp_teach import exercises, launcher, sim, tracing
from ddp_teach.launcher import (RunResult, WorkerError, WorkerTimeout, progress, run,
                                shutdown)
from ddp_teach.tracing import Timeline, span, trace_layers

def _show_figures_as_pictures() -> None:
    """In a notebook, make the matplotlib Figures this package returns show
    as pictures even where `%matplotlib inline` was never run (they are made
    without pyplot, which is what normally registers that display)."""
    try:
        from IPython import get_ipython
        from IPython.core.pylabtools import print_figure
        from matplotlib.figure import Figure
    except ImportError:  # no IPython or matplotlib: nothing to display with
        return
    shell = get_ipython()
    if shell is not None:
        shell.display_formatter.formatters["image/png"].for_type(
            Figure, lambda figure: print_figure(figure, "png"))


_show_figures_as_pictures()


def load_ipython_extension(ipython):
    """`%load_ext ddp_teach`: register the %%ddp cell magic."""
    from ddp_teach.launcher.magic import register
    register(ipython)


COURSE_MODULES = ("collectives", "cost", "bandwidth", "diagrams", "dp", "buckets", "ddp",
                  "sampler", "syncbn", "precision", "amp", "memory", "flat", "zero",
                  "fsdp", "scripts", "slurm", "checkpoint", "llama", "real_job",
                  "paramserver", "pipeline", "tensor_parallel", "dtensor_traffic",
                  "debugging", "diagnosis", "lm", "models", "system", "widgets")
TOOLING_PACKAGES = ("compat", "exercises", "launcher", "sim", "tracing")
__all__ = ["run", "RunResult", "WorkerError", "WorkerTimeout", "shutdown", "progress",
           "span", "trace_layers", "Timeline",
           *COURSE_MODULES, *TOOLING_PACKAGES]
