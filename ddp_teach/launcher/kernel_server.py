"""The kernel's one fork server, and the rule that one run uses it at a time.

The server is started by the first run, reused by the next ones, and replaced
when it died or when a run sets a variable torch reads only at import.

Runs take turns. Every run talks to the server over the same socket, and the
server's notes (the workers' pids, each exit code) name no run: two runs at
once would read each other's notes, and one would wait for ever for a note the
other had taken. So a `dt.run` from a second thread waits until the run in
progress has finished, as a second job on a busy GPU queues; every run ends,
at the latest after its own timeout, and an interrupt stops the wait. A run
started from inside a run on the same thread (from a replaced `sys.stdout`,
say) could never get its turn, so it is refused with an error instead.
"""
import atexit
import contextlib
import threading

from ddp_teach.launcher.forkserver import IMPORT_TIME_VARS, ForkServer

_server: ForkServer | None = None
_turn = threading.Lock()
_turn_holder: int | None = None  # the thread whose run has the turn


@contextlib.contextmanager
def one_run_at_a_time():
    """Wait for the turn to use the fork server; hold it inside the block."""
    global _turn_holder
    if _turn_holder == threading.get_ident():
        raise RuntimeError(
            "dt.run (or dt.shutdown) was called from inside another dt.run on "
            "the same thread (from code the first run calls back, such as a "
            "replaced sys.stdout); a run cannot wait for itself to finish. "
            "Start the second run after the first one has returned.")
    with _turn:
        _turn_holder = threading.get_ident()
        try:
            yield
        finally:
            _turn_holder = None


def fork_server(run_env: dict[str, str]) -> ForkServer:
    """The running fork server, or a new one when there is none, it died, or
    the run sets a variable that torch only reads at import time (such as
    TORCH_CPP_LOG_LEVEL) to a value the server's torch did not see. Called
    by a run that has the turn."""
    global _server
    import_env = {k: run_env[k] for k in IMPORT_TIME_VARS if k in run_env}
    if _server is not None and (not _server.alive()
                                or _server.import_env != import_env):
        stop_server()
    if _server is None:
        _server = ForkServer(import_env)
    return _server


def current_fork_server() -> ForkServer | None:
    """The fork server later runs will reuse, or None before the first run
    (and after `shutdown`)."""
    return _server


def shutdown() -> None:
    """Stop the fork server (the next run starts a new one); a run in
    progress on another thread finishes first."""
    with one_run_at_a_time():
        stop_server()


def stop_server() -> None:
    """Stop the fork server now; for a run that has the turn, and at exit
    (where a run left on a daemon thread must not delay the exit)."""
    global _server
    if _server is not None:
        _server.close()
        _server = None


atexit.register(stop_server)
