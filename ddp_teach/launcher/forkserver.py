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
When the kernel goes away the socket reaches end-of-file and the server kills
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
import traceback
from pathlib import Path

from ddp_teach.launcher import wire
from ddp_teach.launcher.procs import kill_group
from ddp_teach.launcher.protocol import Exited, Ready, StartWorkers, Started

# torch._dynamo: the first optimizer.step() in a process imports it (~1.5 s
# of CPU); imported once here, every forked worker has it for free.
PRELOADED_MODULES = ("torch", "torch.distributed", "torch.nn.parallel",
                     "torch._dynamo", "cloudpickle", "ddp_teach.launcher.worker")
FDS_PER_RANK = 3  # stdout, stderr, result
EXIT_LAUNCHER_BUG = 70  # a worker whose launcher code failed (see its stderr)
# torch reads these once, at import: a change needs a new server
IMPORT_TIME_VARS = ("TORCH_CPP_LOG_LEVEL", "TORCH_SHOW_CPP_STACKTRACES", "TORCH_LOGS")
_REAP_INTERVAL_S = 0.005
_PARENT_CHECK_S = 1.0  # how soon an idle server notices its kernel is gone
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
        while workers:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            workers.discard(pid)
            code = os.waitstatus_to_exitcode(status)
            wire.write_message(sock.fileno(), Exited(pid, code))


def main() -> None:
    """Entry point of the server process; argv[1] is its socket's fd and
    argv[2] the kernel's pid."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # interrupts are the kernel's
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
        self._buffer = wire.MessageBuffer()
        self._reply = None
        try:
            hello = wire.read_message(ours.fileno())
        except BaseException:  # an interrupt while torch loads: no one else
            self.sock.close()  # holds this server, so it must not outlive us
            self.process.kill()
            self.process.wait()
            raise
        if not isinstance(hello, Ready):
            self.close()
            raise RuntimeError(
                "ddp_teach could not start its worker server (the process "
                "that imports torch once). Check that `python -c 'import torch'` "
                "works in this environment.")

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def start_workers(self, world_size: int, job: bytes, fds: list[int]):
        """Fork `world_size` workers; returns their pids in rank order."""
        try:
            socket.send_fds(self.sock, [b"J"], fds)
            wire.write_message(self.sock.fileno(), StartWorkers(world_size, job))
        except (BrokenPipeError, ConnectionResetError):
            raise self._died() from None
        while self._reply is None:
            self.read_notes()
        pids, self._reply = self._reply, None
        return pids

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

    def close(self) -> None:
        """Stop the server; its end-of-file handling kills any workers."""
        self.sock.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

