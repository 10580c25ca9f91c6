"""Read the Chrome traces torch.profiler wrote on each rank as the course's events.

A learner's real job is profiled with `torch.profiler.profile(...)` and
`export_chrome_trace(path)` (or `tensorboard_trace_handler`), one file per
rank. `read_events` turns those files into `Event`s, so that `Timeline`
measures overlap and exposed communication and draws them as it does for the
course's own runs. Which events compute and which communicate is decided per
trace by `ddp_teach.tracing.profiler_events`; this module finds the files,
gives each its rank and puts the ranks on one clock.

Clocks. A trace's times are microseconds (`ts`) after its
`baseTimeNanoseconds`, wall-clock nanoseconds since the epoch; so ranks on
one machine share one clock, ranks on several machines only as far as their
clocks are synchronised (NTP: often a millisecond or worse, longer than a
kernel). `align` chooses: "collective" (default) shifts every rank so that
its first communication ends when the lowest rank's does: every rank leaves a
collective at about the same moment (it completes only when the last rank's
data has arrived), so this holds across machines, to within one message's
latency. "clock" trusts the traces' clocks (exact on one machine). "start"
puts each rank's first event at 0 (rank skew is lost). The overlap and
exposed-communication numbers are per rank, so no choice changes them.
"""
import glob
import gzip
import json
import os
import re
import warnings
from dataclasses import replace
from pathlib import Path

from ddp_teach.tracing.events import COMM, Event
from ddp_teach.tracing.profiler_events import complete_spans, rank_events

ALIGNMENTS = ("collective", "clock", "start")
NO_BYTES = ("the traces carry no message sizes, so every communication reads "
            "0 bytes: on gloo, profile with torch.profiler.profile(..., "
            "record_shapes=True)")


def read_events(paths, align: str = "collective") -> list[Event]:
    """The events of every rank's trace, on one clock (see `align` above).

    paths: a list of trace files (one per rank), a directory holding them
    (*.json, *.json.gz) or a glob pattern. A rank is the trace's
    "distributedInfo" rank when every trace has one, else its place in the
    list (a directory or glob is sorted by name, rank10 after rank9).
    """
    if align not in ALIGNMENTS:
        raise ValueError(f"align={align!r}: choose one of {ALIGNMENTS}")
    files = trace_files(paths)
    traces = [load(path) for path in files]
    ranks = [t.get("distributedInfo", {}).get("rank") for t in traces]
    if None in ranks:
        ranks = list(range(len(files)))
    for rank in set(ranks):
        if ranks.count(rank) > 1:
            same = [str(f) for f, r in zip(files, ranks) if r == rank]
            raise ValueError(f"{len(same)} traces say they are rank {rank}: {same}; "
                             "pass one trace per rank")
    # each trace's clock in us, from the earliest event of all: the large
    # numbers cancel exactly before anything is scaled to seconds
    base = min(t.get("baseTimeNanoseconds", 0) for t in traces)
    clocks = [(t.get("baseTimeNanoseconds", 0) - base) / 1e3 for t in traces]
    earliest = min(clock + min(e["ts"] for e in complete_spans(t))
                   for clock, t in zip(clocks, traces))
    per_rank = {rank: rank_events(trace, rank, path, clock - earliest)
                for rank, trace, path, clock in zip(ranks, traces, files, clocks)}
    comm = [e for events in per_rank.values() for e in events if e.kind == COMM]
    if comm and not any(e.nbytes for e in comm):
        warnings.warn(NO_BYTES, stacklevel=3)
    if not comm and align == "collective":
        align = "clock"   # one rank's run: nothing to align on, nothing to align
    events = [e for events in _aligned(per_rank, align).values() for e in events]
    origin = min(e.start for e in events)
    return [replace(e, start=e.start - origin, end=e.end - origin)
            for e in events]


def trace_files(paths) -> list[Path]:
    """The files `paths` names: itself, a directory's traces, a glob's matches."""
    if isinstance(paths, (str, os.PathLike)):
        path = Path(paths)
        if path.is_dir():
            found = [p for p in path.iterdir() if p.name.endswith((".json", ".json.gz"))]
        elif path.exists():
            found = [path]
        else:
            found = [Path(p) for p in glob.glob(str(path))]
        if not found:
            raise FileNotFoundError(f"no trace files at {str(paths)!r}: give the files "
                                    "torch.profiler's export_chrome_trace wrote, their "
                                    "directory or a glob such as 'traces/rank*.json'")
        return sorted(found, key=_natural)
    files = [Path(p) for p in paths]
    if not files:
        raise ValueError("no trace files given: pass one trace per rank")
    for path in files:
        if not path.is_file():
            raise FileNotFoundError(f"{str(path)!r} is not a file")
    return files


def load(path: Path) -> dict:
    """A trace file's JSON, checked to be a Chrome trace with events in it."""
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt") as f:
            trace = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError, gzip.BadGzipFile) as error:
        raise ValueError(f"{str(path)!r} is not a Chrome trace (not JSON: {error}); "
                         "pass the files torch.profiler's export_chrome_trace "
                         "wrote") from None
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError(f"{str(path)!r} is JSON but not a Chrome trace (no "
                         "'traceEvents' list); pass the files torch.profiler's "
                         "export_chrome_trace wrote")
    if not complete_spans(trace):
        raise ValueError(f"{str(path)!r} is an empty trace: no operator or kernel "
                         "was recorded; run the training steps inside "
                         "`with torch.profiler.profile(...)` (and, with a "
                         "schedule, call prof.step() until a window is active)")
    return trace


def _aligned(per_rank: dict[int, list[Event]], align: str) -> dict[int, list[Event]]:
    """Shift each rank's events by the `align` rule (module docstring)."""
    if align == "clock":
        return per_rank
    if align == "start":
        shifts = {r: -min(e.start for e in events) for r, events in per_rank.items()}
    else:
        first = {r: min((e for e in events if e.kind == COMM), key=lambda e: e.start)
                 for r, events in per_rank.items()}
        reference = first[min(first)]
        if len({(e.name, e.nbytes) for e in first.values()}) > 1:
            warnings.warn("the ranks' first collectives differ "
                          f"({sorted({e.name for e in first.values()})}), so aligning "
                          "on them may be wrong: profile the same steps on every "
                          "rank, or pass align='clock'", stacklevel=4)
        shifts = {r: reference.end - e.end for r, e in first.items()}
    return {r: [replace(e, start=e.start + shifts[r], end=e.end + shifts[r])
                 for e in events] for r, events in per_rank.items()}


def _natural(path: Path):
    """Sort key: rank2 before rank10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]
