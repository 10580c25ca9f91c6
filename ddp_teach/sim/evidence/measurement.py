"""A measurement of real GPUs set beside the simulator's figure for it.

What a row of the validation table is (`Measurement`), the tolerance every
row is held to (`LOW`, `HIGH`), and how a table of rows is simulated
(`table`). The rows themselves are data, in `ddp_teach/sim/evidence/`
(`evidence.loader` reads them): collectives and kernels, which
`ddp_teach.sim.evidence.published` simulates (products and copies on many GPUs
through `ddp_teach.sim.evidence.gpu_surveys`), and whole training runs, which the
repository's `benchmarks/published_rows.py` simulates.

role "calibrate": a constant of the simulator was solved from this row, so
its ratio is about 1 by construction; "validate": no constant saw it, so its
ratio measures the model.
"""
from dataclasses import dataclass
from typing import Callable

LOW, HIGH = 0.87, 1.15  # the tolerance every row is held to: within about 15%


@dataclass(frozen=True)
class Measurement:
    """One published figure (`published`, in `unit`) and how to simulate it.

    group: "collective", "kernel", "training" or "inference"; role: "calibrate" or
    "validate" (see the module's doc); note: why the simulator misses it,
    where it does; id: the row's id in its evidence file, by which
    `ddp_teach.sim.model.calibrated` names the rows its constants were solved from."""
    group: str
    what: str
    config: str
    source: str
    published: float
    unit: str
    role: str
    simulate: Callable[[], float]
    note: str = ""
    id: str = ""

    def ratio(self, simulated: float) -> float:
        """simulated / published, in the row's unit (a time or a rate)."""
        return simulated / self.published


def table(rows) -> list:
    """[(measurement, simulated, ratio)] for each of `rows`, simulated now."""
    result = []
    for row in rows:
        simulated = row.simulate()
        result.append((row, simulated, row.ratio(simulated)))
    return result
