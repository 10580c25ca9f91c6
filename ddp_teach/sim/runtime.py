"""Inside each worker of a simulated run: the virtual clock and its charges.

A `SimulatedRecorder` replaces the trace's recorder. Its clock is the rank's
compute stream, in virtual seconds from the start of the function:

- `running()` puts a `TorchDispatchMode` around the learner's function, which
  sees every ATen operation (forward, the autograd engine's backward, the
  optimizer's update), lets the CPU compute it, and moves the clock by the
  operation's roofline time on the simulated device: FLOPs from torch's own
  `torch.utils.flop_counter` registry (matrix products, convolutions,
  attention), bytes from its tensors. Views and allocations are free. The
  time the CPU took never enters the clock.
- `record_call` (every torch.distributed collective, wrapped as in a traced
  run) first exchanges, over the same group, each rank's issue time and when
  its communication channel is free; the collective starts at the latest of
  them, lasts its alpha-beta time (`ddp_teach.cost.collective_time`) and
  occupies the channel until then, so calls queue in issue order. A
  blocking send or recv does the same with its one peer. Only then is the
  real call made, so real data still moves. A blocking call moves the
  clock to the end; an async one returns a work whose `wait()` does, and a
  future taken during backward moves it at the end of backward (when torch's
  DDP waits for its buckets).

Compute is recorded as one event per stretch of a phase ("forward",
"backward", "optimizer"), in place of the program's own `span` and
`trace_layers` marks; the clock only depends on the program and the tensor
shapes, so the events are the same on any machine under any load.
"""
import contextlib
import functools
import inspect

import torch
import torch.distributed as dist
from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                   register_optimizer_step_pre_hook)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from ddp_teach.cost import collective_time
from ddp_teach.tracing.events import COMM, COMPUTE
from ddp_teach.tracing.recorder import Recorder

# torch.distributed call -> (cost model op, which argument holds the bytes)
COLLECTIVES = {
    "all_reduce": ("all_reduce", "tensor"),
    "broadcast": ("broadcast", "tensor"),
    "all_gather": ("all_gather", "tensor_list"),
    "all_gather_into_tensor": ("all_gather", "output_tensor"),
    "all_gather_single": ("all_gather", "output_tensor"),
    "reduce_scatter": ("reduce_scatter", "input_list"),
    "reduce_scatter_tensor": ("reduce_scatter", "input"),
    "reduce_scatter_single": ("reduce_scatter", "input"),
    "barrier": ("all_reduce", None),
}
POINT_TO_POINT = {"send": "dst", "recv": "src"}  # blocking; -> the peer
FREE_OPS = {torch.ops.aten.empty, torch.ops.aten.empty_strided,
            torch.ops.aten.empty_like, torch.ops.aten.detach,
            torch.ops.aten.lift_fresh, torch.ops.aten.alias,
            torch.ops.aten._unsafe_view, torch.ops.aten.set_}
PHASES = ("forward", "backward", "optimizer")


class SimulatedRecorder(Recorder):
    """A rank's virtual clock, compute stream and communication channel."""

    def __init__(self, rank: int, simulation):
        super().__init__(rank)
        self.simulation = simulation
        self.clock = 0.0       # the compute stream, virtual seconds
        self.channel_free = 0.0
        self.in_optimizer = 0  # depth of optimizer.step() calls
        self.charging = True   # False while the simulator does its own work
        self._stretch = None   # [phase, start, end] of the compute being recorded

    def now(self) -> float:
        return self.clock

    def mark(self, name, kind, start, end, nbytes=0) -> None:
        """The program's own marks (`span`, `trace_layers`) are left out:
        a simulated run records its compute itself, phase by phase."""

    @contextlib.contextmanager
    def running(self):
        hooks = [register_optimizer_step_pre_hook(lambda *_: self._enter_optimizer(1)),
                 register_optimizer_step_post_hook(lambda *_: self._enter_optimizer(-1))]
        try:
            with _ChargeEveryOp(self):
                yield
        finally:
            for hook in hooks:
                hook.remove()

    def _enter_optimizer(self, step: int) -> None:
        self.in_optimizer += step

    def compute(self, seconds: float) -> None:
        """Run `seconds` of work on the compute stream, in the current phase."""
        phase = ("optimizer" if self.in_optimizer else "backward"
                 if in_backward() else "forward")
        start, self.clock = self.clock, self.clock + seconds
        stretch = self._stretch
        if stretch and stretch[0] == phase and stretch[2] == start:
            stretch[2] = self.clock
        else:
            self._close_stretch()
            self._stretch = [phase, start, self.clock]

    def wait_until(self, when: float) -> None:
        """The compute stream waits (idle) until `when`."""
        if when > self.clock:
            self._close_stretch()
            self.clock = when

    def _close_stretch(self) -> None:
        if self._stretch:
            phase, start, end = self._stretch
            self.add(phase, COMPUTE, start, end)
            self._stretch = None

    def record_call(self, name: str, call, args, kwargs):
        local = self.local
        if getattr(local, "depth", 0):  # inside another recorded call
            return call(*args, **kwargs)
        if name not in COLLECTIVES and name not in POINT_TO_POINT:
            raise NotImplementedError(
                f"a simulated run does not model dist.{name} yet; it models "
                f"{', '.join(sorted([*COLLECTIVES, *POINT_TO_POINT]))}. Run "
                "without simulate= to use it.")
        bound = _signature(call).bind(*args, **kwargs)
        bound.apply_defaults()
        local.depth = 1
        try:
            if name in POINT_TO_POINT:
                op, ranks = "send_recv", 2
                nbytes = _nbytes(bound.arguments["tensor"])
                start = self._agreed_with_peer(name, bound.arguments)
            else:
                op, data = COLLECTIVES[name]
                group = bound.arguments.get("group")
                ranks = dist.get_world_size(group)
                nbytes = _nbytes(bound.arguments.get(data)) if data else 0
                start = self._agreed_start(group)
            end = start + collective_time(op, nbytes, ranks, self.simulation.link)
            self.channel_free = end
            self.charging = False  # what the CPU backend does inside is the link's
            result = call(*args, **kwargs)  # the real data, moved for real
        finally:
            local.depth = 0
            self.charging = True
        self.add(getattr(local, "label", None) or name, COMM, start, end, nbytes)
        if bound.arguments.get("async_op"):
            self._pending.append(result)
            tensor = bound.arguments.get(data) if name in COLLECTIVES else None
            return VirtualWork(result, end, self, tensor)
        self._close_stretch()  # compute before a blocking call is its own
        self.wait_until(end)   # event, even where the call takes no time
        return result

    def _agreed_with_peer(self, name: str, arguments) -> float:
        """A blocking send or recv starts when both ends have issued it and
        both channels are free, as NCCL's send and recv kernels pair up:
        the two ranks swap their times first (two small real messages)."""
        peer = arguments[POINT_TO_POINT[name]]
        if peer is None or arguments.get("group_dst") is not None or \
                arguments.get("group_src") is not None:
            raise NotImplementedError(
                f"a simulated dist.{name} needs its peer as a global rank "
                f"({POINT_TO_POINT[name]}=...): a recv from any source, or "
                "group_src / group_dst, is not modelled")
        group = arguments.get("group")
        if _is_fake(group):
            return max(self.clock, self.channel_free)
        self.charging = False  # bookkeeping, not the program's work
        try:
            mine = torch.tensor([self.clock, self.channel_free], dtype=torch.float64)
            theirs = torch.empty_like(mine)
            if name == "send":
                dist.send(mine, dst=peer, group=group)
                dist.recv(theirs, src=peer, group=group)
            else:
                dist.recv(theirs, src=peer, group=group)
                dist.send(mine, dst=peer, group=group)
            return float(torch.maximum(mine, theirs).max())
        finally:
            self.charging = True

    def _agreed_start(self, group) -> float:
        """The latest of every rank's issue time and channel-free time: when
        the collective can start (one small real all-gather)."""
        if _is_fake(group):  # every rank is this one: nothing to learn
            return max(self.clock, self.channel_free)
        self.charging = False  # bookkeeping, not the program's work
        try:
            mine = torch.tensor([self.clock, self.channel_free], dtype=torch.float64)
            every = mine.new_empty(2 * dist.get_world_size(group))
            dist.all_gather_single(every, mine, group=group)
            return float(every.max())
        finally:
            self.charging = True

    def finish(self):
        self._close_stretch()
        for work in self._pending:
            if not work.is_completed():
                work.wait()
        return sorted(self.events, key=lambda e: e.start)


class VirtualWork:
    """An async collective's work: `wait()` waits for the real data, then
    moves the rank's compute stream to the collective's virtual end.

    torch's fake process group (`dt.sim.one_rank`) completes every work
    with the value None, where a real group's future holds the collective's
    tensors; torch's DDP hooks read that value, so here the future holds
    `tensor`, as a real group's would (its data stays this rank's)."""

    def __init__(self, work, end: float, recorder: SimulatedRecorder,
                 tensor=None):
        self._work, self._end, self._recorder = work, end, recorder
        self._tensor = tensor

    def wait(self, *args, **kwargs):
        result = self._work.wait(*args, **kwargs)
        self._recorder.wait_until(self._end)
        return result

    def get_future(self):
        end, recorder = self._end, self._recorder
        if in_backward():  # torch's DDP waits
            torch.autograd.Variable._execution_engine.queue_callback(  # at the
                lambda: recorder.wait_until(end))                      # end
        else:
            recorder.wait_until(end)
        future = self._work.get_future()
        if isinstance(self._tensor, torch.Tensor) and future.done() \
                and future.value() is None:  # the fake group's work
            future = torch.futures.Future()
            future.set_result([self._tensor])
        return future

    def __getattr__(self, name):
        return getattr(self._work, name)


class _ChargeEveryOp(TorchDispatchMode):
    """Moves the rank's clock by every ATen operation's simulated time."""

    def __init__(self, recorder: SimulatedRecorder):
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if (self.recorder.charging and func.namespace == "aten"
                and not func.is_view and func.overloadpacket not in FREE_OPS):
            self.recorder.compute(op_seconds(self.recorder.simulation.device,
                                             func, args, kwargs, out))
        return out


def _is_fake(group) -> bool:
    """True in torch's fake process group (`ddp_teach.sim.one_rank`): one
    process stands for every rank, and all of them are assumed to issue
    each call when it does."""
    return dist.get_backend(group) == "fake"


def in_backward() -> bool:
    """True while the autograd engine runs a backward pass, its final
    callbacks (where DDP finishes its buckets) included."""
    return torch._C._current_graph_task_id() != -1


def op_seconds(device, func, args, kwargs, out) -> float:
    """One ATen operation's roofline time on `device`."""
    counter = flop_registry.get(func.overloadpacket)
    flops = counter(*args, **kwargs, out_val=out) if counter else 0
    tensors = list(tensors_in((args, kwargs, out)))
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    floating = [t.dtype for t in tensors if t.is_floating_point()]
    dtype = str(floating[-1]).removeprefix("torch.") if floating else "float32"
    return device.op_seconds(flops, nbytes, dtype)


def tensors_in(value):
    """The tensors in `value`: a tensor, or lists, tuples and dicts of them
    (an operation's arguments and results)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)
    elif isinstance(value, dict):
        yield from tensors_in(list(value.values()))


def _nbytes(value) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_in(value))


@functools.cache
def _signature(call):
    return inspect.signature(call)
