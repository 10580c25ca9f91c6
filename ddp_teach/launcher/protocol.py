"""Every message the kernel, the fork server and the workers send each other.

A run is a short conversation, each message framed by `wire`:

    kernel -> fork server   StartWorkers (with the pickled Job inside)
    fork server -> kernel   Ready once at start, Started (the pids), then one
                            Exited per worker as it is reaped
    worker -> kernel        exactly one outcome: Returned or Failed

Each message is a frozen dataclass built in one place, so a field that one
side writes and the other does not read is a NameError at the writer, not a
KeyError in the middle of a learner's run. The worker unpickles its Job before
the learner's classes can be imported, so a Job holds only plain values; the
learner's function travels inside it as cloudpickle bytes (`call`).
"""
from dataclasses import dataclass, field

# A worker's exit codes that the kernel reads as more than a failure
# (`monitor`): they are part of the conversation, so they live here, where
# the fork server, the worker and the monitor all read them.
EXIT_LAUNCHER_BUG = 70  # a worker whose launcher code failed (see its stderr)
EXIT_RESULT_PIPE_LOST = 71  # the function closed or replaced its result pipe


@dataclass(frozen=True)
class Job:
    """What every rank of one run needs, from the kernel."""
    call: bytes                 # cloudpickle of (fn, args, kwargs)
    world_size: int
    backend: str                # "gloo", "nccl" or system.GPU_AND_CPU
    port: int                   # the kernel's rendezvous store, on 127.0.0.1
    pg_timeout_s: float         # the process group's own timeout
    env: dict[str, str]         # the whole environment a worker runs in
    cwd: str
    sys_path: list[str]
    threads: int                # torch threads per rank
    run_dir: str                # logs and stacks of this run
    cell_sources: dict          # linecache entries of notebook cells
    stack_files: list[str]      # where rank r writes its stack when asked
    trace: bool = False         # record a timeline
    network: tuple[float, float] | None = None  # emulated link: (alpha, beta)
    simulate: object = None     # a ddp_teach.sim.Simulation: virtual time


@dataclass(frozen=True)
class StartWorkers:
    """Kernel to fork server: fork `world_size` ranks of this pickled Job."""
    world_size: int
    job: bytes


@dataclass(frozen=True)
class Ready:
    """Fork server to kernel, once: torch is imported, requests are welcome."""
    pid: int


@dataclass(frozen=True)
class Started:
    """Fork server to kernel: the workers' pids, in rank order."""
    pids: list[int]


@dataclass(frozen=True)
class Exited:
    """Fork server to kernel: a worker was reaped with this exit code
    (negative: killed by that signal), after the server ended the processes
    it had left running (`left_running`, as "pid 123: sleep 40")."""
    pid: int
    code: int
    left_running: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Returned:
    """Worker to kernel: the function's return value (cloudpickle bytes) and,
    in a traced run, the rank's events."""
    value: bytes
    events: list = field(default_factory=list)


@dataclass(frozen=True)
class Failed:
    """A rank's failure, as the learner will read it. Sent by a worker whose
    function raised; made by the kernel for a rank that died without a word."""
    type: str                   # the exception's class name, or what happened
    message: str
    traceback: str = ""         # from the learner's first frame on
    at: float | None = None     # wall-clock time of the failure, when known
    last_stderr: str = ""       # a rank that died: its last lines on stderr
