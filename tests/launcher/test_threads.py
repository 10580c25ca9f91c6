"""Runs from several threads of one kernel take turns on the fork server;
none can hang waiting for a reply another run read."""
import io
import sys
import threading
import time

import pytest

import ddp_teach as dt


def now(rank, world_size):
    return time.time()


@pytest.mark.timeout(120)  # before runs took turns this could hang for ever
def test_runs_from_two_threads_take_turns(tmp_path):
    started = tmp_path / "the slow run started"

    def slow(rank, world_size):
        started.touch()
        time.sleep(1.0)
        return time.time()

    slow_ends = []
    other = threading.Thread(target=lambda: slow_ends.extend(dt.run(slow, 2)))
    other.start()
    until = time.monotonic() + 60
    while not started.exists():
        assert other.is_alive() and time.monotonic() < until, "slow run never began"
        time.sleep(0.01)
    quick_starts = [t for _ in range(5) for t in dt.run(now, 2)]
    other.join()
    assert len(slow_ends) == 2
    # the quick runs' workers began only after the slow run had returned
    assert min(quick_starts) > max(slow_ends)


class RunsOnWrite(io.StringIO):
    """A stdout replacement that starts a run from inside a run."""

    def write(self, text):
        return dt.run(now, 1)


def test_a_run_started_from_inside_a_run_is_refused(monkeypatch):
    monkeypatch.setattr(sys, "stdout", RunsOnWrite())
    with pytest.raises(RuntimeError, match="from inside another"):
        dt.run(lambda rank, world_size: print("a line"), 1)
    monkeypatch.undo()
    assert dt.run(now, 1)
