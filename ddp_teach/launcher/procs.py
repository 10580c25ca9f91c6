"""Process hygiene: nothing a run starts may outlive it.

Every worker leads its own process group, so one `killpg` ends the worker and
anything it started (a DataLoader's helpers, say). On Linux each worker also
asks to be killed when its parent, the fork server, dies (`PR_SET_PDEATHSIG`),
which covers a server that is killed outright and never gets to clean up.
(The server itself watches its kernel instead: see `forkserver`.)
"""
import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


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
