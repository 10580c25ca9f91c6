"""Every rank's output, live in the cell, each line marked with its rank.

Workers write to their file descriptors 1 and 2 (Python prints, C++ warnings,
anything); the kernel reads those pipes and prints each finished line as
`[rank r] ...` on its own stdout or stderr, which Jupyter shows in the cell.
The whole output of each rank is also kept in a log file, so that a learner
who prints megabytes loses nothing even though the cell shows only the first
`cell_limit` bytes (a browser tab stalls on more).

torch 2.8 to 2.10 print "[Gloo] Rank r is connected to n peer ranks.
Expected number of connected peer ranks is : n" on stdout each time a gloo
group connects (every run, and every `new_group`); other releases print
nothing there. The cell leaves that line out, as it says nothing the learner
asked for; the log file keeps it, with everything else as it came.

A line still being written is kept as a list of pieces and joined once, when
it ends, so output takes time in proportion to its size whatever its line
lengths (joining the pending line to every 64 KiB chunk made 50 MB on one
line take 18 s). The pieces stop at `cell_limit` characters: a line longer
than the cell shows is never shown (only the notice is), the stderr tail
keeps a line's first characters, and the log file has every byte.
"""
import codecs
import collections
import os
import re

from ddp_teach.launcher.rundirs import create_private_file

CELL_LIMIT_BYTES = 1_000_000
STDERR_TAIL_LINES = 15    # kept per rank for the error of a rank that died
STDERR_TAIL_LINE_CHARS = 500
GLOO_CONNECTED = re.compile(r"\[Gloo\] Rank \d+ is connected to \d+ peer ranks\. "
                            r"Expected number of connected peer ranks is : \d+")


class OutputRouter:
    """Turns raw per-rank chunks into prefixed lines in the cell and logs."""

    def __init__(self, world_size: int, log_dir: str, stdout, stderr,
                 cell_limit: int = CELL_LIMIT_BYTES, progress=None):
        self._sinks = {"out": stdout, "err": stderr}
        self._progress = progress  # takes `dt.progress` reports out of stdout
        self._decoders = {(r, s): codecs.getincrementaldecoder("utf-8")("replace")
                          for r in range(world_size) for s in self._sinks}
        self._pending = {key: _PendingLine(cell_limit + 1) for key in self._decoders}
        self._stderr_tails = {r: collections.deque(maxlen=STDERR_TAIL_LINES)
                              for r in range(world_size)}
        self._logs = {r: open(create_private_file(
                          os.path.join(log_dir, f"rank{r}.log")), "wb")
                      for r in range(world_size)}
        self.log_dir = log_dir
        self._shown = 0
        self._limit = cell_limit
        self._cut = False

    def feed(self, rank: int, stream: str, chunk: bytes) -> None:
        """Take bytes a rank wrote; print the lines they complete."""
        self._logs[rank].write(chunk)
        text = self._decoders[rank, stream].decode(chunk)
        pending = self._pending[rank, stream]
        if "\n" not in text:
            pending.add(text)
            return
        first, *lines, last = text.split("\n")
        pending.add(first)
        lines.insert(0, pending.take())
        pending.add(last)
        self._keep_tail(rank, stream, lines)
        self._show(rank, stream, self._to_print(rank, stream, lines))

    def close(self, rank: int, stream: str) -> None:
        """The stream ended: print its unfinished last line, if any."""
        pending = self._pending[rank, stream]
        pending.add(self._decoders[rank, stream].decode(b"", final=True))
        tail = pending.take()
        if tail:
            self._keep_tail(rank, stream, [tail])
            self._show(rank, stream, self._to_print(rank, stream, [tail]))

    def last_stderr(self, rank: int) -> str:
        """The last lines a rank wrote to stderr (cell limit or not): a rank
        that crashed in C, gloo aborting say, tells its cause only there."""
        return "\n".join(self._stderr_tails[rank])

    def finish(self) -> None:
        for log in self._logs.values():
            log.close()
        for sink in self._sinks.values():
            sink.flush()

    def _keep_tail(self, rank: int, stream: str, lines: list[str]) -> None:
        if stream == "err":
            self._stderr_tails[rank].extend(
                line[:STDERR_TAIL_LINE_CHARS] for line in lines)

    def _to_print(self, rank: int, stream: str, lines: list[str]) -> list[str]:
        """The lines to print: not gloo's connection notices, and not the
        progress reports, which are drawn (the log file keeps everything as
        it came)."""
        lines = [line for line in lines if not GLOO_CONNECTED.fullmatch(line)]
        if stream != "out" or self._progress is None:
            return lines
        kept = (self._progress.take(rank, line) for line in lines)
        return [line for line in kept if line is not None]

    def _show(self, rank: int, stream: str, lines: list[str]) -> None:
        if not lines or self._cut:
            return
        text = "".join(f"[rank {rank}] {line}\n" for line in lines)
        self._shown += len(text)
        if self._shown > self._limit:
            self._cut = True
            text = (f"[ddp_teach] the cell shows only the first {self._limit:,} "
                    f"bytes of output; every rank's full output is in "
                    f"{self.log_dir}/rank<r>.log\n")
            stream = "err"
        self._sinks[stream].write(text)
        self._sinks[stream].flush()


class _PendingLine:
    """The start of a line not yet ended: pieces, up to `cap` characters."""

    def __init__(self, cap: int):
        self._cap, self._pieces, self._size = cap, [], 0

    def add(self, text: str) -> None:
        room = self._cap - self._size
        if text and room > 0:
            self._pieces.append(text[:room])
            self._size += len(self._pieces[-1])

    def take(self) -> str:
        """The line so far; the line starts anew."""
        line = "".join(self._pieces)
        self._pieces, self._size = [], 0
        return line
