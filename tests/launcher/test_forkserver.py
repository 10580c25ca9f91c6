"""The fork server's life: it lives as long as its kernel, not as long as the
thread that started it, and its death is reported in words, not as a raw
socket error."""
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

import ddp_teach as dt
from ddp_teach import launcher
from ddp_teach.launcher.forkserver import ForkServer


def sum_of_ranks(rank, world_size):
    return float(sum(range(world_size)))


KERNEL = """
import os, time
import ddp_teach as dt
from ddp_teach import launcher
dt.run(lambda rank, world_size: rank, 1)
print(launcher.current_fork_server().pid, flush=True)
if os.fork() == 0:  # a child of the kernel, holding the server's socket too
    time.sleep(120)
    os._exit(0)
dt.run(lambda rank, world_size: print(os.getpid(), flush=True) or time.sleep(120),
       2, timeout=300)
"""


def wait_until(condition, what: str, limit_s: float = 30.0) -> None:
    """Poll until condition() holds; fail naming `what` after limit_s."""
    until = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < until, f"gave up waiting until {what}"
        time.sleep(0.01)


def test_a_fork_server_started_from_a_thread_outlives_the_thread():
    dt.shutdown()  # the thread's run starts the server
    results = []
    starter = threading.Thread(target=lambda: results.append(
        dt.run(sum_of_ranks, 2)))
    starter.start()
    starter.join()
    # join() returns before the OS thread is gone; its exit is what matters
    wait_until(lambda: not os.path.exists(f"/proc/self/task/{starter.native_id}"),
               "the thread has exited")
    server_pid = launcher.current_fork_server().pid
    assert results == [[1.0, 1.0]]
    assert dt.run(sum_of_ranks, 2) == [1.0, 1.0]
    assert launcher.current_fork_server().pid == server_pid


@pytest.fixture
def dead_server():
    """A fork server that was killed but not yet reaped: the kernel still
    believes it alive, as when it dies between two runs."""
    server = ForkServer({})
    os.kill(server.pid, signal.SIGSTOP)
    yield server
    server.close()  # reaps it


def kill_and_wait_for_zombie(server) -> None:
    os.kill(server.pid, signal.SIGKILL)
    wait_until(lambda: psutil.Process(server.pid).status() == psutil.STATUS_ZOMBIE,
               "the server is dead")


def test_sending_to_a_dead_server_says_it_died(dead_server):
    kill_and_wait_for_zombie(dead_server)
    with pytest.raises(ConnectionError, match="worker server .* died"):
        dead_server.start_workers(1, b"job", [], timeout_s=5)


def test_a_server_that_died_with_unread_requests_says_it_died(dead_server):
    dead_server.sock.send(b"J")  # unread when it dies: the kernel sees a reset
    kill_and_wait_for_zombie(dead_server)
    with pytest.raises(ConnectionError, match="worker server .* died"):
        dead_server.read_notes()


def test_server_and_workers_end_with_their_kernel_even_if_a_fork_of_it_lives_on():
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    kernel = subprocess.Popen([sys.executable, "-c", KERNEL], env=env,
                              stdout=subprocess.PIPE, start_new_session=True)
    try:
        server = psutil.Process(int(kernel.stdout.readline()))
        workers = [psutil.Process(int(kernel.stdout.readline().split()[-1]))
                   for _ in range(2)]  # "[rank r] pid", printed mid-run
        kernel.kill()  # as a kernel killed from outside, with no clean-up
        kernel.wait()
        _, alive = psutil.wait_procs([server] + workers, timeout=30)
        assert alive == []
    finally:
        os.killpg(kernel.pid, signal.SIGKILL)  # the kernel's forked child
        kernel.stdout.close()
