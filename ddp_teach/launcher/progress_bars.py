"""Live progress of a long run: one bar per rank in the cell.

A training loop inside `dt.run` is invisible until it returns. Calling
`dt.progress(step, total, loss=...)` in the loop makes it visible:

- in a worker of `dt.run`, it writes one marked line to stdout, at most ten
  times a second (and always for the last step), so its cost on a step is a
  clock read; the kernel's output router takes marked lines out of the
  cell's text and hands them to `ProgressBars`;
- in the kernel, `ProgressBars` draws one ipywidgets progress bar per rank
  in a Jupyter front end, and elsewhere (a script calling `dt.run`) prints a
  plain line per rank at most once a second;
- anywhere else (under torchrun, in a plain script), it does nothing, so
  the same training function runs unchanged at scale.

The marker starts with the ASCII record separator, a character no printed
text carries by accident. A report that lands after a learner's unfinished
line (`print(..., end="")`) is split off it, so neither is lost.
"""
import json
import sys
import time

MARK = "\x1e[ddp_teach progress] "
SEND_EVERY_S = 0.1    # a worker reports at most this often
PRINT_EVERY_S = 1.0   # the plain-text view prints a rank at most this often

_reporting = False
_last_sent = None


def report_to_kernel() -> None:
    """Make `progress` report: called by a `dt.run` worker before the
    learner's function starts."""
    global _reporting, _last_sent
    _reporting, _last_sent = True, None


def progress(step: int, total: int, **metrics) -> None:
    """Report that this rank has done `step` of `total` steps, with any
    numbers to show beside the bar (`loss=...`; tensors are read with
    float()). Cheap enough to call every step; does nothing outside
    `dt.run`."""
    global _last_sent
    if not _reporting:
        return
    now = time.monotonic()
    if _last_sent is not None and now - _last_sent < SEND_EVERY_S and step < total:
        return
    _last_sent = now
    report = {"step": int(step), "total": int(total),
              "metrics": {name: _number(name, value) for name, value in metrics.items()}}
    sys.stdout.write(MARK + json.dumps(report) + "\n")
    sys.stdout.flush()


def _number(name: str, value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"dt.progress({name}={value!r}): the values shown beside "
                        "a bar must be numbers (or one-element tensors)") from None


def describe(report: dict) -> str:
    """"12/50  loss 1.234": the text beside a bar."""
    numbers = "  ".join(f"{name} {value:.4g}"
                        for name, value in report["metrics"].items())
    return f"{report['step']}/{report['total']}" + (f"  {numbers}" if numbers else "")


class ProgressBars:
    """The kernel's view of a run's progress reports: widgets in a Jupyter
    front end, plain lines on `text_sink` elsewhere; made on the first
    report, so a run that reports nothing shows nothing."""

    def __init__(self, world_size: int, text_sink):
        self.world_size, self._sink = world_size, text_sink
        self._view = None

    def take(self, rank: int, line: str) -> str | None:
        """Draw the report a line of rank `rank`'s stdout carries, if any;
        return the text of the line to print, or None when it was only a
        report."""
        text, marked, encoded = line.partition(MARK)
        if not marked:
            return line
        report = json.loads(encoded)
        if self._view is None:
            self._view = (_WidgetView(self.world_size) if _widgets_can_show()
                          else _TextView(self._sink))
        self._view.update(rank, report)
        return text or None


def _widgets_can_show() -> bool:
    """True in an IPython kernel (a front end may draw widgets) that has
    ipywidgets."""
    try:
        from IPython import get_ipython
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


class _WidgetView:
    def __init__(self, world_size: int):
        import ipywidgets as widgets
        from IPython.display import display
        self._bars = [widgets.IntProgress(value=0, min=0, max=1,
                                          description=f"rank {rank}")
                      for rank in range(world_size)]
        self._labels = [widgets.Label("waiting") for _ in range(world_size)]
        display(widgets.VBox([widgets.HBox([bar, label])
                              for bar, label in zip(self._bars, self._labels)]))

    def update(self, rank: int, report: dict) -> None:
        bar = self._bars[rank]
        bar.max = max(report["total"], 1)
        bar.value = min(report["step"], bar.max)
        self._labels[rank].value = describe(report)


class _TextView:
    def __init__(self, sink):
        self._sink = sink
        self._last_printed = {}

    def update(self, rank: int, report: dict) -> None:
        now = time.monotonic()
        done = report["step"] >= report["total"]
        if not done and now - self._last_printed.get(rank, -PRINT_EVERY_S) < PRINT_EVERY_S:
            return
        self._last_printed[rank] = now
        self._sink.write(f"[rank {rank}] progress {describe(report)}\n")
        self._sink.flush()
