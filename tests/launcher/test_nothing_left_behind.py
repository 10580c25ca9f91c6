"""Nothing left behind, whatever a worker does (issue 37): the processes a
rank starts end with it, a pipe they hold open does not hold back the
results, a line of any length costs memory bounded by the cell's limit,
every timeout is checked and honoured (the fork server's reply included),
an interrupt at any moment leaves no worker and no descriptor, run folders
go with the process that made them, and a learner's mistakes are named in
words. The conftest fixture checks after each test that no descendant of
this process is left; the sleepers below are looked for machine-wide, as a
process that escaped would have been adopted by init."""
import contextlib
import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist

import ddp_teach as dt
from ddp_teach import launcher
from ddp_teach.launcher import launch, rundirs
from ddp_teach.launcher.output import OutputRouter

def all_reduce_ones(rank, world_size):
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def running(command: list[str]) -> list[psutil.Process]:
    """Live processes anywhere on the machine with this command line."""
    return [p for p in psutil.process_iter(["cmdline", "status"])
            if p.info["cmdline"] == command
            and p.info["status"] != psutil.STATUS_ZOMBIE]


def leave_sleepers(rank, world_size, seconds, fail=False):
    """Three ways a function leaves processes running: a plain child, a child
    in a session of its own (outside the rank's process group), and an
    orphan whose parent exits at once (a daemon's double fork)."""
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    subprocess.Popen(["sleep", seconds], **quiet)
    subprocess.Popen(["sleep", seconds], start_new_session=True, **quiet)
    subprocess.Popen(["sh", "-c", f"sleep {seconds} &"], **quiet).wait()
    if fail:
        raise ValueError("planted failure after starting sleepers")
    return rank


def test_processes_a_rank_started_end_when_it_returns_and_are_named():
    with pytest.warns(RuntimeWarning, match=r"the function left 6 processes "
                      r"running when its rank ended.*sleep 41\.371"):
        assert dt.run(leave_sleepers, 2, args=("41.371",)) == [0, 1]
    assert running(["sleep", "41.371"]) == []


def test_processes_a_rank_started_end_when_it_fails():
    with pytest.raises(dt.WorkerError, match="planted failure"):
        dt.run(leave_sleepers, 2, args=("41.372", True))
    assert running(["sleep", "41.372"]) == []


def returns_while_children_hold_its_output(rank, world_size):
    subprocess.Popen(["sleep", "41.373"])  # inherits the rank's stdout and stderr
    if os.fork() == 0:  # a copy of the rank: every descriptor it has
        time.sleep(60)
        os._exit(0)
    return rank


def test_a_child_holding_the_ranks_output_does_not_hold_back_the_results():
    with pytest.warns(RuntimeWarning, match=r"left 4 processes running.*"
                      r"sleep 41\.373"):
        result = dt.run(returns_while_children_hold_its_output, 2, timeout=10)
    assert result == [0, 1]  # before: WorkerTimeout after 10 s, results lost
    assert running(["sleep", "41.373"]) == []


def hand_over_output(rank, world_size, address):
    """Give fds 1 and 2 to a process outside the rank's tree (this test's)."""
    with socket.socket(socket.AF_UNIX) as holder:
        holder.connect(address)
        socket.send_fds(holder, [b"fds"], [1, 2])
    return rank


def test_output_held_open_by_a_process_out_of_reach_does_not_hold_back_results(
        tmp_path):
    """What the kernel does where the server cannot end everything (macOS
    has no subreapers): a moment after the rank exited, it stops reading."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "holder"))
    listener.listen()
    held = []
    try:
        with pytest.warns(RuntimeWarning, match="still held its output open"):
            result = dt.run(hand_over_output, 1, args=(str(tmp_path / "holder"),),
                            timeout=20)
            connection, _ = listener.accept()  # queued: the rank connected
            held += socket.recv_fds(connection, 3, 2)[1]
            connection.close()
        assert result == [0]  # before: WorkerTimeout after 20 s
        assert len(held) == 2
    finally:
        for fd in held:
            os.close(fd)
        listener.close()


def test_a_line_without_newlines_is_held_in_memory_bounded_by_the_cell(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    router = OutputRouter(1, str(tmp_path), out, err, cell_limit=1000)
    chunk = b"z" * (1 << 16)  # what one read of a worker's pipe returns
    tracemalloc.start()
    try:
        for _ in range(160):  # 10 MiB, one line
            router.feed(0, "out", chunk)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    router.feed(0, "out", b"\nnext\n")
    router.finish()
    # before: the whole pending line, 10 MiB, copied again for every chunk
    assert held < 1 << 20
    assert "the cell shows only the first 1,000 bytes" in err.getvalue()
    assert os.path.getsize(tmp_path / "rank0.log") == 160 * len(chunk) + 6


def test_a_long_line_is_still_shown_whole_within_the_cell_limit(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    router = OutputRouter(1, str(tmp_path), out, err, cell_limit=1000)
    for piece in (b"a" * 300, b"b" * 300, b"c" * 300):
        router.feed(0, "out", piece)
    router.close(0, "out")
    router.finish()
    assert out.getvalue() == "[rank 0] " + "a" * 300 + "b" * 300 + "c" * 300 + "\n"


def test_a_timeout_before_the_ranks_are_ready_is_a_worker_timeout():
    for _ in range(2):  # before: FileNotFoundError for a stack file, at times
        with pytest.raises(dt.WorkerTimeout, match=r"did not finish within "
                           r"timeout=0\.001 s"):
            dt.run(lambda rank, world_size: time.sleep(600), 4, timeout=0.001)


def test_ranks_that_return_while_their_stacks_are_taken_keep_their_results():
    """A tiny timeout fires before the workers are ready: the request for
    stacks is ignored until they are, and ranks that return meanwhile are
    done, not stuck. Whichever way it goes, it ends in words."""
    for _ in range(2):
        try:
            assert dt.run(all_reduce_ones, 4, timeout=0.001) == [4.0] * 4
        except dt.WorkerTimeout as timeout:
            assert "did not finish within timeout=0.001 s" in str(timeout)


def loses_its_stack_file(rank, world_size):
    """As a rank that has not created its stack file yet looks to the kernel."""
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # a descriptor gone while listed
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.endswith(f"rank{rank}.stack"):
                os.remove(target)
    time.sleep(600)


def test_a_rank_with_no_stack_file_still_ends_in_a_worker_timeout():
    with pytest.raises(dt.WorkerTimeout, match="still starting, or busy in C"):
        dt.run(loses_its_stack_file, 2, timeout=2)


def returns_when_asked_for_its_stack(rank, world_size):
    if rank == 1:
        class Asked(Exception):
            pass

        def asked(signum, frame):
            raise Asked

        signal.signal(signal.SIGUSR1, asked)  # instead of faulthandler's dump
        try:
            time.sleep(600)
        except Asked:
            return "returned while the stacks were taken"
    time.sleep(600)


def test_the_timeout_message_names_each_rank_once():
    with pytest.raises(dt.WorkerTimeout) as info:
        dt.run(returns_when_asked_for_its_stack, 2, timeout=2)
    message = str(info.value)
    # before: "ranks 0, 1 were still running (rank 1 had returned)."
    assert "rank 0 was still running (rank 1 had returned)." in message
    assert sorted(info.value.stacks) == [0]


@pytest.mark.parametrize("timeout", [1e10, 1e15, float("inf")])
def test_a_timeout_beyond_a_week_is_refused_before_anything_opens(timeout):
    open_fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(ValueError, match=r"at most 604,800 \(a week\).*"
                       r"pass timeout=604800"):
        dt.run(all_reduce_ones, 2, timeout=timeout)
    assert len(os.listdir("/proc/self/fd")) == open_fds


def test_the_longest_timeout_is_accepted():
    assert dt.run(all_reduce_ones, 2, timeout=launch.MAX_TIMEOUT_S) == [2.0, 2.0]


def test_a_stopped_fork_server_does_not_stop_the_timeout():
    dt.run(all_reduce_ones, 2)
    server = launcher.current_fork_server()
    os.kill(server.pid, signal.SIGSTOP)
    # before the fix the run waited for the server for ever: wake it at last
    rescue = threading.Timer(15, lambda: os.kill(server.pid, signal.SIGCONT))
    rescue.start()
    try:
        with pytest.raises(TimeoutError, match=r"worker server .* did not "
                           r"answer within 5 s"):
            dt.run(all_reduce_ones, 2, timeout=2)
    finally:
        rescue.cancel()
    assert server.process.returncode is not None  # ended and reaped
    assert dt.run(all_reduce_ones, 2) == [2.0, 2.0]
    assert launcher.current_fork_server().pid != server.pid


@pytest.mark.parametrize("step", ["OutputRouter", "Monitor"])
def test_an_interrupt_before_the_monitor_takes_over_leaves_nothing(
        step, monkeypatch):
    dt.run(all_reduce_ones, 2)  # the server is up: its socket is not counted
    open_fds = len(os.listdir("/proc/self/fd"))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # the stop button, right after the workers started

    monkeypatch.setattr(launch, step, interrupted)
    with pytest.raises(KeyboardInterrupt):
        dt.run(lambda rank, world_size: time.sleep(600), 2, timeout=60)
    server = launcher.current_fork_server()
    assert [p for p in psutil.Process().children(recursive=True)
            if p.pid != server.pid] == []
    assert len(os.listdir("/proc/self/fd")) == open_fds
    monkeypatch.undo()
    assert dt.run(all_reduce_ones, 2) == [2.0, 2.0]


A_KERNEL = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("rundirs", sys.argv[1])
rundirs = importlib.util.module_from_spec(spec)  # alone: no torch to import
spec.loader.exec_module(rundirs)
run_dir = rundirs.new_run_dir()
if os.fork() == 0:
    sys.exit(0)  # a child of the kernel that exits normally runs atexit too
os.wait()
print(run_dir, flush=True)
sys.stdin.readline()
"""


def test_a_kernels_run_folders_stay_while_it_lives_and_go_when_it_exits(tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path))
    kernel = subprocess.Popen([sys.executable, "-c", A_KERNEL, rundirs.__file__],
                              env=env, text=True, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    run_dir = Path(kernel.stdout.readline().strip())
    assert run_dir.is_dir()  # kept for the learner, and the fork's exit left it
    kernel.communicate("\n", timeout=60)
    assert kernel.returncode == 0
    assert run_dir.parent.name == f"kernel-{kernel.pid}"
    assert not run_dir.parent.exists()


def test_a_function_that_closes_every_descriptor_is_told_so():
    def close_everything(rank, world_size):
        os.closerange(0, 65536)
        return rank

    with pytest.raises(dt.WorkerError, match="closed file descriptors it had "
                       "not opened") as info:
        dt.run(close_everything, 2)
    assert "Please report it" not in str(info.value)


def test_a_value_nested_too_deeply_is_refused_in_a_few_lines():
    def nested(rank, world_size):
        value = []
        for _ in range(100_000):
            value = [value]
        return value

    with pytest.raises(dt.WorkerError, match="cannot be sent back") as info:
        dt.run(nested, 1)
    assert len(str(info.value)) < 1000  # before: a 212 KB RecursionError
    assert len(info.value.failures[0]) < 1000


def test_a_tensor_given_to_the_courses_ddp_is_refused_in_words():
    with pytest.raises(TypeError, match=r"wraps a model \(a torch.nn.Module\); "
                       "got a Tensor"):
        dt.ddp.DistributedDataParallel(torch.ones(3))


def test_a_list_given_to_ring_allreduce_is_refused_in_words():
    with pytest.raises(TypeError, match="ring_allreduce takes a torch.Tensor.*"
                       "got a list"):
        dt.collectives.ring_allreduce([1.0, 2.0])


class OneLayerUnused(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.used, self.unused = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.used(x)


def wrap_in_torch_ddp(rank, world_size, steps):
    model = torch.nn.parallel.DistributedDataParallel(OneLayerUnused())
    for _ in range(steps):
        model(torch.ones(3, 4)).sum().backward()


@pytest.mark.skipif(not torch.__version__.startswith("2.13"),
                    reason="the crash under DETAIL is torch 2.13's")
def test_torch_ddp_crashing_under_detail_is_explained_and_info_names_parameters():
    with pytest.raises(dt.WorkerError) as info:
        dt.run(wrap_in_torch_ddp, 2, args=(0,), debug=True)
    assert "killed by signal SIGSEGV" in str(info.value)
    assert "torch 2.13's DistributedDataParallel crashes this way under DETAIL" \
        in str(info.value)
    # what the message advises works: INFO (given in env=, read by each
    # worker) names the parameters that received no gradient
    with pytest.raises(dt.WorkerError) as info:
        dt.run(wrap_in_torch_ddp, 2, args=(2,),
               env={"TORCH_DISTRIBUTED_DEBUG": "INFO"})
    assert "did not receive grad for rank" in str(info.value)
    assert "unused.weight" in info.value.failures[info.value.first_rank]
