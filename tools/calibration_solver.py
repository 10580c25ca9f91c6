"""The solver behind tools/calibrate.py: one calibrated constant set to a
trial value in the live simulator, an evidence row (by its id, as
`benchmarks/published_rows.py` simulates it) run with it, and the value found at which the row's simulated figure equals
the published one (see tools/calibrate.py for what is solved and why).
"""
import contextlib
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # benchmarks/ is not a package
sys.path.insert(0, str(ROOT))

from published_rows import ROWS  # noqa: E402
from ddp_teach.sim.model import calibrated, hardware  # noqa: E402

BY_ID = {row.id: row for row in ROWS}


@dataclass(frozen=True)
class Constant:
    """One calibrated constant: where it lives (`device` and `field` of a
    preset's `Achieved`, or None and a name of `ddp_teach.sim.model.calibrated`,
    "LINK_FRACTIONS:<kind>" for one of its link fractions), its stored
    value, the significant figures it is written with, the ids of the rows
    it was solved from, and the interval its root lies in."""
    name: str
    stored: float
    figures: int
    rows: tuple
    bracket: tuple
    device: str | None = None
    field: str = ""
    note: str = ""
    closed_form: Callable[[], float] | None = None

    @property
    def tolerance(self) -> float:
        """Half a unit of the stored value's last significant figure."""
        return 0.5 * 10 ** (math.floor(math.log10(abs(self.stored))) - self.figures + 1)


_STORED_RATIOS = {}
_patched = 0  # how many constants are set away from their stored values


def _live(constant: Constant) -> float:
    """The value the simulator uses now."""
    if constant.device is not None:
        return getattr(hardware.DEVICES[constant.device].achieved, constant.field)
    if constant.field.startswith("LINK_FRACTIONS:"):
        return calibrated.LINK_FRACTIONS[constant.field.split(":", 1)[1]]
    return getattr(calibrated, constant.field)


@contextlib.contextmanager
def with_value(constant: Constant, value: float):
    """The simulator with `constant` at `value`, put back on leaving."""
    global _patched
    if value == _live(constant):
        yield
        return
    attribute = None
    if constant.device is not None:
        old = hardware.DEVICES[constant.device]
        hardware.DEVICES[constant.device] = replace(old, achieved=replace(
            old.achieved, **{constant.field: value}))
    elif constant.field.startswith("LINK_FRACTIONS:"):
        attribute = "LINK_FRACTIONS"
        old = calibrated.LINK_FRACTIONS
        calibrated.LINK_FRACTIONS = {**old, constant.field.split(":", 1)[1]: value}
    else:
        attribute = constant.field
        old = getattr(calibrated, attribute)
        setattr(calibrated, attribute, value)
    _patched += 1
    try:
        yield
    finally:
        _patched -= 1
        if constant.device is not None:
            hardware.DEVICES[constant.device] = old
        else:
            setattr(calibrated, attribute, old)


def ratio(row_id: str) -> float:
    """simulated / published of one row, with the simulator as it stands
    (kept once computed with every constant at its stored value)."""
    if _patched or row_id not in _STORED_RATIOS:
        row = BY_ID[row_id]
        figure = row.simulate() / row.published
        if _patched:
            return figure
        _STORED_RATIOS[row_id] = figure
    return _STORED_RATIOS[row_id]


def calibration_ratios() -> dict:
    """{row: simulated / published} of every "calibrate" row, every constant
    at its stored value."""
    return {row.id: ratio(row.id) for row in ROWS if row.role == "calibrate"}


def solve(constant: Constant, others=()) -> float:
    """The value of `constant` at which its first row's ratio is 1, the
    constants in `others` ((constant, value) pairs) set as given."""
    with contextlib.ExitStack() as stack:
        for other, value in others:
            stack.enter_context(with_value(other, value))

        def error(x):
            with with_value(constant, x):
                return ratio(constant.rows[0]) - 1

        # the stored value and one just past its tolerance first (the row's
        # ratio as it stands, and a bracket in two or three runs of an
        # expensive row), then the whole interval
        low, high = constant.bracket
        lo, f_lo = constant.stored, error(constant.stored)
        for hi in (lo + 2 * constant.tolerance, lo - 2 * constant.tolerance, low, high):
            hi = min(max(hi, low), high)
            if hi == lo:
                continue
            f_hi = error(hi)
            if f_lo * f_hi <= 0:
                break
        else:
            raise ValueError(f"{constant.name}: the row {constant.rows[0]!r} is not "
                             f"reproduced anywhere in {constant.bracket}; widen the "
                             "bracket or look at the row")
        if f_lo == 0:
            return lo
        lo, hi, f_lo, f_hi = (lo, hi, f_lo, f_hi) if lo < hi else (hi, lo, f_hi, f_lo)
        side = 0
        for _ in range(100):
            x = (lo * f_hi - hi * f_lo) / (f_hi - f_lo)
            f_x = error(x)
            # done when one more secant step would move it by a hundredth
            # of its tolerance, or the bracket is that narrow
            slope = (f_hi - f_lo) / (hi - lo)
            if abs(f_x / slope) < 1e-2 * constant.tolerance \
                    or hi - lo < 1e-2 * constant.tolerance:
                return x
            if f_x * f_hi > 0:
                hi, f_hi = x, f_x
                f_lo = f_lo / 2 if side == -1 else f_lo
                side = -1
            else:
                lo, f_lo = x, f_x
                f_hi = f_hi / 2 if side == 1 else f_hi
                side = 1
        raise RuntimeError(f"{constant.name}: no convergence in 100 steps")


def solve_together(first: Constant, second: Constant) -> tuple:
    """Two constants solved from their two rows together: each from its own
    row with the other at its latest value, until neither moves."""
    a, b = first.stored, second.stored
    for _ in range(50):
        a_new = solve(first, [(second, b)])
        b_new = solve(second, [(first, a_new)])
        if abs(a_new - a) < 1e-3 * first.tolerance and abs(b_new - b) < 1e-3 * second.tolerance:
            return a_new, b_new
        a, b = a_new, b_new
    raise RuntimeError(f"{first.name} and {second.name} did not settle in 50 rounds")


