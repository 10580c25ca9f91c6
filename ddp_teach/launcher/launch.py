"""`ddp_teach.run`: run a notebook-defined function on N real worker processes.

The worker side follows torchrun's contract (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT; a default process group), so the same function also
runs under `torchrun`. The kernel side is what a notebook needs and
`torch.multiprocessing.spawn` lacks: functions from cells (spawn pickles by
reference, and a child cannot find a function defined in `__main__`), return
values, live per-rank output, clear errors, hang diagnosis, nothing left
running, and warm starts through a fork server.

Rendezvous: the kernel binds a socket to 127.0.0.1 on port 0 (the OS picks a
free port, so no race and no collision) and hands it to a `TCPStore`; gloo is
pinned to the loopback interface. Nothing listens on other interfaces.
"""
import inspect
import os
import pickle
import socket
import sys
import time
import warnings
from datetime import timedelta

from ddp_teach.launcher.kernel_server import (fork_server, one_run_at_a_time,
                                               stop_server)
from ddp_teach.launcher.monitor import REAP_WAIT_S, Monitor, RankPipes
from ddp_teach.launcher.output import OutputRouter
from ddp_teach.launcher.progress_bars import ProgressBars
from ddp_teach.launcher.pickling import dumps_call
from ddp_teach.launcher.procs import require_posix
from ddp_teach.launcher.protocol import Job
from ddp_teach.launcher.rundirs import new_run_dir
from ddp_teach.system import choose_backend, loopback_interface, threads_per_rank
from ddp_teach.launcher.errors import WorkerError

MAX_WORLD_SIZE = 64
PG_TIMEOUT_MARGIN_S = 30.0  # the kernel's timeout fires first, with stacks
# A week: longer than any run in a notebook, and far inside what torch's
# timeouts hold (timeout=1e10 s fails in TCPStore, 1e15 s overflows timedelta)
MAX_TIMEOUT_S = 7 * 24 * 3600.0


class RunResult(list):
    """Per-rank return values in rank order, plus how the run went.

    A plain list to compare and index (`dt.run(f, 4) == [6, 6, 6, 6]`), with
    `.wall_s` (seconds, launch to last result), `.backend`, `.log_dir` (each
    rank's full output) and `.timeline` (None unless trace=True).
    """

    def __init__(self, values, wall_s: float, backend: str, log_dir: str,
                 timeline=None):
        super().__init__(values)
        self.wall_s, self.backend, self.log_dir = wall_s, backend, log_dir
        self.timeline = timeline


def run(fn, world_size: int = 2, *, args=(), kwargs=None, backend: str = "auto",
        timeout: float = 60.0, trace: bool = False, env=None,
        debug: bool = False, network=None, simulate=None) -> RunResult:
    """Run `fn(rank, world_size, *args, **kwargs)` on `world_size` processes.

    Each worker has the default process group initialised (and destroyed
    afterwards). Returns a `RunResult`; raises `WorkerError` when a rank fails
    and `WorkerTimeout` after `timeout` seconds (at most a week). Processes
    `fn` starts end with its rank; a RuntimeWarning names those it left
    running. `debug=True` sets TORCH_DISTRIBUTED_DEBUG=DETAIL, which names
    mismatched collectives (`env=` can set INFO instead).
    `env` is set in every worker; a variable torch reads only at import
    (TORCH_CPP_LOG_LEVEL, TORCH_SHOW_CPP_STACKTRACES, TORCH_LOGS) restarts
    the fork server so that it takes effect. `trace=True` records every
    collective and every `dt.span` into `.timeline`. `network=` (anything
    with `alpha` seconds and `beta` seconds per byte, e.g. a `dt.cost.Link`)
    emulates a slower link: each collective takes at least alpha + bytes*beta.
    `simulate=dt.sim.Simulation(...)` runs every rank on a simulated GPU and
    link: results stay real, `.timeline` is in virtual time (ddp_teach.sim).
    Runs from several threads take turns: a run waits until the one in
    progress has returned (see `kernel_server`).
    """
    require_posix("dt.run")
    kwargs = {} if kwargs is None else kwargs
    _check_inputs(fn, world_size, args, kwargs, timeout, env)
    _check_network(network)
    if simulate is not None:
        backend = _check_simulation(simulate, network, backend)
        trace = True
    backend = choose_backend(backend, world_size)
    call = dumps_call(fn, tuple(args), kwargs)
    with one_run_at_a_time():
        started = time.perf_counter()
        server = fork_server({**os.environ, **(env or {})})
        run_dir = new_run_dir()
        store = None
        try:
            store, port = kernel_store(timeout)
            job = _job(call, world_size, backend, port, timeout, env, debug,
                       run_dir, trace, network, simulate)
            outcomes, notes = _launch_and_watch(server, job, world_size, timeout)
        except WorkerError as error:  # raised here for a short traceback: the
            raise error.with_traceback(None) from None  # message has the remote one
        finally:
            del store  # closes the rendezvous socket
    for note in notes:  # the results stand; what the workers left is said
        warnings.warn(note, RuntimeWarning, stacklevel=2)
    values = [_unpickle_value(rank, o.value) for rank, o in enumerate(outcomes)]
    timeline = None
    if trace:
        from ddp_teach.tracing.timeline import Timeline
        timeline = Timeline((e for o in outcomes for e in o.events),
                            None if simulate is None else simulate.label)
    return RunResult(values, time.perf_counter() - started, backend, run_dir,
                     timeline)


def _launch_and_watch(server, job, world_size, timeout):
    """Start the workers and watch them: (outcomes, notes to warn about).

    One try covers everything from the first pipe on, so an interrupt at
    any point (even before the monitor takes over) ends the workers and
    closes every descriptor: the pipes' read ends belong to `reads` until
    the ranks hold them, and the monitor closes each as it is done."""
    reads, writes, pids, ranks, router = [], [], [], None, None
    try:
        for _ in range(3 * world_size):
            r, w = os.pipe()
            reads.append(r)
            writes.append(w)
        try:
            pids = server.start_workers(world_size, pickle.dumps(job), writes,
                                        timeout)
        except BaseException:
            stop_server()  # a server that failed mid-request is not trusted again
            raise
        finally:
            while writes:
                os.close(writes.pop())
        ranks = [RankPipes(rank, pid, *reads[3 * rank:3 * rank + 3])
                 for rank, pid in enumerate(pids)]
        router = OutputRouter(world_size, job.run_dir, sys.stdout, sys.stderr,
                              progress=ProgressBars(world_size, sys.stdout))
        monitor = Monitor(server, ranks, router, timeout, job.stack_files,
                          job.env.get("TORCH_DISTRIBUTED_DEBUG") == "DETAIL")
        return monitor.wait(), monitor.notes
    except BaseException:
        server.end_workers(pids, wait_s=REAP_WAIT_S)  # if the monitor did not
        raise
    finally:
        for fd in (reads if ranks is None else
                   [fd for rank in ranks for fd in rank.open_fds]):
            os.close(fd)
        for rank in ranks or []:
            rank.open_fds.clear()
        if router is not None:
            router.finish()  # closes the logs (again, if the monitor did)
        server.forget(pids)


def _job(call, world_size, backend, port, timeout, env, debug, run_dir, trace,
         network, simulate) -> Job:
    worker_env = dict(os.environ)
    worker_env.update(env or {})
    threads = threads_per_rank(world_size)
    worker_env.update(
        WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size),
        GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
        OMP_NUM_THREADS=str(threads))
    worker_env.setdefault("GLOO_SOCKET_IFNAME", loopback_interface())
    worker_env.setdefault("NCCL_SOCKET_IFNAME", loopback_interface())
    if debug:
        worker_env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    return Job(call=call, world_size=world_size, backend=backend, port=port,
               pg_timeout_s=timeout + PG_TIMEOUT_MARGIN_S, env=worker_env,
               cwd=os.getcwd(), sys_path=list(sys.path), threads=threads,
               run_dir=run_dir, cell_sources=_cell_sources(call),
               stack_files=[os.path.join(run_dir, f"rank{r}.stack")
                            for r in range(world_size)],
               trace=bool(trace),
               network=None if network is None else  # plain floats (Job's doc)
               (float(network.alpha), float(network.beta)),
               simulate=simulate)


def kernel_store(timeout):
    """The rendezvous store, served by the kernel on a socket bound to
    127.0.0.1 (TCPStore alone would listen on every interface)."""
    import torch.distributed as dist
    store_timeout = timedelta(seconds=timeout + PG_TIMEOUT_MARGIN_S)  # before
    listener = socket.create_server(("127.0.0.1", 0), backlog=MAX_WORLD_SIZE)
    port = listener.getsockname()[1]  # the socket, so that no error leaks it
    store = dist.TCPStore("127.0.0.1", port, is_master=True,
                          wait_for_workers=False, master_listen_fd=listener.detach(),
                          timeout=store_timeout)
    return store, port


def _cell_sources(call: bytes) -> dict:
    """Source of the notebook cells (files that exist only in linecache) that
    the call's code comes from, so that workers' tracebacks show the
    learner's lines. cloudpickle ships a cell's code by value, file name
    included, so only cells whose name is in the pickle can appear in a
    traceback; the rest stay home (after 700 cells, sending them all cost
    900 KB and 30 ms a run). Each entry travels with no modification time:
    IPython 7 (Colab's) stamps its cells with one, and a worker's
    `linecache.checkcache` would drop an entry whose file it cannot stat;
    IPython 8 already leaves it None, which checkcache keeps."""
    import linecache
    return {name: (size, None, lines, full_name)
            for name, (size, _, lines, full_name) in
            ((name, entry) for name, entry in list(linecache.cache.items())
             if len(entry) == 4)
            if name.encode("utf-8", "surrogatepass") in call and not os.path.exists(name)}


def _unpickle_value(rank: int, data: bytes):
    import cloudpickle
    try:
        return cloudpickle.loads(data)
    except Exception as exc:
        raise WorkerError(f"rank {rank} returned a value the notebook cannot "
                          f"load: {type(exc).__name__}: {exc}",
                          {rank: str(exc)}, rank) from exc


def _check_simulation(simulate, network, backend: str) -> str:
    """The backend a simulated run uses (gloo: the real arithmetic runs on
    the CPU), or a clear error."""
    from ddp_teach.sim import Simulation
    if not isinstance(simulate, Simulation):
        raise TypeError("simulate must be a dt.sim.Simulation, e.g. "
                        "dt.sim.Simulation('A100 80GB', 'NVLink 4'); got a "
                        f"{type(simulate).__name__}")
    if network is not None:
        raise ValueError("give simulate= or network=, not both: a simulated "
                         "run already charges every collective on its link")
    if backend not in ("auto", "gloo"):
        raise ValueError(f"a simulated run computes on the CPU over gloo; "
                         f"backend={backend!r} cannot be simulated")
    return "gloo"


def _check_network(network) -> None:
    if network is None:
        return
    values = [getattr(network, name, None) for name in ("alpha", "beta")]
    if not all(isinstance(v, (int, float)) and v >= 0 for v in values):
        raise TypeError("network must have non-negative `alpha` (seconds per "
                        "message) and `beta` (seconds per byte), e.g. "
                        "dt.cost.Link(alpha=1e-3, beta=1e-8)")


def _check_inputs(fn, world_size, args, kwargs, timeout, env) -> None:
    """Refuse bad input before anything is spawned, saying what to do."""
    if not callable(fn):
        raise TypeError(f"fn must be a function taking (rank, world_size, ...); "
                        f"got a {type(fn).__name__}")
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int from 1 to {MAX_WORLD_SIZE}; "
                        f"got {world_size!r} ({type(world_size).__name__})")
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        raise ValueError(f"world_size must be from 1 to {MAX_WORLD_SIZE}; got "
                         f"{world_size}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds; got {timeout!r}")
    if not (0 < timeout <= MAX_TIMEOUT_S):  # NaN fails this too
        raise ValueError(f"timeout must be a number of seconds above 0 and at "
                         f"most {MAX_TIMEOUT_S:,.0f} (a week); got {timeout!r}. "
                         f"For a run with no practical limit pass "
                         f"timeout={MAX_TIMEOUT_S:.0f}.")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple of extra positional arguments; "
                        f"got a {type(args).__name__} (for one argument write "
                        f"args=(x,))")
    if not isinstance(kwargs, dict):
        raise TypeError(f"kwargs must be a dict; got a {type(kwargs).__name__}")
    if env is not None and not (isinstance(env, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise TypeError("env must be a dict of str to str, e.g. "
                        "{'NCCL_DEBUG': 'INFO'}")
    try:
        inspect.signature(fn).bind(0, world_size, *args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"fn is called as fn(rank, world_size, *args, **kwargs) "
                        f"but its signature does not accept that: {exc}") from None
    except ValueError:
        pass  # some builtins have no signature to check
