"""Timeline analysis and drawing, on synthetic events (no worker processes)."""
import json
import random

import pytest
from matplotlib.figure import Figure

from ddp_teach.tracing.events import COMM, COMPUTE, Event
from ddp_teach.tracing.timeline import Timeline, intersection_length, total_length, union

MS = 1e-3


def compute(rank, start, end, name="work"):
    return Event(rank, name, COMPUTE, start, end)


def comm(rank, start, end, name="gloo:all_reduce", nbytes=1024, emulated_s=0.0,
         op="all_reduce"):
    return Event(rank, name, COMM, start, end, nbytes, emulated_s, op)


def ddp_step(rank, skew=0.0, slow_bucket=None):
    """One bucketed-DDP step in ms: forward, backward in 4 chunks, each chunk's
    bucket all-reduced while the next chunk runs, then the optimizer."""
    t = skew
    events = [compute(rank, t * MS, (t + 8) * MS, "forward")]
    t += 8
    for chunk in range(4):
        events.append(compute(rank, t * MS, (t + 4) * MS, f"backward[{3 - chunk}]"))
        t += 4
        tail = 3.0 if chunk == slow_bucket else 0.0
        events.append(comm(rank, (t + 0.2) * MS, (t + 4.5 + tail) * MS,
                           nbytes=4 << 20, emulated_s=tail * MS))
    last_comm_end = max(e.end for e in events)
    events.append(compute(rank, last_comm_end + 0.1 * MS, last_comm_end + 3.1 * MS,
                          "optimizer.step"))
    return events


def naive_step(rank, skew=0.0):
    """Backward as one piece, then one blocking all-reduce per parameter."""
    t = skew
    events = [compute(rank, t * MS, (t + 8) * MS, "forward"),
              compute(rank, (t + 8) * MS, (t + 24) * MS, "backward")]
    t += 24
    for _ in range(6):
        events.append(comm(rank, (t + 0.2) * MS, (t + 3) * MS, nbytes=1 << 20))
        t += 3
    events.append(compute(rank, (t + 0.1) * MS, (t + 3.1) * MS, "optimizer.step"))
    return events


def many_events(ranks, per_rank):
    rng = random.Random(0)
    events = []
    for rank in range(ranks):
        t = 0.0
        for i in range(per_rank):
            duration = rng.uniform(0.1, 2.0) * MS
            events.append(compute(rank, t, t + duration, f"op{i}"))
            if i % 3 == 0:
                events.append(comm(rank, t, t + 2 * duration))
            t += duration + rng.uniform(0, 0.3) * MS
    return events


# ---- interval helpers ------------------------------------------------------

def test_union_merges_overlapping_and_touching_intervals_and_drops_empty_ones():
    assert union([(5, 7), (0, 2), (1, 3), (3, 4), (9, 9), (8, 10)]) == [(0, 4), (5, 7), (8, 10)]
    assert union([]) == []
    assert total_length([(0, 10), (5, 15), (20, 21)]) == 16


def test_intersection_length_counts_shared_time_once():
    assert intersection_length([(0, 10), (12, 20)], [(5, 15)]) == 8
    assert intersection_length([(0, 10)], [(2, 4), (3, 6), (8, 30)]) == 6
    assert intersection_length([(0, 1)], [(1, 2)]) == 0
    assert intersection_length([], [(0, 1)]) == 0


# ---- overlap and summary ---------------------------------------------------

def test_overlap_is_the_hta_fraction_over_unioned_intervals_per_rank():
    timeline = Timeline([
        compute(0, 0, 10), compute(0, 12, 20), comm(0, 5, 15),   # (5 + 3) / 10
        compute(1, 0, 10), comm(1, 5, 15), comm(1, 8, 20),       # comm union [5, 20]
        compute(2, 0, 10),                                       # no communication
    ])
    overlap = timeline.overlap()
    assert overlap == pytest.approx({0: 0.8, 1: 5 / 15, 2: 0.0})
    assert timeline.mean_overlap() == pytest.approx((0.8 + 1 / 3 + 0) / 3)


def test_summary_splits_each_ranks_span_by_hand():
    timeline = Timeline([compute(0, 0, 10), compute(0, 12, 20), comm(0, 5, 15),
                         comm(0, 30, 40, emulated_s=4),
                         compute(1, 100, 101)])
    row = timeline.summary()[0]
    assert row["compute_s"] == pytest.approx(18)
    assert row["comm_s"] == pytest.approx(20)
    assert row["overlap_s"] == pytest.approx(8)
    assert row["exposed_comm_s"] == pytest.approx(12)
    assert row["span_s"] == pytest.approx(40)
    assert row["idle_s"] == pytest.approx(10)  # [20, 30]
    assert row["emulated_s"] == pytest.approx(4)
    assert (row["compute_frac"], row["comm_frac"], row["idle_frac"]) == pytest.approx(
        (18 / 40, 20 / 40, 10 / 40))
    busy_or_idle = row["compute_frac"] + row["comm_frac"] + row["idle_frac"]
    assert busy_or_idle == pytest.approx(1 + row["overlap_s"] / row["span_s"])
    assert timeline.summary()[1]["span_s"] == pytest.approx(1)  # its own span


def test_summary_table_has_a_row_per_rank_in_milliseconds():
    table = Timeline(ddp_step(0) + ddp_step(1)).summary_table()
    header, *rows = table.splitlines()
    assert "compute ms" in header and "overlap %" in header
    assert [row.split()[0] for row in rows] == ["0", "1"]
    assert rows[0].split()[2] == "27.00"  # forward 8 + backward 4 x 4 + optimizer 3 (ms)


# ---- container behaviour ---------------------------------------------------

def test_events_are_sorted_and_can_be_filtered():
    timeline = Timeline([comm(1, 5, 6), compute(0, 3, 4), compute(1, 0, 1, "forward"),
                         compute(0, 1, 2)])
    assert [(e.rank, e.start) for e in timeline] == [(0, 1), (0, 3), (1, 0), (1, 5)]
    assert timeline.ranks == [0, 1] and len(timeline) == 4
    assert [e.start for e in timeline.for_rank(1)] == [0, 5]
    assert len(timeline.filter(kind=COMM)) == 1
    assert [e.rank for e in timeline.filter(name="forward")] == [1]
    with pytest.raises(ValueError, match="unknown event kind"):
        Timeline([Event(0, "x", "memcpy", 0, 1)])


# ---- Chrome trace ----------------------------------------------------------

def test_chrome_trace_is_json_in_microseconds_with_named_lanes(tmp_path):
    events = [compute(0, 1000.0, 1000.002, "forward"),
              comm(1, 1000.001, 1000.004, nbytes=64, emulated_s=0.001)]
    path = tmp_path / "trace.json"
    Timeline(events).to_chrome_trace(path)
    trace = json.loads(path.read_text())
    assert trace["displayTimeUnit"] == "ms"
    spans = [t for t in trace["traceEvents"] if t["ph"] == "X"]
    assert [(t["name"], t["cat"], t["pid"], t["tid"]) for t in spans] == [
        ("forward", COMPUTE, 0, 0), ("gloo:all_reduce", COMM, 1, 1)]
    assert [t["ts"] for t in spans] == pytest.approx([0, 1000], abs=1e-3)
    assert [t["dur"] for t in spans] == pytest.approx([2000, 3000], abs=1e-3)
    assert spans[1]["args"] == {"nbytes": 64, "emulated_s": pytest.approx(0.001),
                                "op": "all_reduce"}
    names = {(t["name"], t["pid"], t["tid"]): t["args"]["name"]
             for t in trace["traceEvents"] if t["ph"] == "M"}
    assert names[("process_name", 1, 0)] == "rank 1"
    assert names[("thread_name", 0, 0)] == "compute"
    assert names[("thread_name", 1, 1)] == "communication"


def test_chrome_trace_round_trips_within_a_microsecond(tmp_path):
    original = Timeline(ddp_step(0, slow_bucket=1) + ddp_step(1, skew=0.3))
    path = tmp_path / "trace.json"
    original.to_chrome_trace(path)
    back = Timeline.from_chrome_trace(path)
    assert len(back) == len(original)
    for a, b in zip(original, back):
        assert (a.rank, a.name, a.kind, a.nbytes, a.op) == (b.rank, b.name, b.kind, b.nbytes, b.op)
        assert (b.start, b.end, b.emulated_s) == pytest.approx(
            (a.start, a.end, a.emulated_s), abs=1e-6)


# ---- drawing ---------------------------------------------------------------

def lane_labels(ax):
    return [label.get_text() for label in ax.get_yticklabels()]


@pytest.mark.parametrize("ranks", [2, 8])
def test_plot_has_a_compute_and_a_comm_lane_per_rank_and_a_legend(ranks):
    timeline = Timeline([e for r in range(ranks) for e in ddp_step(r, 0.2 * r, 2)])
    figure = timeline.plot(title="bucketed")
    assert isinstance(figure, Figure)
    ax, = figure.axes
    assert len(lane_labels(ax)) == 2 * ranks
    assert lane_labels(ax)[:2] == ["rank 0 compute", "rank 0 comm"]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    # compute in colours by phase, from the names' leading words
    assert legend == ["forward", "backward", "optimizer", "communication",
                      "emulated (slow link)"]
    assert ax.get_title() == "bucketed"
    hatched = [p.get_width() for p in ax.patches if p.get_hatch()]
    assert hatched == pytest.approx([3.0] * ranks)  # each rank's 3 ms emulated tail
    assert ax.get_xlim()[0] == 0 and ax.get_xlim()[1] == pytest.approx(
        (max(e.end for e in timeline) - min(e.start for e in timeline)) * 1e3, rel=0.02)


def test_plot_labels_bars_only_when_events_are_few():
    few = Timeline(ddp_step(0) + ddp_step(1)).plot().axes[0]
    assert "forward" in [t.get_text() for t in few.texts]
    assert "optimizer.step" not in [t.get_text() for t in few.texts]  # 3 ms: too narrow
    wide_but_many = Timeline([compute(0, 0, 1, "forward")] * 121).plot().axes[0]
    assert len(wide_but_many.texts) == 0


def test_plot_of_hundreds_of_events_saves_to_png(tmp_path):
    timeline = Timeline(many_events(4, 125))
    assert len(timeline) > 500
    path = tmp_path / "timeline.png"
    timeline.plot().savefig(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_plot_draws_into_a_given_axes():
    figure = Figure()
    ax = figure.add_subplot()
    assert Timeline(ddp_step(0)).plot(ax=ax) is figure
    assert lane_labels(ax) == ["rank 0 compute", "rank 0 comm"]
    assert ax.get_title().startswith("1 rank · ")  # one rank: no plural
    two = Timeline(ddp_step(0) + ddp_step(1)).plot().axes[0]
    assert two.get_title().startswith("2 ranks · ")


def test_plot_stacks_concurrent_events_of_a_lane_in_rows():
    timeline = Timeline([compute(0, 0, 9), comm(0, 1, 3), comm(0, 2, 5), comm(0, 3, 6),
                         comm(0, 4, 7)])
    ax = timeline.plot().axes[0]
    comm_bars = sorted((p for p in ax.patches if p.get_facecolor() != ax.patches[0].get_facecolor()),
                       key=lambda p: p.get_x())
    assert [p.get_x() for p in comm_bars] == pytest.approx([1000, 2000, 3000, 4000])
    assert [p.get_height() for p in comm_bars] == pytest.approx([0.8 / 3] * 4)
    rows = [p.get_y() for p in comm_bars]
    assert rows[0] == rows[2]  # [3, 6] reuses the row [1, 3] freed
    assert len({rows[0], rows[1], rows[3]}) == 3  # [4, 7] overlaps all others


def test_compare_stacks_two_runs_on_a_shared_time_axis():
    naive = Timeline(naive_step(0) + naive_step(1, 0.3))
    bucketed = Timeline(ddp_step(0) + ddp_step(1, 0.3, slow_bucket=3))
    figure = Timeline.compare(naive, bucketed, labels=("naive", "bucketed DDP"))
    top, bottom = figure.axes
    assert top.get_title(loc="left").startswith("naive")
    assert bottom.get_title(loc="left").startswith("bucketed DDP")
    assert f"{bucketed.mean_overlap():.0%}" in bottom.get_title(loc="left")
    assert top.get_shared_x_axes().joined(top, bottom)
    legend = [t.get_text() for t in top.get_legend().get_texts()]
    assert "emulated (slow link)" in legend  # only the lower run emulated a slow link
    assert len(lane_labels(top)) == len(lane_labels(bottom)) == 4
    naive_ms = (max(e.end for e in naive) - min(e.start for e in naive)) * 1e3
    assert bottom.get_xlim()[1] >= naive_ms > bucketed.summary()[0]["span_s"] * 1e3


def test_a_trace_without_compute_says_how_to_mark_it():
    only_comm = Timeline([Event(0, "all_reduce", COMM, 0.0, 1.0, 8)])
    with pytest.warns(UserWarning, match="dt.trace_layers"):
        assert only_comm.mean_overlap() == 0.0
    assert "no compute was marked" in only_comm.plot().axes[0].get_title()
    marked = Timeline([Event(0, "all_reduce", COMM, 0.0, 1.0, 8),
                       Event(0, "backward", COMPUTE, 0.0, 0.5)])
    assert marked.mean_overlap() == 0.5 and "no compute" not in \
        marked.plot().axes[0].get_title()


def test_phases_have_their_own_colours_and_legend_entries():
    from ddp_teach.tracing.drawing import PHASE_COLORS
    events = [Event(0, "forward", COMPUTE, 0.0, 1.0),
              Event(0, "backward fc1", COMPUTE, 1.0, 2.0),
              Event(0, "optimizer", COMPUTE, 2.0, 3.0),
              Event(0, "bucket 0", COMM, 1.5, 2.5, 8)]
    ax = Timeline(events).plot().axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["forward", "backward", "optimizer", "communication"]
    colors = {tuple(round(c, 3) for c in bar.get_facecolor()[:3])
              for bar in ax.patches}
    assert len(colors) == 4 and len(set(PHASE_COLORS.values())) == 3
