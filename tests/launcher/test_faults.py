"""The fault matrix: every way a run can go wrong ends within timeout + 5 s
with an error that names the culprit, leaves no process behind (the autouse
fixture in conftest.py checks), and the next run works."""
import os
import signal
import threading
import time

import psutil
import pytest
import torch
import torch.distributed as dist

import ddp_teach as dt
from ddp_teach.launcher.output import GLOO_CONNECTED

TIMEOUT = 6.0
SLACK = 5.0  # the contract: every fault ends within timeout + 5 s


def all_reduce_ones(rank, world_size):
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def run_expecting(error_type, fn, world_size=2, **options):
    """Run a faulty job; check its error type and that it ended in time and
    that a healthy run works right after."""
    options.setdefault("timeout", TIMEOUT)
    started = time.monotonic()
    with pytest.raises(error_type) as info:
        dt.run(fn, world_size, **options)
    assert time.monotonic() - started < options["timeout"] + SLACK
    assert dt.run(all_reduce_ones, 2) == [2.0, 2.0]
    return info.value


def raise_on_rank_one(rank, world_size):
    if rank == 1:
        raise ValueError("planted failure on rank one")
    dist.barrier()


def test_exception_on_one_rank_names_rank_type_message_and_source_line():
    err = run_expecting(dt.WorkerError, raise_on_rank_one, 3)
    assert err.first_rank == 1
    assert str(err).startswith("rank 1 failed with ValueError: planted failure")
    assert 'raise ValueError("planted failure on rank one")' in err.failures[1]
    assert "in raise_on_rank_one" in err.failures[1]
    assert "worker.py" not in err.failures[1]  # the launcher's frames are hidden
    assert isinstance(err, RuntimeError)


def test_exception_on_every_rank_reports_them_all():
    def fail(rank, world_size):
        raise KeyError(f"rank {rank} key")

    err = run_expecting(dt.WorkerError, fail, 3)
    assert sorted(err.failures) == [0, 1, 2]
    assert all(f"rank {r} key" in err.failures[r] for r in range(3))
    assert "failed too" in str(err)


def test_os_exit_is_reported_with_its_exit_code():
    def exit_three(rank, world_size):
        if rank == 1:
            print("last words before exiting", flush=True)
            os._exit(3)
        dist.barrier()

    err = run_expecting(dt.WorkerError, exit_three)
    assert err.first_rank == 1
    assert "exited with code 3" in str(err)


def test_rank_killed_mid_collective_is_named_as_the_first_failure():
    def killed(rank, world_size):
        if rank == 1:
            time.sleep(0.5)  # rank 0 is inside all_reduce by now
            os.kill(os.getpid(), signal.SIGKILL)
        return all_reduce_ones(rank, world_size)

    err = run_expecting(dt.WorkerError, killed)
    assert err.first_rank == 1
    assert "killed by signal SIGKILL" in str(err)


def test_fork_server_killed_mid_run_ends_the_run_and_is_replaced():
    from ddp_teach import launcher
    dt.run(all_reduce_ones, 2)
    threading.Timer(1.0, launcher.current_fork_server().process.kill).start()
    run_expecting(ConnectionError, lambda r, w: time.sleep(600), timeout=30.0)


def mismatched(rank, world_size):
    t = torch.ones(4)
    if rank == 0:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=0)
    return t.tolist()


def test_mismatched_collectives_end_in_a_clear_error():
    run_expecting(dt.WorkerError, mismatched)


def test_rank_aborted_in_c_shows_the_cause_from_its_stderr():
    def shapes_differ(rank, world_size):
        dist.all_reduce(torch.ones(4 if rank == 0 else 8))  # gloo aborts a rank

    err = run_expecting(dt.WorkerError, shapes_differ)
    cause = "Received data size doesn't match expected size"
    assert "killed by signal SIGABRT" in str(err)
    assert cause in str(err)
    assert cause in err.failures[err.first_rank]


def test_debug_mode_names_the_mismatched_collectives():
    err = run_expecting(dt.WorkerError, mismatched, debug=True)
    assert "mismatch between collectives" in str(err)
    assert "ALLREDUCE" in str(err) and "BROADCAST" in str(err)


def test_rank_that_returns_without_the_collective_is_pointed_at():
    def skip(rank, world_size):
        if rank == 1:
            return "skipped"
        return all_reduce_ones(rank, world_size)

    err = run_expecting((dt.WorkerError, dt.WorkerTimeout), skip)
    assert "rank 1 had already returned" in str(err)


def test_rank_that_never_calls_the_collective_times_out_with_stacks():
    def stall(rank, world_size):
        if rank == 1:
            time.sleep(600)  # the planted hang: rank 0 waits in all_reduce
        return all_reduce_ones(rank, world_size)

    err = run_expecting(dt.WorkerTimeout, stall, timeout=3.0)
    assert isinstance(err, TimeoutError) and isinstance(err, dt.WorkerError)
    assert err.first_rank == 1  # the rank outside the collective is the suspect
    assert err.in_collective == {0: "all_reduce", 1: None}
    assert "time.sleep(600)" in err.stacks[1]  # source line from the cell's file
    assert "dist.all_reduce(t)" in err.stacks[0]
    assert "look at rank 1 first" in str(err)


def test_infinite_loop_times_out_showing_the_loop():
    def spin(rank, world_size):
        n = 0
        while True:
            n += 1

    err = run_expecting(dt.WorkerTimeout, spin, timeout=2.0)
    assert sorted(err.stacks) == [0, 1]
    assert all("n += 1" in err.stacks[r] or "while True" in err.stacks[r]
               for r in (0, 1))


def test_ten_megabytes_of_output_all_reach_the_log_and_the_cell_is_capped(capsys):
    line = "x" * 99 + "\n"

    def chatty(rank, world_size):
        import sys
        for _ in range(100_000):  # 10 MB per rank
            sys.stdout.write(line)
        return rank

    result = dt.run(chatty, 2, timeout=60)
    assert result == [0, 1]
    shown = capsys.readouterr()
    assert "the cell shows only the first" in shown.err
    assert len(shown.out) <= 1_100_000
    for rank in (0, 1):
        with open(os.path.join(result.log_dir, f"rank{rank}.log")) as log:
            # less what torch 2.8-2.10's gloo prints when it connects
            kept = GLOO_CONNECTED.sub("", log.read()).lstrip("\n")
        assert kept == line * 100_000


def test_keyboard_interrupt_stops_every_worker_and_the_next_run_works():
    def sleeper(rank, world_size):
        time.sleep(600)

    timer = threading.Timer(1.5, lambda: signal.raise_signal(signal.SIGINT))
    started = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        dt.run(sleeper, 4, timeout=60)
    assert time.monotonic() - started < 1.5 + SLACK
    assert dt.run(all_reduce_ones, 2) == [2.0, 2.0]


def test_interrupt_while_the_fork_server_starts_leaves_no_server_behind(
        monkeypatch):
    from ddp_teach import launcher
    from ddp_teach.launcher import wire

    def interrupted(fd):
        raise KeyboardInterrupt  # the stop button, while torch loads

    dt.shutdown()  # so that the next run starts a server
    monkeypatch.setattr(wire, "read_message", interrupted)
    with pytest.raises(KeyboardInterrupt):
        dt.run(all_reduce_ones, 2)
    monkeypatch.undo()
    assert launcher.current_fork_server() is None
    assert psutil.Process().children(recursive=True) == []
    assert dt.run(all_reduce_ones, 2) == [2.0, 2.0]


def returns_but_hangs_while_shutting_down(rank, world_size):
    # as torch 2.6's gloo destroy_process_group could: the worker calls it
    # after sending its result, and this patch lives only in this worker
    dist.destroy_process_group = lambda *args, **kwargs: time.sleep(67)
    return rank


def test_ranks_that_returned_but_never_finished_time_out_in_words():
    started = time.monotonic()
    with pytest.raises(dt.WorkerTimeout, match=r"every rank returned its result, but "
                       r"rank\(s\) 0, 1 had not exited after timeout=3 s"):
        dt.run(returns_but_hangs_while_shutting_down, 2, timeout=3)
    assert time.monotonic() - started < 30
