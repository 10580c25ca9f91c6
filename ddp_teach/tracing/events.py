"""One thing a rank did, with when it started and ended: the unit of a timeline.

Workers record events while a traced run goes on and send them back with their
result; `Timeline` analyses and draws them. Times are seconds on
`time.perf_counter()`, which on Linux and macOS is a system-wide monotonic
clock, so events from different ranks on one machine share one clock.
"""
from dataclasses import dataclass, asdict

COMPUTE = "compute"
COMM = "comm"


@dataclass(frozen=True)
class Event:
    """A span on one rank.

    kind: COMPUTE (a `dt.span` the learner marked) or COMM (a collective or
    point-to-point call, recorded automatically).
    start / end: seconds on the shared clock; for an async collective, `start`
    is when it was issued and `end` when its work completed (not when someone
    waited on it).
    nbytes: bytes the call moved (the tensors passed to it), 0 for compute.
    emulated_s: the part at the end of a COMM event that was added by network
    emulation (a slow link pretended), 0 when none.
    """
    rank: int
    name: str
    kind: str
    start: float
    end: float
    nbytes: int = 0
    emulated_s: float = 0.0

    @property
    def duration(self) -> float:
        return self.end - self.start

    def as_dict(self) -> dict:
        return asdict(self)
