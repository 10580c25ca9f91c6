"""Watch a run's workers until all return, one fails, or time runs out.

One `select` loop in the kernel reads every rank's stdout, stderr and result
pipe, so output streams live while the run goes on. A rank is finished when its
result arrived and its output pipes closed. The first failure (an exception, or
a process that died without a result) starts a short grace period in which the
other ranks' errors are collected; then the rest are killed. At the timeout
every live rank is asked for its Python stack (`faulthandler` on SIGUSR1, which
works even inside a blocking C++ collective), then killed. In every case, an
interrupt included, no worker outlives `wait()`.

A rank's output pipes close when its process and everything it started have
ended; the fork server ends what a rank left running before it reports the
rank's exit. Where something escaped it anyway (on macOS, a process in a
session of its own), the kernel stops reading that rank's output a moment
after the rank exited, so results are never held back by a pipe.
"""
import os
import selectors
import signal
import time

from ddp_teach.launcher import errors
from ddp_teach.launcher.protocol import EXIT_LAUNCHER_BUG, EXIT_RESULT_PIPE_LOST
from ddp_teach.launcher.procs import kill_group, signal_quietly
from ddp_teach.launcher.protocol import Failed
from ddp_teach.launcher.wire import MessageBuffer

FAILURE_GRACE_S = 1.0   # time for other ranks' errors to arrive after the first
STACK_WAIT_S = 1.0      # time for hung ranks to write their stacks
REAP_WAIT_S = 3.0       # time for killed workers to be reaped
LATE_OUTPUT_GRACE_S = 1.0  # a rank that exited: time for its pipes to close


class RankPipes:
    """The kernel's end of one rank: its pid and its three pipes."""

    def __init__(self, rank: int, pid: int, out_fd: int, err_fd: int, res_fd: int):
        self.rank, self.pid = rank, pid
        self.open_fds = {out_fd: "out", err_fd: "err", res_fd: "result"}
        self.buffer = MessageBuffer()
        self.outcome = None       # the worker's message: value or error
        self.failed_at = None     # when the kernel learnt it failed (monotonic)
        self.failed_wall = None   # when it failed (wall clock, shared by ranks)
        self.exited_at = None     # when the kernel learnt its process exited

    def streams_closed(self) -> bool:
        return not any(kind != "result" for kind in self.open_fds.values())

    def reported(self) -> bool:
        return self.outcome is not None or self.failed_at is not None


class Monitor:
    def __init__(self, server, ranks: list[RankPipes], router, timeout: float,
                 stack_files: list[str], debug_detail: bool = False):
        self.server, self.ranks, self.router = server, ranks, router
        self.timeout, self.stack_files = timeout, stack_files
        self.debug_detail = debug_detail  # TORCH_DISTRIBUTED_DEBUG=DETAIL
        self.notes: list[str] = []  # what a successful run should warn about
        self.started = time.monotonic()
        self.selector = None  # made by wait(), which closes it

    def wait(self) -> list[dict]:
        """Each rank's outcome message, in rank order; raises on failure."""
        self.selector = selectors.DefaultSelector()  # no FD_SETSIZE limit
        try:
            self.selector.register(self.server.sock, selectors.EVENT_READ, None)
            for rank in self.ranks:
                for fd in rank.open_fds:
                    self.selector.register(fd, selectors.EVENT_READ, rank)
            return self._loop()
        except BaseException:  # KeyboardInterrupt too: stop everything first
            self._stop_all()
            raise
        finally:
            self.selector.close()
            for rank in self.ranks:
                for fd in rank.open_fds:
                    os.close(fd)
                rank.open_fds.clear()
            self.router.finish()

    def _loop(self) -> list[dict]:
        deadline = self.started + self.timeout
        while True:
            failed = [r for r in self.ranks if r.failed_at is not None]
            if not failed:
                self._stop_reading_late_output()
            if not failed and all(r.outcome and r.streams_closed() for r in self.ranks):
                self._await_exits()
                left = [p for r in self.ranks
                        for p in self.server.left_running.get(r.pid, [])]
                if left:
                    self.notes.append(_left_running_note(left))
                return [r.outcome for r in self.ranks]
            now = time.monotonic()
            if failed and (now > min(r.failed_at for r in failed) + FAILURE_GRACE_S
                           or all(r.reported() for r in self.ranks)):
                self._raise_failure()
            if now >= deadline:
                self._raise_timeout()
            self._pump(min(deadline - now, 0.1))

    def _pump(self, wait_s: float) -> None:
        """Wait up to wait_s for any pipe to have data, then handle it all."""
        for key, _ in self.selector.select(max(wait_s, 0)):
            rank, fd = key.data, key.fd
            if rank is None:
                self._read_server_notes()
                continue
            chunk = os.read(fd, 1 << 16)
            kind = rank.open_fds[fd]
            if kind == "result":
                self._on_result(rank, chunk)
            elif chunk:
                self.router.feed(rank.rank, kind, chunk)
            else:
                self.router.close(rank.rank, kind)
            if not chunk:
                self.selector.unregister(fd)
                del rank.open_fds[fd]
                os.close(fd)

    def _stop_reading_late_output(self) -> None:
        """Close the output pipes of ranks that returned and exited a while
        ago but whose pipes are still held open by something they started."""
        now = time.monotonic()
        for rank in self.ranks:
            if (rank.streams_closed() or not rank.outcome
                    or rank.pid not in self.server.exit_codes):
                continue
            if rank.exited_at is None:
                rank.exited_at = now
            elif now > rank.exited_at + LATE_OUTPUT_GRACE_S:
                for fd, kind in list(rank.open_fds.items()):
                    if kind != "result":
                        self.selector.unregister(fd)
                        del rank.open_fds[fd]
                        os.close(fd)
                        self.router.close(rank.rank, kind)
                self.notes.append(
                    f"rank {rank.rank} returned and exited, but a process it "
                    f"started still held its output open {LATE_OUTPUT_GRACE_S:g} s "
                    "later (one that left the rank's process group); the run "
                    "did not wait for it, and what it prints is not shown.")

    def _on_result(self, rank: RankPipes, chunk: bytes) -> None:
        for message in rank.buffer.feed(chunk):
            rank.outcome = message
            if isinstance(message, Failed):
                rank.failed_at, rank.failed_wall = time.monotonic(), message.at
        if not chunk and rank.outcome is None:  # died without a word
            rank.failed_at, rank.failed_wall = time.monotonic(), time.time()

    def _await_last_words(self, ranks: list[RankPipes]) -> None:
        """Read what ranks that died left in their pipes, and their exit
        codes (both arrive a little after the result pipe closes)."""
        until = time.monotonic() + FAILURE_GRACE_S
        while (time.monotonic() < until
               and not all(rank.streams_closed() for rank in ranks)):
            self._pump(0.05)
        self._await_exits(ranks, wait_s=max(until - time.monotonic(), 0))

    def _death_report(self, rank: RankPipes) -> Failed:
        """What to say about a rank that exited without sending a result."""
        code = self.server.exit_codes.get(rank.pid)
        last_stderr = self.router.last_stderr(rank.rank)
        if code == EXIT_LAUNCHER_BUG:
            return Failed("LauncherError",
                          "ddp_teach's own worker code failed; its traceback "
                          "is in the rank's output above. Please report it.",
                          last_stderr=last_stderr)
        if code == EXIT_RESULT_PIPE_LOST:
            return Failed("ResultPipeClosed",
                          "the function closed file descriptors it had not "
                          "opened (os.closerange, say), among them the pipe "
                          "the rank sends its result on, so the result was "
                          "lost. Close only the descriptors the function "
                          "opened itself.", last_stderr=last_stderr)
        if code is None:  # the fork server died too: no exit code to read
            how = "ended"
        elif code < 0:
            how = f"was killed by signal {signal.Signals(-code).name}"
        else:
            how = f"exited with code {code}"
        message = (f"the process {how} before the function returned "
                   "(os._exit(), a crash in C/C++ code, the out-of-memory "
                   "killer, or a kill from outside)")
        if code == -signal.SIGSEGV and self.debug_detail:
            message += errors.DETAIL_CRASH_HINT
        return Failed("WorkerDied", message, last_stderr=last_stderr)

    def _raise_failure(self):
        self._await_last_words([r for r in self.ranks
                                if r.failed_at is not None and r.outcome is None])
        failed = [r for r in self.ranks if r.failed_at is not None]
        # A process that died without a word comes first: peers' errors are
        # usually echoes of it ("connection closed by peer"). Then by when the
        # failure happened on its rank, not when the kernel heard of it.
        failed.sort(key=lambda r: (r.outcome is not None, r.failed_wall))
        failures = {r.rank: r.outcome if r.outcome else self._death_report(r)
                    for r in failed}
        stopped = [r.rank for r in self.ranks if not r.reported()]
        returned = [r.rank for r in self.ranks if r.outcome and r.failed_at is None]
        self._stop_all()
        message = errors.failure_message(failures, [r.rank for r in failed],
                                         stopped, returned)
        raise errors.WorkerError(
            message, {r: errors.failure_details(f) for r, f in failures.items()},
            failed[0].rank)

    def _raise_timeout(self):
        live = [r for r in self.ranks if not r.reported()]
        if not live:
            self._raise_exit_timeout()
        for rank in live:
            signal_quietly(rank.pid, signal.SIGUSR1)
        until = time.monotonic() + STACK_WAIT_S
        while time.monotonic() < until and not all(
                r.reported() or _read_text(self.stack_files[r.rank]) for r in live):
            self._pump(0.05)  # keep output flowing while stacks are written
        time.sleep(0.05)  # let a dump that just started finish
        # both lists at one moment: a rank that returned while the stacks
        # were written is among the finished, not the running
        live = [r for r in live if not r.reported()]
        if not live:  # every rank reported meanwhile: its results are kept
            until = time.monotonic() + REAP_WAIT_S  # once it has exited
            while time.monotonic() < until and not all(
                    r.streams_closed() for r in self.ranks):
                self._pump(0.05)
            return  # the loop returns them, or reports the failure
        finished = [r.rank for r in self.ranks if r.reported()]
        self._stop_all()
        frames = {r.rank: errors.parse_stack(_read_text(self.stack_files[r.rank]))
                  for r in live}
        stacks = {r: errors.format_frames(f) for r, f in frames.items()}
        in_collective = {r: errors.collective_of(f) for r, f in frames.items()}
        outside = [r for r in stacks if not in_collective[r]]
        suspect = (outside or sorted(stacks))[0]
        raise errors.WorkerTimeout(
            errors.timeout_message(self.timeout, stacks, in_collective,
                                   finished, suspect),
            stacks, suspect, stacks, in_collective)

    def _raise_exit_timeout(self):
        """Every rank returned, but some never exited (seen with torch 2.6,
        whose gloo destroy_process_group could hang): no stack to show."""
        lingering = [r for r in self.ranks if not r.streams_closed()]
        for rank in lingering:  # its process group: what it started holds the pipes
            kill_group(rank.pid)
        self._stop_all()
        lingering = [r.rank for r in lingering]
        raise errors.WorkerTimeout(
            f"every rank returned its result, but rank(s) "
            f"{', '.join(map(str, lingering))} had not exited after "
            f"timeout={self.timeout:g} s: stuck while shutting down (in "
            f"destroy_process_group, or a thread that never ends). Every worker "
            f"was stopped.", {}, lingering[0] if lingering else 0, {}, {})

    def _stop_all(self) -> None:
        """Kill every worker not yet reaped, then read what they left."""
        for rank in self.ranks:
            if rank.pid not in self.server.exit_codes:
                kill_group(rank.pid)
        until = time.monotonic() + REAP_WAIT_S
        while time.monotonic() < until and not all(
                rank.streams_closed() for rank in self.ranks):
            self._pump(0.05)
        self._await_exits()

    def _await_exits(self, ranks=None, wait_s: float = REAP_WAIT_S) -> None:
        """Wait until the fork server has reaped these ranks' processes."""
        ranks = self.ranks if ranks is None else ranks
        until = time.monotonic() + wait_s
        while (self.server.alive() and time.monotonic() < until
               and any(r.pid not in self.server.exit_codes for r in ranks)):
            if self.server.wait_readable(until - time.monotonic()):
                self._read_server_notes()

    def _read_server_notes(self) -> None:
        """Exit codes from the fork server. If the server itself died, its
        workers die with it (parent-death signal); kill them to be sure."""
        try:
            self.server.read_notes()
        except ConnectionError:
            for rank in self.ranks:
                kill_group(rank.pid)
            self.selector.unregister(self.server.sock)
            raise


def _read_text(path: str) -> str:
    """A rank's stack file; empty while the rank has not yet created it (a
    timeout that fires while the workers are still starting)."""
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def _left_running_note(left: list[str], named: int = 5) -> str:
    """The warning for processes the ranks left running. Not per rank: when
    ranks end at the same moment, the server cannot tell whose a process
    that left its rank's group was."""
    more = f"; and {len(left) - named} more" if len(left) > named else ""
    return (f"the function left {len(left)} process"
            f"{'es' if len(left) > 1 else ''} running when its rank ended, "
            f"stopped with it: {'; '.join(left[:named])}{more}. Wait for what "
            "a function starts before it returns (Popen.wait(), or "
            "subprocess.run).")
