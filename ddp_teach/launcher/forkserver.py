"""A fork server: import torch once, then fork clean workers in milliseconds.

Why: `import torch` costs over a second of CPU per process. A learner re-runs
cells dozens of times, so the kernel keeps one helper process that imported
torch (and never touched CUDA or started threads of its own) and asks it to
fork a fresh worker per rank for every run. Each worker is a new process with a
new process group, so no state leaks from one run into the next. This is the
mechanism of Python's own `multiprocessing` "forkserver" start method, used
here because the kernel must also hand each worker its output pipes.

The kernel talks to the server over a Unix socket pair: one byte that carries
the workers' pipe descriptors (SCM_RIGHTS), then a `wire` message with the job.
The server answers with the workers' pids, and later with each exit status.
Before it reports a worker's exit it ends whatever the worker left running
(its process group, and every process the server adopted as a subreaper:
see `procs`), and names those processes in the report, so a rank's children
never outlive it and never hold its output pipes open. When the kernel goes away the socket reaches end-of-file and the server kills
its workers and exits, so nothing outlives the notebook. The server also
checks that its parent is still the kernel (a process that forked the kernel
may hold the socket open too). It does not use PR_SET_PDEATHSIG as the workers
do: Linux sends that signal when the *thread* that started the process exits,
and a run from a thread that then ends would take the server with it.
"""
import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

from ddp_teach.launcher import wire
from ddp_teach.launcher.procs import become_subreaper, end_strays, kill_group
from ddp_teach.launcher.protocol import (EXIT_LAUNCHER_BUG, Exited, Ready, StartWorkers,
                                         Started)

# torch._dynamo: the first optimizer.step() in a process imports it (~1.5 s
# of CPU); imported once here, every forked worker has it for free.
PRELOADED_MODULES = ("torch", "torch.distributed", "torch.nn.parallel",
                     "torch._dynamo", "cloudpickle", "ddp_teach.launcher.worker")
FDS_PER_RANK = 3  # stdout, stderr, result
# torch reads these once, at import: a change needs a new server
IMPORT_TIME_VARS = ("TORCH_CPP_LOG_LEVEL", "TORCH_SHOW_CPP_STACKTRACES", "TORCH_LOGS")
_REAP_INTERVAL_S = 0.005
_PARENT_CHECK_S = 1.0  # how soon an idle server notices its kernel is gone
_START_LIMIT_S = 300.0  # importing torch on a loaded machine: seconds, not minutes
# A healthy server forks 64 workers in well under a second; a run's tiny
# timeout (0.001 s) is for the run, and must not cost the server its life
REPLY_LIMIT_MIN_S = 5.0
_ENTRY = "from ddp_teach.launcher.forkserver import main; main()"


def _fork_worker(sock, rank: int, all_fds: list[int], job: bytes) -> int:
    pid = os.fork()
    if pid:
        try:  # both sides set the group, so a kill right away cannot miss it
            os.setpgid(pid, pid)
        except (PermissionError, ProcessLookupError):
            pass  # the child already did it, or already exited
        return pid
    try:  # the child: becomes rank `rank`, never returns
        os.setpgid(0, 0)
        sock.close()
        mine = all_fds[rank * FDS_PER_RANK:(rank + 1) * FDS_PER_RANK]
        for fd in set(all_fds) - set(mine):  # else a dead rank's pipes stay open
            os.close(fd)
        from ddp_teach.launcher.worker import main
        main(rank, mine, job)
    except BaseException:  # a bug in the launcher itself: say so on stderr
        traceback.print_exc()
        sys.stderr.flush()
    finally:
        os._exit(EXIT_LAUNCHER_BUG)


def _serve(sock: socket.socket, kernel_pid: int) -> None:
    """Answer the kernel until it is gone, then kill the workers left."""
    workers: set[int] = set()
    # a reset or a broken pipe: the kernel died in mid-conversation
    with contextlib.suppress(ConnectionResetError, BrokenPipeError):
        _answer(sock, kernel_pid, workers)
    for pid in workers:
        kill_group(pid)
    end_strays(keep=set())  # the workers too, reaped with their leftovers


def _answer(sock: socket.socket, kernel_pid: int, workers: set[int]) -> None:
    """Fork workers on request and report their exits, until end-of-file or
    until the kernel is no longer this process's parent."""
    wire.write_message(sock.fileno(), Ready(os.getpid()))
    while True:
        wait_s = _REAP_INTERVAL_S if workers else _PARENT_CHECK_S
        readable, _, _ = select.select([sock], [], [], wait_s)
        marker, fds = socket.recv_fds(sock, 1, 253)[:2] if readable else (None, [])
        if marker == b"" or os.getppid() != kernel_pid:
            return
        if marker:
            request: StartWorkers = wire.read_message(sock.fileno())
            pids = []
            for rank in range(request.world_size):
                pids.append(_fork_worker(sock, rank, fds, request.job))
            for fd in fds:
                os.close(fd)
            workers.update(pids)
            wire.write_message(sock.fileno(), Started(pids))
        if workers:
            _report_exits(sock, workers)


def _report_exits(sock: socket.socket, workers: set[int]) -> None:
    """Report each worker that exited, once what it left running is ended.

    The worker is looked at without being reaped (WNOWAIT): while it is a
    zombie its pid, which is also its process group's id, cannot be given to
    a new process, so killing the group cannot hit a stranger."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None:
            return
        if info.si_pid not in workers:  # an adopted stray that ended: reap it
            with contextlib.suppress(ChildProcessError):
                os.waitpid(info.si_pid, 0)
            continue
        left = end_strays(keep=workers, group=info.si_pid)
        _, status = os.waitpid(info.si_pid, 0)
        workers.discard(info.si_pid)
        wire.write_message(sock.fileno(), Exited(
            info.si_pid, os.waitstatus_to_exitcode(status), left))


def main() -> None:
    """Entry point of the server process; argv[1] is its socket's fd and
    argv[2] the kernel's pid."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # interrupts are the kernel's
    # a worker asked for its stack before it set up faulthandler (a tiny
    # timeout) ignores the request instead of dying of it: inherited by fork
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    become_subreaper()  # what a worker leaves running comes to the server
    sock = socket.socket(fileno=int(sys.argv[1]))
    kernel_pid = int(sys.argv[2])
    import importlib
    for name in PRELOADED_MODULES:
        importlib.import_module(name)
    if os.getppid() == kernel_pid:  # else the kernel died while torch loaded
        _serve(sock, kernel_pid)
    os._exit(0)  # skip interpreter teardown with torch loaded (~0.6 s)


def server_env(import_env: dict[str, str]) -> dict[str, str]:
    """The fork server's environment: the kernel's, with `import_env` for
    the variables torch reads at import, and this package on PYTHONPATH."""
    package_root = str(Path(__file__).resolve().parents[2])  # holds ddp_teach/
    env = {k: v for k, v in os.environ.items() if k not in IMPORT_TIME_VARS}
    env.update(import_env)
    env["PYTHONPATH"] = os.pathsep.join(
        [package_root] + [p for p in [env.get("PYTHONPATH")] if p])
    if sys.platform == "darwin":
        # Since macOS 10.13 the Objective-C runtime kills a forked child
        # that uses a class whose +initialize another thread of the parent
        # had begun ("may have been in progress in another thread when
        # fork() was called"); `import torch` starts such threads, so the
        # workers would die. This variable, read when a process starts,
        # turns the check off (Apple's objc4 runtime; CPython made "spawn"
        # the default on macOS for the same hazard, bpo-33725).
        env["OBJC_DISABLE_INITIALIZE_FORK_SAFETY"] = "YES"
    return env


class ForkServer:
    """The kernel's handle on its fork server: start once, fork per run."""

    def __init__(self, import_env: dict[str, str]):
        """import_env: variables torch must see when it is imported."""
        ours, theirs = socket.socketpair()
        self.import_env = import_env
        self.process = subprocess.Popen(
            [sys.executable, "-c", _ENTRY, str(theirs.fileno()), str(os.getpid())],
            pass_fds=[theirs.fileno()], env=server_env(import_env),
            stdin=subprocess.DEVNULL, start_new_session=True)
        theirs.close()
        self.sock = ours
        self.exit_codes: dict[int, int] = {}
        self.left_running: dict[int, list[str]] = {}  # by worker pid
        self._buffer = wire.MessageBuffer()
        self._reply = None
        try:
            hello = (wire.read_message(ours.fileno())
                     if self.wait_readable(_START_LIMIT_S) else None)
        except BaseException:  # an interrupt while torch loads: no one else
            self.sock.close()  # holds this server, so it must not outlive us
            self.process.kill()
            self.process.wait()
            raise
        if not isinstance(hello, Ready):
            self.process.kill()  # it may be alive but stuck: do not wait for it
            self.close()
            raise RuntimeError(
                "ddp_teach could not start its worker server (the process "
                "that imports torch once): it ended or did not answer within "
                f"{_START_LIMIT_S:g} s. Check that `python -c 'import torch'` "
                "works in this environment.")

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def start_workers(self, world_size: int, job: bytes, fds: list[int],
                      timeout_s: float):
        """Fork `world_size` workers; returns their pids in rank order.
        A server that does not take the request and answer within timeout_s,
        or REPLY_LIMIT_MIN_S if longer (one stopped with SIGSTOP, say), is
        killed, and TimeoutError raised."""
        timeout_s = max(timeout_s, REPLY_LIMIT_MIN_S)
        deadline = time.monotonic() + timeout_s
        try:
            self.sock.settimeout(timeout_s)  # the send honours the deadline too
            socket.send_fds(self.sock, [b"J"], fds)
            self.sock.sendall(wire.encode(StartWorkers(world_size, job)))
        except (BrokenPipeError, ConnectionResetError):
            raise self._died() from None
        except TimeoutError:
            raise self._no_answer(timeout_s) from None
        finally:
            self.sock.settimeout(None)
        while self._reply is None:
            if not self.wait_readable(deadline - time.monotonic()):
                raise self._no_answer(timeout_s)
            self.read_notes()
        pids, self._reply = self._reply, None
        return pids

    def _no_answer(self, timeout_s: float) -> TimeoutError:
        """Kill a server that did not answer in time (its workers die with
        it: parent-death signal); the error that says so."""
        self.process.kill()
        return TimeoutError(
            f"the ddp_teach worker server (pid {self.pid}, the process that "
            f"forks the workers) did not answer within {timeout_s:g} s "
            "(was it stopped, with SIGSTOP or a debugger?); it was ended, and "
            "the next run starts a new one")

    def end_workers(self, pids, wait_s: float) -> None:
        """Kill these workers (those not reported gone) and wait up to
        wait_s for the server to report their exits."""
        for pid in pids:
            if pid not in self.exit_codes:
                kill_group(pid)
        until = time.monotonic() + wait_s
        with contextlib.suppress(ConnectionError):  # a dead server: they died too
            while (self.alive() and any(p not in self.exit_codes for p in pids)
                   and self.wait_readable(until - time.monotonic())):
                self.read_notes()

    def read_notes(self) -> None:
        """Read what the server sent (blocks until something arrives): exit
        codes go to `exit_codes`, a pid list to the pending reply."""
        try:
            chunk = self.sock.recv(1 << 16)
        except ConnectionResetError:  # it died before reading all we sent
            chunk = b""
        if not chunk:
            raise self._died()
        for note in self._buffer.feed(chunk):
            if isinstance(note, Exited):
                self.exit_codes[note.pid] = note.code
                self.left_running[note.pid] = note.left_running
            else:
                self._reply = note.pids

    def _died(self) -> ConnectionError:
        """The error for a server found dead (killed from outside, say),
        once it is reaped."""
        self.process.wait()
        return ConnectionError("the ddp_teach worker server (the process "
                               "that forks the workers) died during the "
                               "run; the next run starts a new one")

    def wait_readable(self, timeout_s: float) -> bool:
        """True when the server has sent something within timeout_s."""
        ready, _, _ = select.select([self.sock], [], [], max(timeout_s, 0))
        return bool(ready)

    def forget(self, pids) -> None:
        """Drop the exit codes of a finished run."""
        for pid in pids:
            self.exit_codes.pop(pid, None)
            self.left_running.pop(pid, None)

    def close(self) -> None:
        """Stop the server; its end-of-file handling kills any workers."""
        self.sock.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

