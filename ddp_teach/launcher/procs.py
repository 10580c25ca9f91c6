"""Process hygiene: nothing a run starts may outlive it.

Every worker leads its own process group, so one `killpg` ends the worker and
anything it started (a DataLoader's helpers, say). A process that leaves the
group (`start_new_session=True`, a daemon's double fork) is still caught on
Linux: the fork server and every worker are child subreapers
(`PR_SET_CHILD_SUBREAPER`, prctl(2)), so a process whose parent exits is
adopted by the nearest of them instead of by init. While a worker lives it
adopts its own orphans; when a worker ends, its leftovers are adopted by the
server, which ends them before it reports the worker's exit (`forkserver`).
On Linux each worker also asks to be killed when its parent, the fork
server, dies (`PR_SET_PDEATHSIG`), which covers a server that is killed
outright and never gets to clean up. (The server itself watches its kernel
instead: see `forkserver`.) macOS has no subreapers: there a process that
left its worker's group outlives the run.

All of it is POSIX (fork, process groups, signals, descriptors passed over
a Unix socket): native Windows has none of it, so the launchers refuse to
start there (`require_posix`), and nothing here runs at import.
"""
import ctypes
import os
import signal
import sys
import time

import psutil

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
STRAY_ROUNDS = 100  # a stray's own children are adopted when it dies: rounds
STRAY_REAP_S = 2.0  # a killed process is dead in milliseconds


def require_posix(what: str) -> None:
    """A clear error, before anything starts, where the launcher cannot run:
    native Windows, which has no fork()."""
    if sys.platform == "win32" or not hasattr(os, "fork"):
        raise RuntimeError(
            f"{what} needs Linux or macOS: it starts and watches its worker "
            f"processes with POSIX calls (fork, process groups, signals, "
            f"pipes watched with select), which native Windows does not have "
            f"(this Python runs on {sys.platform}). On Windows, run "
            f"the course inside WSL2 (in PowerShell: wsl --install; then, in "
            f"the Linux shell it opens, set the course up as the README says), "
            f"or on Colab or Kaggle.")


def set_parent_death_signal() -> None:
    """Ask Linux to SIGKILL this process when its parent exits (no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def become_subreaper() -> None:
    """Adopt this process's orphaned descendants (Linux; no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1)


def kill_group(pid: int) -> None:
    """SIGKILL a worker's whole process group; quiet if it is already gone."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # already exited and reaped: the goal is met


def signal_quietly(pid: int, sig: int) -> bool:
    """Send a signal; False when the process is already gone."""
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def end_strays(keep: set[int], group: int | None = None) -> list[str]:
    """Kill and reap `group` (a worker's process group) and every child of
    this process (the fork server) that is not in `keep`: on Linux the
    server is a subreaper, so those are processes that workers which ended
    left running. Returns the ones that were still running, as
    "pid 123: sleep 40"."""
    ended = []
    for round_ in range(STRAY_ROUNDS):
        strays = [p for p in psutil.Process().children() if p.pid not in keep]
        ended += filter(None, map(describe, strays))
        if round_ == 0 and group is not None:
            kill_group(group)
        if not strays:
            return ended
        for stray in strays:
            kill_group(stray.pid)
        if not _reap({stray.pid for stray in strays}):
            break  # another user's process (sudo, say): reaped when it ends
    return ended


def _reap(pids: set[int]) -> bool:
    """Reap these children once they are dead; False if some outlived
    STRAY_REAP_S (a kill it had no permission for), so nothing blocks."""
    until = time.monotonic() + STRAY_REAP_S
    while pids and time.monotonic() < until:
        for pid in list(pids):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # already reaped
                done = pid
            if done:
                pids.discard(pid)
        time.sleep(0.005 if pids else 0)
    return not pids


def describe(process) -> str | None:
    """"pid 123: sleep 40" for a running process; None for one already gone."""
    try:
        command = " ".join(process.cmdline()) or process.name()
    except psutil.Error:  # a zombie, or gone: nothing was left running
        return None
    return f"pid {process.pid}: {command[:120]}"
