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

from ddp_teach import bandwidth, cost, memory

KB = 1024


class Run(NamedTuple):
    world_size: int
    nbytes: int
    seconds: float  # measured: median of the repeats, slowest rank


def measure_allreduce(world_size: int, nbytes: int, repeats: int = 3) -> float:
    """Seconds one `dist.all_reduce` of `nbytes` (float32) takes on
    `world_size` real ranks: the median of `repeats` timed calls (after one
    warm-up), on the slowest rank."""
    sweep = bandwidth.sweep(world_size, [nbytes], "all_reduce",
                            iters=repeats, warmup=1)
    return sweep.rows[0].seconds


@functools.cache
def fitted_link() -> cost.Link:
    """A Link fitted to a quick all-reduce sweep on 2 ranks (4 KB to 4 MB),
    measured once per session."""
    return bandwidth.sweep(2, iters=3, warmup=1).fit()


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


# ---- the ZeRO calculator -----------------------------------------------------
#
# Why: ZeRO's formulas are three lines, but what they mean only sinks in when
# you move the sliders: at 64 devices stage 1 already saves most of the memory
# of a 7.5B model, and only stage 3 keeps shrinking as devices are added. The
# arithmetic is `memory.zero_bytes_per_device`; `zero_breakdown` splits it
# into the three model states, `plot_zero_breakdown` draws them, and
# `zero_calculator` wires them to sliders.

PRECISIONS = {  # label: (param_bytes, grad_bytes, optimizer_bytes_per_param)
    "mixed-precision Adam (2 + 2 + 12)": (2, 2, 12),
    "fp32 AdamW (4 + 4 + 8)": (4, 4, 8),
}
MIXED_PRECISION = next(iter(PRECISIONS))
MODEL_SIZES = (("125M", 125e6), ("1.3B", 1.3e9), ("7.5B", 7.5e9), ("13B", 13e9),
               ("70B", 70e9), ("128B", 128e9), ("175B", 175e9), ("1T", 1e12))
CALCULATOR_WORLD_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
STATES = ("parameters", "gradients", "optimizer_state")
STATE_COLORS = {"parameters": "#3b6fb6", "gradients": "#e07b24",
                "optimizer_state": "#5a9e5a"}


def zero_breakdown(num_params, world_size, stage, precision=MIXED_PRECISION) -> dict:
    """Bytes per device of each model state under ZeRO `stage`:
    {"parameters", "gradients", "optimizer_state", "total"}. Stage s splits
    the first s of (optimizer state, gradients, parameters) over the
    devices; the total is `memory.zero_bytes_per_device`."""
    param_bytes, grad_bytes, optimizer_bytes = PRECISIONS[precision]
    total = memory.zero_bytes_per_device(num_params, world_size, stage,
                                         optimizer_bytes, param_bytes=param_bytes,
                                         grad_bytes=grad_bytes)
    split = {"optimizer_state": stage >= 1, "gradients": stage >= 2,
             "parameters": stage >= 3}
    per_param = {"parameters": param_bytes, "gradients": grad_bytes,
                 "optimizer_state": optimizer_bytes}
    sizes = {state: per_param[state] * num_params
             / (world_size if split[state] else 1) for state in STATES}
    sizes["total"] = total
    return sizes


def zero_summary(num_params, world_size, stage, precision=MIXED_PRECISION) -> str:
    """The calculator's text: each model state per device, the total against
    plain data parallelism, and the communication per step."""
    sizes = zero_breakdown(num_params, world_size, stage, precision)
    plain = zero_breakdown(num_params, world_size, 0, precision)["total"]
    fmt = memory.format_bytes
    volume = memory.zero_comm_volume(num_params, stage) / num_params
    lines = [f"Psi = {memory.format_count(num_params)} parameters, Nd = {world_size} devices, "
             f"stage {stage} ({memory.STAGE_NAMES[stage]}), {precision}:"]
    lines += [f"  {state.replace('_', ' '):<16}{fmt(sizes[state]):>12}"
              for state in STATES]
    lines.append(f"  {'total':<16}{fmt(sizes['total']):>12} per device "
                 f"({plain / sizes['total']:.1f}x less than plain DP's "
                 f"{fmt(plain)})")
    relative = "as much as" if volume == 2 else f"{volume / 2:g}x"
    lines.append(f"  communication: {volume:g} Psi per step ({relative} "
                 f"plain DP's 2 Psi)")
    return "\n".join(lines)


def plot_zero_breakdown(num_params, world_size, stage=None,
                        precision=MIXED_PRECISION, device_gb=80) -> Figure:
    """Model states per device for stages 0 to 3 at one world size, as
    stacked bars (parameters, gradients, optimizer state), `stage` outlined,
    and a dashed line at a device of `device_gb` GB."""
    fig = Figure(figsize=(7.5, 2.8), layout="constrained")
    ax = fig.add_subplot()
    stages = [0, 1, 2, 3]
    left = np.zeros(len(stages))
    for state in STATES:
        gigabytes = np.array([zero_breakdown(num_params, world_size, s, precision)[state]
                              for s in stages]) / 1e9
        ax.barh(stages, gigabytes, left=left, color=STATE_COLORS[state],
                label=state.replace("_", " "))
        left += gigabytes
    if stage is not None:
        ax.barh([stage], [left[stage]], fill=False, edgecolor="black", linewidth=2)
    ax.axvline(device_gb, color="0.3", linestyle="--", linewidth=1)
    ax.text(device_gb, len(stages) - 0.45, f" {device_gb} GB device", fontsize=8,
            va="bottom", color="0.3")
    ax.set_yticks(stages, [f"{s}: {memory.STAGE_NAMES[s]}" for s in stages])
    ax.set_ylim(len(stages) - 0.4, -0.6)  # stage 0 on top
    ax.set_xlim(0, max(left.max(), device_gb) * 1.08)
    ax.set_xlabel("GB per device")
    ax.set_title(f"Psi = {memory.format_count(num_params)}, Nd = {world_size}, {precision}",
                 fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1),
              frameon=False)
    return fig


def zero_calculator(num_params=7.5e9, world_size=64, stage=3,
                    precision=MIXED_PRECISION, device_gb=80):
    """Sliders for the parameter count and the number of devices, buttons
    for the ZeRO stage, a menu for the precision; every change rewrites the
    summary and redraws the bars. The initial state is drawn at once, so the
    widget shows something even before it is touched; outside a live
    notebook its plain-text form is the summary."""
    import ipywidgets as w
    from IPython.display import Image

    sizes = dict(MODEL_SIZES)
    if num_params not in sizes.values():
        sizes[memory.format_count(num_params)] = num_params
    size = w.SelectionSlider(options=sorted(sizes.items(), key=lambda kv: kv[1]),
                             value=num_params, description="parameters",
                             continuous_update=False)
    world_sizes = sorted(set(CALCULATOR_WORLD_SIZES) | {world_size})
    ranks = w.SelectionSlider(options=world_sizes, value=world_size,
                              description="devices", continuous_update=False)
    stages = w.ToggleButtons(options=[(f"{s}: {name}", s) for s, name in
                                      memory.STAGE_NAMES.items()], value=stage,
                             description="stage")
    stages.style.button_width = "110px"
    kind = w.Dropdown(options=list(PRECISIONS), value=precision,
                      description="precision", layout=w.Layout(width="360px"))
    out = w.Output()

    def current():
        return size.value, ranks.value, stages.value, kind.value

    def update(_change=None):
        out.outputs = ()
        try:
            out.append_stdout(zero_summary(*current()) + "\n")
            out.append_display_data(Image(_png(plot_zero_breakdown(
                *current(), device_gb=device_gb))))
        except Exception as error:  # show it where the learner is looking
            out.append_stderr(f"{type(error).__name__}: {error}\n")

    for control in (size, ranks, stages, kind):
        control.observe(update, names="value")
    update()
    box = _summary_box()([w.HBox([size, ranks]), stages, kind, out])
    box.summary = lambda: zero_summary(*current())
    return box


@functools.cache
def _summary_box():
    """A VBox whose plain-text form is its `summary()` (what a notebook saved
    without widget state, or a terminal, shows instead of the controls)."""
    import ipywidgets as w

    class SummaryBox(w.VBox):
        def _repr_mimebundle_(self, **kwargs):
            data = super()._repr_mimebundle_(**kwargs)
            data["text/plain"] = self.summary()
            return data

    return SummaryBox
