"""Every plot of a magnitude starts its axis at zero, where the lesson needs it.

A line plot of times, bytes or throughput whose axis starts just below the
smallest value makes a 5% difference look like a factor of two (notebook
03's bucket-cap plot did). So: an axis whose label names a magnitude (a
time, bytes, memory, a rate, a speed-up) and that is drawn with lines or
markers must set its lower limit to zero in the same cell, unless it is
on a log scale, where a ratio is what the eye reads. Bars need nothing:
matplotlib keeps a bar's base, zero, in view; but an explicit limit that
cuts them above zero is flagged too.

How: each code cell's source is parsed (IPython's own transformer turns
magics into Python first) and nothing is run, so the test costs nothing
and needs no figure: nbval executes the notebooks already. The axes are
the names a cell binds to `subplots(...)`, `add_subplot(...)`, `gca()` or
`twinx()` (and what a loop takes from them); the calls on them give the
labels, scales, limits and kinds of drawing. A plot made inside a course
function (`Timeline.plot`) is that function's business, tested with it.

`python tests/notebooks/test_plot_axes.py` prints every notebook's flags.
"""
import ast
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from IPython.core.inputtransformer2 import TransformerManager

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9A][0-9]_*.ipynb"))

MAGNITUDE = re.compile(
    r"(?i)\b(?:time|seconds?|ms|µs|us|ns|bytes?|[kmgt]i?b|memory|throughput|"
    r"tokens?/s|samples?/s|speed-?up|bandwidth|[kmgt]b/s|t?flop/s)\b|\(s\)")
MAKES_AXES = {"subplots", "add_subplot", "subplot", "gca", "twinx", "twiny", "add_axes"}
LINES = {"plot", "step", "errorbar", "fill_between", "stackplot", "scatter", "stairs",
         "semilogx"}
BARS = {"bar", "barh"}
LOG_Y = {"semilogy", "loglog"}


@dataclass
class Axis:
    """What a cell does to one axes object, as far as the y (or, for
    horizontal bars, the x) axis goes."""
    name: str
    labels: dict = field(default_factory=dict)   # "x"/"y" -> label text
    log: set = field(default_factory=set)        # {"x", "y"}: log-scaled
    lower: dict = field(default_factory=dict)    # "x"/"y" -> lower limit (None: not a number)
    draws: set = field(default_factory=set)      # method names

    def value_axis(self) -> str:
        """The axis the data's values are on: x for horizontal bars."""
        return "x" if self.draws == {"barh"} else "y"

    def problem(self) -> str | None:
        """Why this axis misleads, or None."""
        axis = self.value_axis()
        label = self.labels.get(axis, "")
        if not MAGNITUDE.search(label) or axis in self.log or not self.draws:
            return None
        if self.draws & LOG_Y and axis == "y":
            return None
        if axis in self.lower:
            if self.lower[axis] != 0:
                return f"its {axis} limit starts at {self.lower[axis]!r}, not 0"
            return None
        if self.draws & LINES:
            return f"drawn with lines, and its {axis} axis is not set to start at 0"
        return None


def python_of(cell_source: str) -> ast.Module | None:
    """The cell as Python (magics transformed), or None if it is not."""
    try:
        return ast.parse(TransformerManager().transform_cell(cell_source))
    except SyntaxError:
        return None


def _constant(node):
    """A number written in the code (0, 0.0, -1), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _constant(node.operand)
        return None if inner is None else -inner
    return None


def _lower_limit(call: ast.Call, axis: str):
    """The lower limit a set_ylim/set_xlim call gives (None: not a number)."""
    for keyword in call.keywords:
        if keyword.arg in ("bottom", "left", f"{axis}min"):
            return _constant(keyword.value)
    if not call.args:
        return "unset"
    first = call.args[0]
    if isinstance(first, (ast.Tuple, ast.List)) and first.elts:
        first = first.elts[0]
    return _constant(first)


def _names_bound(target) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Starred):
        return _names_bound(target.value)
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for element in target.elts for name in _names_bound(element)]
    return []


def _axes_names(tree: ast.Module) -> set[str]:
    """Names bound to axes: from the calls that make them, by loops over
    them, and the parameters called `ax`."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            call = node.value.value if isinstance(node.value, ast.Subscript) else node.value
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) \
                    and call.func.attr in MAKES_AXES:
                for target in node.targets:
                    bound = _names_bound(target)
                    pyplot = isinstance(call.func.value, ast.Name) and \
                        call.func.value.id in ("plt", "pyplot")
                    if pyplot and call.func.attr == "subplots" and len(bound) > 1:
                        bound = bound[1:]          # fig, ax = plt.subplots()
                    names.update(bound)
        elif isinstance(node, ast.arg) and node.arg == "ax":
            names.add("ax")
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and isinstance(node.iter, ast.Name) \
                and node.iter.id in names:
            names.update(_names_bound(node.target))
    return names


def _base(node) -> str | None:
    while isinstance(node, ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def cell_axes(source: str) -> list[Axis]:
    """The axes a cell draws on, with their labels, scales and limits."""
    tree = python_of(source)
    if tree is None:
        return []
    names, axes = _axes_names(tree), {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and _base(node.func.value) in names):
            continue
        key = ast.unparse(node.func.value)
        axis = axes.setdefault(key, Axis(key))
        method = node.func.attr
        settings = {}
        if method == "set":
            settings = {k.arg: k.value for k in node.keywords if k.arg}
        elif method in ("set_xlabel", "set_ylabel", "set_xscale", "set_yscale") \
                and node.args:
            settings = {method[4:]: node.args[0]}
        elif method in ("set_xlim", "set_ylim"):
            axis.lower[method[4]] = _lower_limit(node, method[4])
        elif method in LINES | BARS | LOG_Y:
            axis.draws.add(method)
            if method == "loglog":
                axis.log.add("x")
        for key_, value in settings.items():
            which, what = key_[0], key_[1:]
            if what == "label" and isinstance(value, ast.Constant):
                axis.labels[which] = str(value.value)
            elif what == "label" and isinstance(value, ast.JoinedStr):
                axis.labels[which] = ast.unparse(value)
            elif what == "scale" and isinstance(value, ast.Constant) \
                    and value.value in ("log", "symlog", "logit"):
                axis.log.add(which)
            elif what == "lim":
                fake = ast.Call(func=None, args=[value], keywords=[])
                axis.lower[which] = _lower_limit(fake, which)
    return list(axes.values())


def flat_axes(path: Path) -> dict[str, str]:
    """{axis label: what is wrong} for a notebook's misleading axes."""
    found = {}
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] != "code":
            continue
        for axis in cell_axes("".join(cell["source"])):
            if (problem := axis.problem()) is not None:
                found[axis.labels.get(axis.value_axis(), "")] = problem
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_magnitudes_are_plotted_from_zero(path):
    found = flat_axes(path)
    assert not found, (f"{path.name}: plots of a magnitude that do not start at "
                       f"0 (set_ylim(bottom=0), or a log scale): {found}")


@pytest.mark.parametrize("source", [
    'fig = Figure()\nax = fig.subplots()\nax.plot(x, t)\nax.set(ylabel="ms per step")',
    'fig, ax = plt.subplots()\nax.plot(x, t)\nax.set_ylabel("time (s)")\n'
    'ax.set_ylim(0.5, 2)',
    'left, *right = fig.subplots(1, 2, squeeze=False)[0]\n'
    'right[0].plot(x, b)\nright[0].set(ylabel="GB per device")',
    'axes = fig.subplots(1, 2)\nfor ax in axes:\n    ax.plot(x, y)\n'
    '    ax.set_ylabel("tokens/s")',
    'ax = fig.add_subplot()\nax.bar(x, t)\nax.set(ylabel="ms", ylim=(1, 3))',
])
def test_a_magnitude_drawn_from_above_zero_is_flagged(source):
    problems = [axis.problem() for axis in cell_axes(source)]
    assert any(problems), problems


@pytest.mark.parametrize("source", [
    'ax = fig.subplots()\nax.plot(x, t)\nax.set(ylabel="ms per step")\n'
    'ax.set_ylim(0, max(t) * 1.1)',
    'ax = fig.subplots()\nax.plot(x, t)\nax.set(ylabel="ms", ylim=(0, None))',
    'ax = fig.subplots()\nax.plot(x, t)\nax.set_ylabel("time (s)")\nax.set_ylim(bottom=0)',
    'ax = fig.subplots()\nax.loglog(n, t)\nax.set(ylabel="time (s)")',
    'ax = fig.subplots()\nax.plot(n, t)\nax.set(ylabel="time (s)", yscale="log")',
    'ax = fig.subplots()\nax.bar(x, t)\nax.set_ylabel("ms per step")',
    'ax = fig.subplots()\nax.barh(names, t)\nax.set_xlabel("seconds")',
    'ax = fig.subplots()\nax.plot(losses)\nax.set(ylabel="loss (nats)")',
    'optimizer.step()\ndist.scatter(out, parts, src=0)',
    '%%ddp -n 2\nx = 1',
])
def test_what_needs_no_zero_is_not_flagged(source):
    problems = [axis.problem() for axis in cell_axes(source)]
    assert not any(problems), problems


if __name__ == "__main__":
    for notebook in NOTEBOOKS:
        print(notebook.stem, flat_axes(notebook))
    sys.exit(0)
