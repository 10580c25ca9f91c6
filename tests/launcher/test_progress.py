"""dt.progress: a worker's reports become bars (or lines), not cell text.

The worker side must be silent outside dt.run and rate-limited inside it;
the kernel side must take every report out of the printed output (also one
that lands after a learner's unfinished line) and show the last state of
each rank. The bars in a real browser are tested in
tests/notebooks/test_browser.py.
"""
import io
import json

import pytest

import ddp_teach as dt
from ddp_teach.launcher import progress_bars as progress_module
from ddp_teach.launcher.output import OutputRouter
from ddp_teach.launcher.progress_bars import MARK, ProgressBars, describe


def report_line(step, total, **metrics):
    return MARK + json.dumps({"step": step, "total": total, "metrics": metrics})


def test_outside_a_run_progress_does_nothing(capsys):
    dt.progress(1, 10, loss=0.5)
    assert capsys.readouterr().out == ""


def test_a_worker_reports_at_most_ten_times_a_second_and_always_the_last(
        monkeypatch, capsys):
    clock = iter([0.0, 0.01, 0.02, 0.15, 0.16, 0.17])
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: next(clock))
    progress_module.report_to_kernel()
    try:
        for step in range(1, 7):
            dt.progress(step, 6, loss=step / 10)
    finally:
        monkeypatch.setattr(progress_module, "_reporting", False)
    lines = capsys.readouterr().out.split("\n")[:-1]  # (splitlines also splits at \\x1e)
    sent = [json.loads(line.removeprefix(MARK)) for line in lines]
    assert [r["step"] for r in sent] == [1, 4, 6]    # 0 s, 0.15 s, the last
    assert sent[-1]["metrics"] == {"loss": 0.6}


class Recorded:
    def __init__(self):
        self.updates = []

    def update(self, rank, report):
        self.updates.append((rank, report["step"], describe(report)))


def test_the_router_draws_reports_and_prints_everything_else(tmp_path, monkeypatch):
    monkeypatch.setattr(progress_module, "_widgets_can_show", lambda: False)
    out, err = io.StringIO(), io.StringIO()
    bars = ProgressBars(2, out)
    recorded = Recorded()
    bars._view = recorded   # the view a front end would get
    router = OutputRouter(2, str(tmp_path), out, err, progress=bars)
    chunk = ("epoch 1\n" + report_line(3, 10, loss=1.5) + "\n"
             "no newline yet" + report_line(4, 10) + "\n").encode()
    router.feed(1, "out", chunk[:17])     # a report split across two reads
    router.feed(1, "out", chunk[17:])
    router.close(1, "out")
    router.finish()
    assert out.getvalue() == "[rank 1] epoch 1\n[rank 1] no newline yet\n"
    assert recorded.updates == [(1, 3, "3/10  loss 1.5"), (1, 4, "4/10")]
    assert (tmp_path / "rank1.log").read_bytes() == chunk   # the log keeps all


def test_without_a_front_end_each_rank_prints_a_line_at_most_once_a_second(
        tmp_path, monkeypatch):
    monkeypatch.setattr(progress_module, "_widgets_can_show", lambda: False)
    clock = iter([0.0, 0.5, 0.6, 1.2])
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    bars = ProgressBars(2, out)
    for rank, step in [(0, 1), (0, 2), (1, 2), (0, 10)]:
        assert bars.take(rank, report_line(step, 10, loss=0.25)) is None
    assert out.getvalue().splitlines() == [
        "[rank 0] progress 1/10  loss 0.25",
        "[rank 1] progress 2/10  loss 0.25",   # another rank: its own clock
        "[rank 0] progress 10/10  loss 0.25",  # the last step: always shown
    ]


def reporting_worker(rank, world_size):
    for step in range(1, 4):
        print(f"step {step}")
        dt.progress(step, 3, loss=1.0 / step)
    return rank


def test_a_run_shows_the_progress_and_prints_no_marker(capfd):
    assert dt.run(reporting_worker, 2) == [0, 1]
    printed = capfd.readouterr().out
    assert "\x1e" not in printed
    for rank in range(2):
        assert f"[rank {rank}] step 3" in printed
        assert f"[rank {rank}] progress 3/3  loss 0.3333" in printed  # the last


def test_a_total_of_zero_steps_is_drawn_without_dividing_by_zero(monkeypatch):
    monkeypatch.setattr(progress_module, "_widgets_can_show", lambda: False)
    out = io.StringIO()
    ProgressBars(1, out).take(0, report_line(0, 0))
    assert out.getvalue() == "[rank 0] progress 0/0\n"


def test_a_value_that_is_not_a_number_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(progress_module, "_reporting", True)
    monkeypatch.setattr(progress_module, "_last_sent", None)
    with pytest.raises(TypeError, match=r"dt.progress\(loss='low'\).*must be numbers"):
        dt.progress(1, 2, loss="low")
