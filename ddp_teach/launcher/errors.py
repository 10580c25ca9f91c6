"""The errors a run raises, written so a learner can find the culprit.

`torch.multiprocessing.spawn` reports a failed worker as "process 0 terminated
with exit code 1", the real traceback lost (torch/multiprocessing/spawn.py,
ProcessExitedException), and a hang waits out the process group's timeout with
no stack (pytorch/pytorch#49846). Here a failure names
the rank, the exception and shows the remote traceback; a hang shows where
every live rank was stuck, and which ranks were waiting inside a collective.
"""
import linecache
import os
import re

from ddp_teach.launcher.protocol import Failed

_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')
LAUNCHER_DIR = os.path.dirname(os.path.realpath(__file__)) + os.sep
_COLLECTIVE_FILES = ("torch/distributed/",)
# Seen on torch 2.13's CPU build: wrapping a model in torch's
# DistributedDataParallel with TORCH_DISTRIBUTED_DEBUG=DETAIL segfaults in
# c10d::Logger::set_env_variables (called by set_construction_data_and_log,
# torch/nn/parallel/distributed.py, _ddp_init_helper), one rank or many.
DETAIL_CRASH_HINT = (
    "\nTORCH_DISTRIBUTED_DEBUG=DETAIL was set (debug=True), and torch 2.13's "
    "DistributedDataParallel crashes this way under DETAIL on this build, "
    "while it wraps the model. Run without debug=True; "
    "env={'TORCH_DISTRIBUTED_DEBUG': 'INFO'} names the parameters that "
    "received no gradient too.")


class WorkerError(RuntimeError):
    """One or more ranks failed. `.failures` maps rank to what went wrong."""

    def __init__(self, message: str, failures: dict[int, str], first_rank: int):
        super().__init__(message)
        self.failures = failures
        self.first_rank = first_rank


class WorkerTimeout(WorkerError, TimeoutError):
    """The run outlived its timeout. `.stacks` holds each live rank's stack and
    `.in_collective` the torch.distributed call it was inside (or None)."""

    def __init__(self, message, failures, first_rank, stacks, in_collective):
        super().__init__(message, failures, first_rank)
        self.stacks = stacks
        self.in_collective = in_collective


def failure_message(failures: dict[int, Failed], order: list[int],
                    stopped: list[int], returned: list[int]) -> str:
    """Message for ranks that raised or died; the earliest one shown in full."""
    first = order[0]
    info = failures[first]
    lines = [f"rank {first} failed with {info.type}: {_short(info.message)}"]
    more = info.message.strip().splitlines()[1:]
    if more and not info.traceback:  # a traceback says it all again
        lines += ["", *more]
    if info.traceback:
        lines += ["", f"Traceback from rank {first}:", info.traceback.rstrip()]
    if info.last_stderr:
        lines += ["", f"The last lines rank {first} wrote to stderr:",
                  _indent(info.last_stderr)]
    for rank in order[1:]:
        other = failures[rank]
        lines.append(f"rank {rank} failed too, later: "
                     f"{other.type}: {_short(other.message)}")
    if stopped:
        lines.append(f"{_who(stopped, 'was', 'were')} still running and "
                     f"stopped after rank {first} failed.")
    if returned and any(part in info.traceback for part in _COLLECTIVE_FILES):
        lines.append(f"{_who(returned, 'had', 'had')} already returned while "
                     f"rank {first} was in a collective: a rank that skips a "
                     "collective its peers call makes them fail or wait.")
    return "\n".join(lines).strip()


def failure_details(info: Failed) -> str:
    """The whole story of one rank's failure, for `WorkerError.failures`: its
    traceback, or for a rank that died, what happened and its last words (a
    crash in C, such as gloo aborting, says why only on stderr)."""
    if info.traceback:
        return info.traceback
    if info.last_stderr:
        return (f"{info.message}\n\nIts last lines on stderr:\n"
                f"{_indent(info.last_stderr)}")
    return info.message


def is_launcher_file(filename: str) -> bool:
    """True for this package's own launcher code (the fork server, the worker,
    the %%ddp magic): frames a learner should not have to read."""
    return os.path.realpath(filename).startswith(LAUNCHER_DIR)


def parse_stack(dump: str) -> list[tuple[str, int, str]]:
    """Frames (file, line, function) of the worker's main thread, outermost
    first, from a `faulthandler` dump; the launcher's own frames left out."""
    blocks, current = [], []
    for line in dump.splitlines():
        match = _FRAME.match(line)
        if match:
            current.append((match["file"], int(match["line"]), match["func"]))
        elif current:
            blocks.append(current)
            current = []
    if current:
        blocks.append(current)
    main = next((b for b in blocks if any(is_launcher_file(f[0]) for f in b)),
                blocks[-1] if blocks else [])
    frames = list(reversed(main))  # faulthandler lists the innermost first
    ours = [i for i, f in enumerate(frames) if is_launcher_file(f[0])]
    return frames[ours[-1] + 1:] if ours else frames


def collective_of(frames) -> str | None:
    """The torch.distributed function a stack is inside, or None."""
    names = [func for file, _, func in frames
             if any(part in file.replace("\\", "/") for part in _COLLECTIVE_FILES)
             and not func.startswith("_") and func != "wrapper"]
    return names[-1] if names else None


def format_frames(frames) -> str:
    """A stack as a traceback would print it, with source lines where known
    (the kernel knows the source of notebook cells; the workers do not)."""
    out = []
    for file, line, func in frames:
        marker = "   <-- inside torch.distributed" if any(
            p in file for p in _COLLECTIVE_FILES) else ""
        out.append(f'  File "{file}", line {line}, in {func}{marker}')
        source = linecache.getline(file, line).strip()
        if source:
            out.append(f"    {source}")
    return "\n".join(out)


def timeout_message(timeout: float, stacks: dict[int, str],
                    in_collective: dict[int, str | None],
                    finished: list[int], suspect: int) -> str:
    waiting = [r for r, c in in_collective.items() if c]
    lines = [f"the run did not finish within timeout={timeout:g} s; "
             f"{_who(sorted(stacks), 'was', 'were')} still running"
             + (f" ({_who(finished, 'had', 'had')} returned)." if finished else ".")]
    if waiting and suspect not in waiting:
        lines.append(f"{_who(waiting, 'waits', 'wait')} inside a collective while "
                     f"rank {suspect} is elsewhere: look at rank {suspect} first.")
    elif waiting:
        lines.append(f"{_who(waiting, 'waits', 'wait')} inside a collective: are "
                     "all ranks calling the same collectives in the same order? "
                     "Run again with debug=True to have torch compare them.")
    for rank in sorted(stacks):
        where = (f"inside {in_collective[rank]}()" if in_collective[rank]
                 else "not in a collective")
        lines += ["", f"rank {rank} ({where}), most recent call last:",
                  stacks[rank] or "  (no Python frames: still starting, or busy "
                                 "in C code)"]
    lines += ["", "Every worker was stopped."]
    return "\n".join(lines)


def _short(message: str, limit: int = 240) -> str:
    """First line of a message, cut to `limit` characters for a heading."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    return first if len(first) <= limit else first[:limit - 1] + "…"


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.rstrip().splitlines())


def _who(ranks, singular: str, plural: str) -> str:
    """'rank 0 was' or 'ranks 0, 2 were': the subject and verb of a sentence."""
    if len(ranks) == 1:
        return f"rank {ranks[0]} {singular}"
    return f"ranks {', '.join(str(r) for r in ranks)} {plural}"
