"""Record, inside each worker, when it computed and when it communicated.

With `dt.run(..., trace=True)` every torch.distributed collective and
point-to-point call the run makes is recorded: its name, its operation and
the bytes of its buffer (`operations`: what a simulated run records too),
when it was issued and when its work completed. For an
`async_op=True` call the completion comes from the work's future, which fires
in the communication thread the moment the data has arrived, not when the
program got round to `wait()`. torch's DistributedDataParallel reduces
gradients in C++, out of Python's sight, so a traced run gives each DDP model
the Python equivalent of its default hook (torch's own `allreduce_hook`, which
averages then all-reduces each bucket) unless the learner registered a hook;
its bucket all-reduces then show up as "ddp bucket i". Compute is what the
learner marks with `dt.span("backward")`.

`network=` pretends the ranks talk over a slower link: every call then takes
at least alpha + bytes * beta (the alpha-beta model of Thakur, Rabenseifner &
Gropp, 2005); the added wait is recorded as `emulated_s` so that timelines can
show it apart from real time.

Compute is marked by `span` and `trace_layers` (marks.py); `record` adds an
event for work that is not a torch.distributed call (an RPC, say).
"""
import contextlib
import functools
import threading
import time

from ddp_teach import compat
from ddp_teach.tracing.events import COMM, Event
from ddp_teach.tracing.operations import call_bytes, operation, tensor_bytes

RECORDED_CALLS = (  # every public torch.distributed call that moves data
    "all_reduce", "all_reduce_coalesced", "broadcast", "reduce", "all_gather",
    "all_gather_coalesced", "all_gather_into_tensor", "all_gather_single",
    "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single",
    "all_to_all", "all_to_all_single", "gather", "scatter", "barrier",
    "monitored_barrier", "send", "recv", "isend", "irecv", "batch_isend_irecv",
    "all_gather_object", "broadcast_object_list", "gather_object",
    "scatter_object_list", "send_object_list", "recv_object_list")

_recorder = None  # the Recorder of this worker, when the run is traced


def now() -> float:
    """The trace's clock: perf_counter seconds, or the virtual clock of a
    simulated run (ddp_teach.sim), whose events are in virtual time."""
    return time.perf_counter() if _recorder is None else _recorder.now()


def record(name: str, kind: str, start: float, end: float, nbytes: int = 0) -> None:
    """Add one event (times from `now()`) to this worker's trace; a no-op
    outside a traced run, so code that records runs untraced too."""
    if _recorder is not None:
        _recorder.mark(name, kind, start, end, nbytes)


@contextlib.contextmanager
def labelled(name: str):
    """Name the collectives issued inside, e.g. "bucket 3", in a traced run
    (outside one, a no-op)."""
    if _recorder is None:
        yield
        return
    local = _recorder.local
    local.label = name
    try:
        yield
    finally:
        local.label = None


class Recorder:
    """The events of one rank; appended to from the main thread and from the
    communication threads that complete async work."""

    def __init__(self, rank: int, network: tuple[float, float] | None = None):
        self.rank, self.network = rank, network  # (alpha s, beta s per byte)
        self.events: list[Event] = []
        self._pending: list = []        # async works not yet completed
        self.local = threading.local()  # nesting depth and collective label

    def now(self) -> float:
        return time.perf_counter()

    @contextlib.contextmanager
    def running(self):
        """Wraps the learner's function; a real trace needs nothing there (a
        simulated one charges every tensor operation)."""
        yield

    def mark(self, name, kind, start, end, nbytes=0) -> None:
        """An event the program marked itself (`span`, `trace_layers`)."""
        self.add(name, kind, start, end, nbytes)

    def add(self, name, kind, start, end, nbytes=0, emulated_s=0.0, op="") -> None:
        self.events.append(Event(self.rank, name, kind, start, end, nbytes,
                                 emulated_s, op))

    def least_time(self, nbytes: int) -> float:
        """What the emulated link needs for this many bytes (0 without one)."""
        if self.network is None:
            return 0.0
        alpha, beta = self.network
        return alpha + nbytes * beta

    def record_call(self, name: str, call, args, kwargs):
        """Run one torch.distributed call and record it."""
        local = self.local
        if getattr(local, "depth", 0):  # inside another recorded call
            return call(*args, **kwargs)
        # torch 2.13's names on every torch (FSDP2 calls the old ones before 2.13)
        label = getattr(local, "label", None) or compat.traced_name(name)
        nbytes, op = call_bytes(name, call, args, kwargs), operation(name)
        start = time.perf_counter()
        local.depth = 1
        try:
            result = call(*args, **kwargs)
        finally:
            local.depth = 0
        ready_at = start + self.least_time(nbytes)
        works = result if isinstance(result, list) else [result]
        if result is not None and all(hasattr(w, "get_future") for w in works):
            proxies = [self._track(w, label, start, ready_at, size, work_op)
                       for w, (size, work_op) in zip(works, _bytes_per_work(
                           name, args, kwargs, works, nbytes, op))]
            return proxies if isinstance(result, list) else proxies[0]
        end = time.perf_counter()
        if end < ready_at:
            time.sleep(ready_at - end)
        self.add(label, COMM, start, max(end, ready_at), nbytes,
                 max(0.0, ready_at - end), op)
        return result

    def _track(self, work, name, start, ready_at, nbytes, op):
        """Record an async work when its future completes."""
        def done(_future=None):
            end = time.perf_counter()
            self.add(name, COMM, start, max(end, ready_at), nbytes,
                     max(0.0, ready_at - end), op)
        try:
            future = work.get_future()
        except RuntimeError:  # gloo's send/recv works have no future
            work = _CompletedOnWait(work, done)
        else:
            future.add_done_callback(done)
        self._pending.append(work)
        return _SlowWork(work, ready_at) if self.network is not None else work

    def finish(self) -> list[Event]:
        """Wait for async work still in flight, then hand over the events.
        (Waiting twice on a finished gloo send/recv blocks: check first.)"""
        for work in self._pending:
            if not work.is_completed():
                work.wait()
            if isinstance(work, _CompletedOnWait):
                work.record_if_never_waited()
        return sorted(self.events, key=lambda e: e.start)


class _CompletedOnWait:
    """A work without a future (gloo's isend / irecv): the best completion
    time there is, is when `wait()` returned."""

    def __init__(self, work, on_done):
        self._work, self._on_done = work, on_done

    def wait(self, *args, **kwargs):
        result = self._work.wait(*args, **kwargs)
        self.record_if_never_waited()
        return result

    def record_if_never_waited(self) -> None:
        if self._on_done is not None:
            self._on_done()
            self._on_done = None

    def __getattr__(self, name):
        return getattr(self._work, name)


class _SlowWork:
    """An async work that, on an emulated slow link, is not done before
    `ready_at`: `wait()` and the future both hold back until then."""

    def __init__(self, work, ready_at: float):
        self._work, self._ready_at = work, ready_at

    def _hold(self, value=None):
        delay = self._ready_at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        return value

    def wait(self, *args, **kwargs):
        return self._hold(self._work.wait(*args, **kwargs))

    def is_completed(self) -> bool:
        return self._work.is_completed() and time.perf_counter() >= self._ready_at

    def get_future(self):
        return self._work.get_future().then(lambda fut: self._hold(fut.value()))

    def __getattr__(self, name):
        return getattr(self._work, name)


def _bytes_per_work(name, args, kwargs, works, nbytes, op) -> list[tuple]:
    """(bytes, operation) of each work of one call. `batch_isend_irecv`
    returns a work per P2POp on gloo (one for the whole batch where nccl
    coalesces them): each op's work gets that op's bytes and operation
    (send or recv), so a batch counts once."""
    ops = args[0] if args else kwargs.get("p2p_op_list", ())
    if name == "batch_isend_irecv" and len(works) > 1 and len(ops) == len(works):
        return [(tensor_bytes([p2p]), operation(getattr(p2p.op, "__name__", op)))
                for p2p in ops]
    return [(nbytes, op)] * len(works)


def install(recorder: Recorder) -> Recorder:
    """Start recording in this worker with `recorder` (a Recorder, or a
    simulated one): wrap torch.distributed's calls and give DDP models a
    recorded gradient hook."""
    global _recorder
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    _recorder = recorder
    for name in RECORDED_CALLS:
        recorded = _recorded(name, getattr(c10d, name))
        setattr(c10d, name, recorded)  # torch's own internal calls too
        setattr(dist, name, recorded)
    _hook_ddp()
    return _recorder


@contextlib.contextmanager
def recording(recorder: Recorder):
    """`install(recorder)` for the length of a with-block, then put
    torch.distributed and DDP back as they were: for a simulation that runs
    in this process (`ddp_teach.sim.runtime.one_rank`) rather than in a worker."""
    global _recorder
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch.nn.parallel import DistributedDataParallel as DDP
    if _recorder is not None:
        raise RuntimeError("this process is already recording a trace")
    calls = {name: (getattr(c10d, name), getattr(dist, name))
             for name in RECORDED_CALLS}
    ddp = {name: DDP.__dict__[name] for name in
           ("forward", "register_comm_hook", "_register_builtin_comm_hook")}
    install(recorder)
    try:
        yield recorder
    finally:
        _recorder = None
        for name, (in_c10d, in_dist) in calls.items():
            setattr(c10d, name, in_c10d)
            setattr(dist, name, in_dist)
        for name, method in ddp.items():
            setattr(DDP, name, method)


def _recorded(name: str, original):
    @functools.wraps(original)
    def recorded(*args, **kwargs):
        return _recorder.record_call(name, original, args, kwargs)
    return recorded


def _hook_ddp() -> None:
    """Register a recorded all-reduce hook on every DDP model at its first
    forward, unless the learner registered a hook of their own."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
        allreduce_hook)

    def labelled_allreduce_hook(process_group, bucket):
        with labelled(f"ddp bucket {bucket.index()}"):
            return allreduce_hook(process_group, bucket)

    def mark_hooked(register):
        @functools.wraps(register)
        def registering(self, *args, **kwargs):
            self._ddp_teach_hooked = True
            return register(self, *args, **kwargs)
        return registering

    original_forward = DDP.forward

    @functools.wraps(original_forward)
    def forward(self, *args, **kwargs):
        if not getattr(self, "_ddp_teach_hooked", False):
            self.register_comm_hook(self.process_group, labelled_allreduce_hook)
        return original_forward(self, *args, **kwargs)

    DDP.register_comm_hook = mark_hooked(DDP.register_comm_hook)
    DDP._register_builtin_comm_hook = mark_hooked(DDP._register_builtin_comm_hook)
    DDP.forward = forward
