"""When each rank computed and when its gradients travelled: the course's central picture.

Data-parallel training is fast when communication hides behind computation:
while backward still runs, buckets of finished gradients are already being
all-reduced. A `Timeline` holds the events every rank recorded (see
`ddp_teach.events`) and answers, per rank, how much of the communication was
hidden and how much the rank had to wait for, then draws it
(`ddp_teach.tracing.drawing`): one lane for compute and one for
communication per rank, on one clock.

The overlap metric is the one of Meta's Holistic Trace Analysis (HTA,
https://github.com/facebookresearch/HolisticTraceAnalysis, "Communication
Computation Overlap"): the time during which computation runs while
communication is under way, divided by the total time spent in communication,
both taken over the union of each kind's intervals on a rank. HTA reports it as
a percentage; here it is a fraction in [0, 1].
"""
import json
import warnings
from typing import Iterable, Iterator

from matplotlib.figure import Figure

from ddp_teach.tracing import drawing, torch_profiler
from ddp_teach.tracing.events import COMM, COMPUTE, Event

Interval = tuple[float, float]

NO_COMPUTE = ("no compute was marked, so overlap cannot be measured: wrap the "
              "work in `with dt.span('backward'):`, pass the model through "
              "dt.trace_layers(model), or run with simulate=, which records "
              "compute by itself")
TRACE_THREADS = {COMPUTE: (0, "compute"), COMM: (1, "communication")}
MS = 1e3
US = 1e6


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Merge (start, end) intervals into sorted disjoint ones; empty ones vanish."""
    merged: list[list[float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def total_length(intervals: Iterable[Interval]) -> float:
    """Time covered by the intervals, counting overlapping stretches once."""
    return sum(end - start for start, end in union(intervals))


def intersection_length(a: Iterable[Interval], b: Iterable[Interval]) -> float:
    """Time covered by both sets of intervals (each set is unioned first)."""
    a, b = union(a), union(b)
    i = j = 0
    shared = 0.0
    while i < len(a) and j < len(b):
        shared += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return shared


class Timeline:
    """The events of a run, sorted by (rank, start), with analysis and drawing."""

    def __init__(self, events: Iterable[Event], clock: str | None = None,
                 lane: str = "rank"):
        """clock: None for real time, else what the times simulate (e.g.
        "simulated A100 80GB + NVLink 4"), which every plot then says.
        lane: what an event's `rank` number names in tables and plots:
        "rank" (a process), or "device" (ddp_teach.sim.runtime.dataparallel_gpus, where one
        process drives several GPUs)."""
        self.clock = clock
        self.lane = lane
        self.events = sorted(events, key=lambda e: (e.rank, e.start))
        unknown = {e.kind for e in self.events} - {COMPUTE, COMM}
        if unknown:
            raise ValueError(f"unknown event kind(s) {sorted(unknown)}; "
                             f"expected {COMPUTE!r} or {COMM!r}")
        self.ranks = sorted({e.rank for e in self.events})

    def __len__(self) -> int:
        return len(self.events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def __repr__(self) -> str:
        return f"Timeline({len(self)} events, {self.lane}s {self.ranks})"

    def for_rank(self, rank: int) -> "Timeline":
        return self.filter(rank=rank)

    def filter(self, kind: str | None = None, name: str | None = None,
               rank: int | None = None) -> "Timeline":
        """The events matching every criterion given (names match exactly)."""
        return Timeline((e for e in self.events
                         if (kind is None or e.kind == kind)
                         and (name is None or e.name == name)
                         and (rank is None or e.rank == rank)), self.clock, self.lane)

    def after_last_barrier(self) -> "Timeline":
        """Each rank's events after its last `barrier`: the measured step,
        without the set-up and warm-up before it."""
        cut = {}
        for e in self.events:
            if e.name == "barrier":
                cut[e.rank] = max(cut.get(e.rank, e.end), e.end)
        return Timeline((e for e in self.events if e.start >= cut.get(e.rank, 0.0)
                         and e.name != "barrier"), self.clock, self.lane)  # (one of no length)

    def _intervals(self, rank: int, kind: str) -> list[Interval]:
        return [(e.start, e.end) for e in self.events
                if e.rank == rank and e.kind == kind]

    def overlap(self) -> dict[int, float]:
        """Per rank, the FRACTION (0..1) of communication time during which the
        rank also computed (HTA's overlap, not a percentage); 0.0 for a rank
        that did not communicate."""
        return {rank: row["overlap_s"] / row["comm_s"] if row["comm_s"] > 0 else 0.0
                for rank, row in self.summary().items()}

    def mean_overlap(self) -> float:
        """The overlap fraction averaged over ranks (0.0 for an empty timeline).
        Warns when communication was recorded but no compute was marked."""
        if self._unmarked():
            warnings.warn(NO_COMPUTE, stacklevel=2)
        fractions = list(self.overlap().values())
        return sum(fractions) / len(fractions) if fractions else 0.0

    def summary(self) -> dict[int, dict]:
        """Per rank, where its time went, in seconds and as fractions of its span.

        overlap_s is time both computing and communicating, so it is counted in
        compute_s and in comm_s: compute_frac + comm_frac + idle_frac equals
        1 + overlap_s / span_s. exposed_comm_s = comm_s - overlap_s is the
        communication the rank could not hide behind computation.
        """
        table = {}
        for rank in self.ranks:
            events = [e for e in self.events if e.rank == rank]
            compute, comm = self._intervals(rank, COMPUTE), self._intervals(rank, COMM)
            compute_s, comm_s = total_length(compute), total_length(comm)
            overlap_s = intersection_length(compute, comm)
            span_s = max(e.end for e in events) - min(e.start for e in events)
            row = dict(compute_s=compute_s, comm_s=comm_s, overlap_s=overlap_s,
                       exposed_comm_s=comm_s - overlap_s,
                       idle_s=span_s - total_length(compute + comm),
                       span_s=span_s,
                       emulated_s=sum(e.emulated_s for e in events))
            for part in ("compute", "comm", "idle"):
                row[f"{part}_frac"] = row[f"{part}_s"] / span_s if span_s > 0 else 0.0
            table[rank] = row
        return table

    def summary_table(self) -> str:
        """`summary()` as a fixed-width text table, times in milliseconds."""
        columns = [("span", "span_s"), ("compute", "compute_s"), ("comm", "comm_s"),
                   ("overlap", "overlap_s"), ("exposed", "exposed_comm_s"),
                   ("idle", "idle_s"), ("emulated", "emulated_s")]
        width = max(4, len(self.lane))
        lines = [f"{self.lane:>{width}}" + "".join(f"{title + ' ms':>13}" for title, _ in columns)
                 + f"{'overlap %':>11}"]
        overlap = self.overlap()
        for rank, row in self.summary().items():
            lines.append(f"{rank:>{width}}" + "".join(f"{row[key] * MS:>13.2f}" for _, key in columns)
                         + f"{overlap[rank] * 100:>11.1f}")
        return "\n".join(lines)

    # ---- drawing -------------------------------------------------------------

    def plot(self, ax=None, title: str | None = None) -> Figure:
        """Draw a compute lane and a comm lane per rank, time in ms from the
        first event; into `ax` if given, else into a new (pyplot-free) Figure."""
        if ax is None:
            figure = Figure(figsize=(11, 1.2 + 0.45 * 2 * max(1, len(self.ranks))),
                            layout="constrained")
            ax = figure.add_subplot()
        drawing.draw_lanes(ax, self.events, self.ranks, self.lane)
        drawing.legend(ax, self.events)
        ax.set_xlabel(self._time_label("time (ms)"))
        lanes = f"{len(self.ranks)} {self.lane}" + ("" if len(self.ranks) == 1 else "s")
        if title is None and self._unmarked():
            title = f"{lanes} · {NO_COMPUTE}"
        ax.set_title(title if title is not None else
                     f"{lanes} · communication hidden behind compute: "
                     f"{self.mean_overlap():.0%} (mean overlap)", wrap=True)
        return ax.figure

    def _unmarked(self) -> bool:
        """Communication recorded but no compute: overlap would read 0."""
        return bool(self.events) and all(e.kind == COMM for e in self.events)

    def _time_label(self, label: str) -> str:
        """An axis label that says when the time is simulated."""
        return label if self.clock is None else f"{label}, {self.clock}"

    @staticmethod
    def compare(a: "Timeline", b: "Timeline", labels=("a", "b")) -> Figure:
        """Two timelines stacked on one shared time axis, each from its own zero,
        titled with its label and its mean overlap."""
        lanes = [2 * max(1, len(t.ranks)) for t in (a, b)]
        figure = Figure(figsize=(11, 1.8 + 0.45 * sum(lanes)), layout="constrained")
        axes = figure.subplots(2, 1, sharex=True, height_ratios=lanes)
        ends_ms = []
        for ax, timeline, label in zip(axes, (a, b), labels):
            ends_ms.append(drawing.draw_lanes(ax, timeline.events, timeline.ranks,
                                              timeline.lane))
            ax.set_title(f"{label} · mean overlap {timeline.mean_overlap():.0%}", loc="left")
        axes[0].set_xlim(0, max(ends_ms) * 1.01 or 1)
        drawing.legend(axes[0], a.events + b.events)
        clocks = " / ".join(dict.fromkeys(t.clock or "real time" for t in (a, b)))
        axes[1].set_xlabel(f"time (ms from each run's first event), {clocks}")
        return figure

    # ---- Chrome trace (Perfetto, chrome://tracing) ---------------------------

    def to_chrome_trace(self, path) -> None:
        """Write the Chrome Trace Event Format: one process per rank, thread 0
        for compute and 1 for communication, times in microseconds from the
        first event (the original clock origin is kept in "otherData")."""
        origin = min((e.start for e in self.events), default=0.0)
        trace = []
        for rank in self.ranks:
            trace.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                          "args": {"name": f"rank {rank}"}})
            for tid, thread in TRACE_THREADS.values():
                trace.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
                              "args": {"name": thread}})
        for e in self.events:
            trace.append({"ph": "X", "name": e.name, "cat": e.kind, "pid": e.rank,
                          "tid": TRACE_THREADS[e.kind][0],
                          "ts": (e.start - origin) * US, "dur": e.duration * US,
                          "args": {"nbytes": e.nbytes, "emulated_s": e.emulated_s,
                                   "op": e.op}})
        with open(path, "w") as f:
            json.dump({"traceEvents": trace, "displayTimeUnit": "ms",
                       "otherData": {"clock_origin_s": origin}}, f)

    @classmethod
    def from_chrome_trace(cls, path) -> "Timeline":
        """Read back a trace written by `to_chrome_trace`."""
        with open(path) as f:
            trace = json.load(f)
        origin = trace.get("otherData", {}).get("clock_origin_s", 0.0)
        return cls(Event(rank=t["pid"], name=t["name"], kind=t["cat"],
                         start=origin + t["ts"] / US,
                         end=origin + (t["ts"] + t["dur"]) / US,
                         nbytes=t["args"]["nbytes"], emulated_s=t["args"]["emulated_s"],
                         op=t["args"].get("op", ""))
                   for t in trace["traceEvents"] if t["ph"] == "X")

    @classmethod
    def from_torch_profiler(cls, paths, align: str = "collective") -> "Timeline":
        """Read the Chrome traces torch.profiler wrote, one per rank (a list,
        a directory or a glob): NCCL kernels or gloo's collectives as
        communication, the other kernels or CPU operators as compute; ranks put
        on one clock by `align` ("collective", "clock" or "start"). See
        `ddp_teach.tracing.torch_profiler` for what is read and why."""
        return cls(torch_profiler.read_events(paths, align))
