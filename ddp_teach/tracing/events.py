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
    nbytes: for a COMM event, the bytes of the call's whole buffer, in a
    traced and a simulated run alike (`ddp_teach.tracing.operations`: the
    tensor of an all-reduce, the gathered output of an all-gather, the whole
    input of a reduce-scatter, the message of a send); 0 for compute.
    emulated_s: the part at the end of a COMM event that was added by network
    emulation (a slow link pretended), 0 when none.
    op: for a COMM event, the operation ("all_reduce", "all_gather",
    "reduce_scatter", "send", ...; `operations.OPERATIONS`), whatever its
    name says ("ddp bucket 0", "unit 0 all-gather"), so that no reader has to
    parse names; "copy" for a device-to-device copy of `sim.SimulatedGPUs`;
    "" for compute and for events that no torch.distributed call made.
    """
    rank: int
    name: str
    kind: str
    start: float
    end: float
    nbytes: int = 0
    emulated_s: float = 0.0
    op: str = ""

    @property
    def duration(self) -> float:
        return self.end - self.start

    def as_dict(self) -> dict:
        return asdict(self)
