"""Drawing a `Timeline`: two lanes per rank, compute above communication.

Kept apart from `ddp_teach.tracing.timeline`, which holds the events and
measures them, so that the analysis reads without the matplotlib details.
Compute is coloured by its phase (the leading word of its name: forward,
backward, optimizer), communication in one colour; the part of a
communication that an emulated slow link added (`Event.emulated_s`) is
hatched at the end of its bar. Events of one lane that run at the same time
(concurrent all-reduces) are drawn one above the other.
"""
import re

from matplotlib.patches import Patch

from ddp_teach.tracing.events import COMM, COMPUTE, Event

COLORS = {COMPUTE: "#3b6fb6", COMM: "#e07b24"}
# compute named after its phase (a simulated run's events, trace_layers' marks)
PHASE_COLORS = {"forward": "#74a9e0", "backward": "#1f9e89", "optimizer": "#8e5ea2"}
EMULATED_COLOR = "#f6cfa8"
LANE_HEIGHT = 0.8
MS = 1e3


def phases(events) -> set[str]:
    """The phases of the compute `events` (see `phase`)."""
    return {phase(e.name) for e in events if e.kind == COMPUTE}


def phase(name: str) -> str:
    """The leading word of an event's name: "backward" of "backward fc1"."""
    return re.match(r"[A-Za-z]*", name).group()


def has_emulation(events) -> bool:
    return any(e.emulated_s > 0 for e in events)


def legend(ax, events) -> None:
    """Colour key to the right of `ax` for the `events` drawn there: one entry
    per compute phase (or "compute"), communication, and emulation only when
    there is some."""
    drawn = phases(events)
    handles = [Patch(color=PHASE_COLORS[p], label=p) for p in PHASE_COLORS if p in drawn]
    if not handles or drawn - set(PHASE_COLORS):  # other names: "compute"
        handles.append(Patch(color=COLORS[COMPUTE], label="compute"))
    handles.append(Patch(color=COLORS[COMM], label="communication"))
    if has_emulation(events):
        handles.append(Patch(facecolor=EMULATED_COLOR, hatch="////", linewidth=0,
                             hatchcolor=COLORS[COMM], label="emulated (slow link)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1),
              frameon=False, fontsize="small")


def draw_lanes(ax, events: list[Event], ranks: list[int], lane: str) -> float:
    """Draw the lanes of `events` (of `ranks`, named "`lane` r") into `ax`,
    time in ms from the first event; return the time drawn, in ms."""
    origin = min((e.start for e in events), default=0.0)
    end_ms = (max((e.end for e in events), default=0.0) - origin) * MS
    lane_y = {}
    for index, rank in enumerate(ranks):
        lane_y[rank, COMPUTE], lane_y[rank, COMM] = 2.5 * index, 2.5 * index + 1
    bars = []  # (event, centre y, height): concurrent events share a lane in rows
    for (rank, kind), y in lane_y.items():
        in_lane = [e for e in events if e.rank == rank and e.kind == kind]
        rows = _rows_without_overlap(in_lane)
        height = LANE_HEIGHT / (max(rows, default=0) + 1)
        bars += [(e, y - LANE_HEIGHT / 2 + (row + 0.5) * height, height)
                 for e, row in zip(in_lane, rows)]
    if bars:
        drawn, centres, heights = zip(*bars)
        ax.barh(centres, [e.duration * MS for e in drawn], heights,
                left=[(e.start - origin) * MS for e in drawn],
                color=[_color(e) for e in drawn], linewidth=0)
    tails = [(e, y, h) for e, y, h in bars if e.emulated_s > 0]
    if tails:
        drawn, centres, heights = zip(*tails)
        ax.barh(centres, [e.emulated_s * MS for e in drawn], heights,
                left=[(e.end - e.emulated_s - origin) * MS for e in drawn],
                color=EMULATED_COLOR, hatch="////", hatchcolor=COLORS[COMM], linewidth=0)
    _label_wide_bars(ax, bars, origin, end_ms)
    ax.set_yticks(list(lane_y.values()), [f"{lane} {rank} {kind}" for rank, kind in lane_y])
    ax.set_ylim(max(lane_y.values(), default=1) + 0.75, -0.75)  # rank 0 on top
    ax.set_xlim(0, end_ms * 1.01 or 1)
    for index in range(1, len(ranks)):
        ax.axhline(2.5 * index - 0.75, color="0.85", linewidth=0.8)
    ax.grid(axis="x", color="0.92")
    ax.set_axisbelow(True)
    ax.tick_params(axis="y", length=0)
    return end_ms


def _rows_without_overlap(events: list[Event]) -> list[int]:
    """A row per event (sorted by start) so that events sharing a row do not
    overlap: concurrent all-reduces are drawn one above the other."""
    row_ends: list[float] = []
    rows = []
    for e in events:
        row = next((i for i, end in enumerate(row_ends) if end <= e.start), len(row_ends))
        if row == len(row_ends):
            row_ends.append(e.end)
        else:
            row_ends[row] = e.end
        rows.append(row)
    return rows


def _color(event: Event) -> str:
    if event.kind == COMM:
        return COLORS[COMM]
    return PHASE_COLORS.get(phase(event.name), COLORS[COMPUTE])


def _label_wide_bars(ax, bars, origin: float, end_ms: float,
                     max_events: int = 120, fontsize: float = 7) -> None:
    """Write names inside bars wide enough to hold them, when bars are few."""
    if len(bars) > max_events or end_ms <= 0:
        return
    axes_width_pt = ax.get_position().width * ax.figure.get_figwidth() * 72
    ms_per_char = 0.62 * fontsize / axes_width_pt * end_ms * 1.01
    for e, y, _ in bars:
        if e.duration * MS >= (len(e.name) + 2) * ms_per_char:
            ax.text((e.start - origin + e.duration / 2) * MS, y, e.name,
                    ha="center", va="center", fontsize=fontsize,
                    color="white" if e.kind == COMPUTE else "black", clip_on=True)
