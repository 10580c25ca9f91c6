"""What one forked worker does to become rank r of a run.

The order matters and follows what `torchrun` gives a training script: the
output descriptors first (so that nothing printed is lost, C++ warnings
included), then the environment variables a torchrun worker sees, then the
process group, then the learner's function. Whatever happens, exactly one
message goes back on the result pipe: the return value, or the exception.
"""
import contextlib
import ctypes
import faulthandler
import io
import linecache
import os
import pickle
import signal
import sys
import time
import traceback
from datetime import timedelta

from ddp_teach.launcher import wire
from ddp_teach.launcher.errors import is_launcher_file
from ddp_teach.launcher.protocol import EXIT_RESULT_PIPE_LOST
from ddp_teach.launcher.procs import become_subreaper, set_parent_death_signal
from ddp_teach.launcher.progress_bars import report_to_kernel
from ddp_teach.launcher.protocol import Failed, Job, Returned
from ddp_teach.launcher.rundirs import create_private_file
from ddp_teach.system import uses_nccl

EXIT_FAILED = 1
_IOLBF = 1  # setvbuf's "line buffered" mode


def _take_over_output(stdout_fd: int, stderr_fd: int) -> None:
    """Point fds 1 and 2 at the kernel's pipes; line-buffer Python's streams."""
    os.dup2(stdout_fd, 1)
    os.dup2(stderr_fd, 2)
    os.close(stdout_fd)
    os.close(stderr_fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdin = open(0, closefd=False)
    # unbuffered, like `python -u`: a print is in the pipe before the next line
    # runs, so a crash right after it loses nothing
    sys.stdout, sys.stderr = (
        io.TextIOWrapper(open(fd, "wb", buffering=0, closefd=False),
                         write_through=True) for fd in (1, 2))
    _line_buffer_c_stdout()


def _line_buffer_c_stdout() -> None:
    """C's stdout is fully buffered on a pipe; line-buffer it so C++ output
    shows up live (glibc only; elsewhere C output arrives at exit)."""
    try:
        libc = ctypes.CDLL(None)
        stream = ctypes.c_void_p.in_dll(libc, "stdout")
    except (OSError, ValueError):
        return
    libc.setvbuf(stream, None, _IOLBF, 0)


def _describe_exception(exc: BaseException) -> Failed:
    """The exception as text, starting at the learner's code, not ours."""
    tb = exc.__traceback__
    while tb is not None and is_launcher_file(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return Failed(type(exc).__name__, str(exc),
                  "".join(traceback.format_exception(type(exc), exc, tb)),
                  at=time.time())


def _encode_value(value, rank: int, events: list) -> Returned | Failed:
    """The return value as a message; CUDA tensors come back on the CPU."""
    import cloudpickle
    import torch
    from torch.utils._pytree import tree_map
    try:
        value = tree_map(lambda x: x.cpu() if isinstance(x, torch.Tensor)
                         and x.is_cuda else x, value)
        return Returned(cloudpickle.dumps(value), events)
    except RecursionError:  # its traceback would be thousands of frames
        return Failed("UnpicklableReturnValue",
                      f"rank {rank} returned a {type(value).__name__} nested "
                      "too deeply to be pickled, so it cannot be sent back to "
                      "the notebook (RecursionError). Return a flatter value: "
                      "a list of items, or a tensor.", at=time.time())
    except Exception as exc:  # reported to the learner as this rank's failure
        return Failed("UnpicklableReturnValue",
                      f"rank {rank} returned a {type(value).__name__}, which "
                      f"cannot be sent back to the notebook: {exc}. Return "
                      "plain values or tensors instead.", at=time.time())


def _same_file(fd: int, identity: tuple[int, int]) -> bool:
    """True when fd is still open on the file it was opened on."""
    try:
        info = os.fstat(fd)
    except OSError:
        return False
    return (info.st_dev, info.st_ino) == identity


def _init_process_group(job: Job, rank: int):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(job.threads)
    # torch read TORCH_DISTRIBUTED_DEBUG when the fork server imported it;
    # the run's own value (debug=True, or env=) is read again here
    dist.set_debug_level_from_env()
    store = dist.TCPStore("127.0.0.1", job.port, is_master=False,
                          timeout=timedelta(seconds=job.pg_timeout_s))
    device_id = None
    if uses_nccl(job.backend):
        torch.cuda.set_device(rank)
        device_id = torch.device("cuda", rank)
    dist.init_process_group(job.backend, store=store, rank=rank,
                            world_size=job.world_size, device_id=device_id,
                            timeout=timedelta(seconds=job.pg_timeout_s))
    if "gloo" in job.backend:
        # gloo's init returns on a rank once ITS connections are up; a rank
        # whose function is instant could exit while a peer is still
        # connecting to it ("Connection closed by peer"). One collective on
        # a CPU tensor, which gloo carries in either backend: all up.
        dist.all_reduce(torch.zeros(1))


def _install_recorder(job: Job, rank: int):
    """The recorder a traced, slowed or simulated run needs, or None."""
    if job.simulate is not None:
        from ddp_teach.sim.runtime.recorder import SimulatedRecorder
        recorder = SimulatedRecorder(rank, job.simulate)
    elif job.trace or job.network is not None:
        from ddp_teach.tracing.recorder import Recorder
        recorder = Recorder(rank, job.network)
    else:
        return None
    from ddp_teach.tracing.recorder import install
    return install(recorder)


def _run(rank: int, job: Job) -> Returned | Failed:
    import cloudpickle
    os.environ.clear()
    os.environ.update(job.env)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank))
    os.chdir(job.cwd)
    sys.path[:] = job.sys_path
    linecache.cache.update(job.cell_sources)
    faulthandler.register(signal.SIGUSR1, all_threads=True, file=open(
        create_private_file(job.stack_files[rank]), "w"))
    try:
        fn, args, kwargs = cloudpickle.loads(job.call)
        report_to_kernel()  # dt.progress draws bars in the cell
        _init_process_group(job, rank)
        recorder = _install_recorder(job, rank)
        with recorder.running() if recorder else contextlib.nullcontext():
            value = fn(rank, job.world_size, *args, **kwargs)
        events = recorder.finish() if job.trace or job.simulate else []
        return _encode_value(value, rank, events)
    except BaseException as exc:  # any failure goes back to the kernel
        return _describe_exception(exc)


def main(rank: int, fds: list[int], job_bytes: bytes) -> None:
    """Run rank `rank` of the job and exit; called in the forked child."""
    stdout_fd, stderr_fd, result_fd = fds
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    set_parent_death_signal()
    become_subreaper()  # what the function starts stays below this rank
    _take_over_output(stdout_fd, stderr_fd)
    result_pipe = os.fstat(result_fd)
    job = pickle.loads(job_bytes)
    outcome = _run(rank, job)
    with contextlib.suppress(OSError):  # the function may have closed them
        sys.stdout.flush()
        sys.stderr.flush()
    if not _same_file(result_fd, (result_pipe.st_dev, result_pipe.st_ino)):
        os._exit(EXIT_RESULT_PIPE_LOST)  # the kernel says so (`monitor`)
    wire.write_message(result_fd, outcome)  # before teardown, which may block
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
    with contextlib.suppress(OSError):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(0 if isinstance(outcome, Returned) else EXIT_FAILED)
