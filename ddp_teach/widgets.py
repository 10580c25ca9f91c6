"""`ddp_teach.widgets`: re-run an experiment from a control.

Why: the alpha-beta model says that an all-reduce costs a latency term that
grows with the number of ranks and a bandwidth term that grows with the
message size. A learner believes it after watching it happen on their own
machine: pick a rank count and a size, press run, and see the measured time
next to the model's prediction, each run added to one plot. The measuring
and the plotting are plain functions (`measure_allreduce`, `plot_runs`), so
that they can be called, and tested, without a browser; `allreduce_explorer`
only wires them to ipywidgets.
"""
import functools
import io
from typing import NamedTuple

import numpy as np
from matplotlib.figure import Figure

from ddp_teach import cost

KB = 1024


class Run(NamedTuple):
    world_size: int
    nbytes: int
    seconds: float  # measured: median of the repeats, slowest rank


def measure_allreduce(world_size: int, nbytes: int, repeats: int = 3) -> float:
    """Seconds one `dist.all_reduce` of `nbytes` (float32) takes on
    `world_size` real ranks: the median of `repeats` timed calls (after one
    warm-up), on the slowest rank."""
    sweep = cost.bandwidth_sweep(world_size, [nbytes], "all_reduce",
                                 iters=repeats, warmup=1)
    return sweep.rows[0].seconds


@functools.cache
def fitted_link() -> cost.Link:
    """A Link fitted to a quick all-reduce sweep on 2 ranks (4 KB to 4 MB),
    measured once per session."""
    return cost.bandwidth_sweep(2, iters=3, warmup=1).fit()


def _size(nbytes: float) -> str:
    return f"{nbytes / KB ** 2:g} MB" if nbytes >= KB ** 2 else f"{nbytes / KB:g} KB"


def describe_link(link: cost.Link) -> str:
    return (f"α = {link.alpha * 1e6:.1f} µs, "
            f"1/β = {link.bandwidth / cost.GB:.2f} GB/s")


def plot_runs(runs, link: cost.Link) -> Figure:
    """Measured all-reduce times (dots) against the ring model (lines), one
    colour per rank count; `runs` holds (world_size, nbytes, seconds)."""
    fig = Figure(figsize=(6, 3.4), layout="constrained")
    ax = fig.add_subplot()
    runs = [Run(*run) for run in runs]
    if runs:  # the model over every size measured, and a line even for one
        sizes = np.geomspace(min(run.nbytes for run in runs) / 2,
                             max(run.nbytes for run in runs) * 2, 50)
    for i, p in enumerate(sorted({run.world_size for run in runs})):
        mine = [run for run in runs if run.world_size == p]
        colour = f"C{i}"
        ax.plot([run.nbytes for run in mine], [run.seconds * 1e6 for run in mine],
                "o", color=colour, label=f"{p} ranks: measured")
        model = [cost.allreduce_time(n, p, link) * 1e6 for n in sizes]
        ax.plot(sizes, model, "-", color=colour, alpha=0.6,
                label=f"{p} ranks: ring model")
    ax.set(xscale="log", yscale="log", xlabel="message size (bytes)",
           ylabel="time per all_reduce (µs)",
           title=f"measured vs model ({describe_link(link)})")
    ax.title.set_fontsize(9)
    ax.grid(True, which="both", alpha=0.3)
    if runs:
        ax.legend(fontsize=7)
    return fig


def _png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def allreduce_explorer(world_sizes=(2, 3, 4), sizes_kb=(4, 64, 1024, 4096),
                       link: cost.Link | None = None):
    """A world-size dropdown, a message-size slider, a run button and an
    output area. Each press measures one all-reduce on real ranks, prints it
    next to the ring model's prediction (`link`, or when None a Link fitted
    once from a 2-rank sweep) and replots every run made so far. The runs
    are kept in the returned widget's `runs` list."""
    import ipywidgets as w
    from IPython.display import Image

    if not world_sizes or not sizes_kb:
        raise ValueError("world_sizes and sizes_kb must not be empty")
    ranks = w.Dropdown(options=list(world_sizes), description="ranks")
    size = w.SelectionSlider(options=[(_size(kb * KB), kb * KB) for kb in sizes_kb],
                             description="size")
    button = w.Button(description="run all_reduce", icon="play")
    out = w.Output()
    runs: list[Run] = []

    def on_click(_):
        button.disabled = True
        try:
            model = link if link is not None else fitted_link()
            p, nbytes = ranks.value, size.value
            seconds = measure_allreduce(p, nbytes)
            runs.append(Run(p, nbytes, seconds))
            predicted = cost.allreduce_time(nbytes, p, model)
            out.outputs = ()
            if link is None:
                out.append_stdout(f"model fitted on 2 ranks: {describe_link(model)}\n")
            ratio = f" (measured / model = {seconds / predicted:.2f})" \
                if predicted > 0 else ""
            out.append_stdout(
                f"all_reduce of {_size(nbytes)} on {p} ranks: measured "
                f"{seconds * 1e6:.1f} µs, ring model {predicted * 1e6:.1f} µs"
                f"{ratio}\n")
            out.append_display_data(Image(_png(plot_runs(runs, model))))
        except Exception as error:  # show it where the learner is looking
            out.append_stderr(f"{type(error).__name__}: {error}\n")
        finally:
            button.disabled = False

    button.on_click(on_click)
    box = w.VBox([w.HBox([ranks, size, button]), out])
    box.runs = runs
    return box
