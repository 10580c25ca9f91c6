"""ddp_teach: learn distributed data-parallel training by running it.

`run(fn, world_size)` runs a notebook-defined function on real worker
processes; `%load_ext ddp_teach` adds the `%%ddp -n N` cell magic;
`run(..., trace=True)` returns a `Timeline` of what every rank did, with
compute marked by `span` or `trace_layers`; `cost` holds the alpha-beta
model and bandwidth sweeps, `memory` the ZeRO memory calculator, `amp`
the loss scaler and 16-bit gradient hooks, `precision` the number formats,
`zero` ZeRO stages 1-3, `scripts` and `slurm` the way to torchrun and
clusters, `paramserver`, `pipeline` and `tensor_parallel` what lies beyond
data parallelism.
"""
from ddp_teach import (amp, checkpoint, collectives, cost, ddp, diagrams, dp,
                       exercises, memory, models, paramserver, pipeline,
                       precision, sampler, scripts, slurm, syncbn,
                       tensor_parallel, widgets, zero)
from ddp_teach.errors import WorkerError, WorkerTimeout
from ddp_teach.launcher import RunResult, run, shutdown
from ddp_teach.timeline import Timeline
from ddp_teach.tracing import span, trace_layers


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
    from ddp_teach.magic import register
    register(ipython)


__all__ = ["run", "RunResult", "WorkerError", "WorkerTimeout", "shutdown",
           "span", "trace_layers", "Timeline", "amp", "collectives", "cost", "ddp",
           "checkpoint", "diagrams", "dp", "exercises", "memory", "models",
           "paramserver", "pipeline", "precision", "sampler", "scripts",
           "slurm", "syncbn", "tensor_parallel", "widgets", "zero"]
