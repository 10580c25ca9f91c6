"""Process hygiene: nothing a run starts may outlive it.

Every worker leads its own process group, so one `killpg` ends the worker and
anything it started (a DataLoader's helpers, say). On Linux each worker also
asks to be killed when its parent, the fork server, dies (`PR_SET_PDEATHSIG`),
which covers a server that is killed outright and never gets to clean up.
(The server itself watches its kernel instead: see `forkserver`.)

All of it is POSIX (fork, process groups, signals, descriptors passed over
a Unix socket): native Windows has none of it, so the launchers refuse to
start there (`require_posix`), and nothing here runs at import.
"""
import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


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
