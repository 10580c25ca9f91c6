"""Several simulated GPUs driven by ONE Python process: DataParallel's world.

`dt.run(..., simulate=)` gives every rank a process of its own. DataParallel
drives all its devices from one process instead, one Python thread per
device, and its costs come from exactly that. `SimulatedGPUs(n, simulation)`
gives such a process `n` simulated devices to pass to `ddp_teach.dp`:

    gpus = dt.sim.SimulatedGPUs(4, dt.sim.Simulation("A100 80GB", "PCIe 4 x16"))
    with gpus:                                 # this thread drives them
        model = dt.dp.DataParallel(net, gpus.devices)
        ...                                    # real values, virtual time
    gpus.timeline.plot()

The arithmetic is done for real on the CPU; the time is modelled:

- Host threads. Each Python thread has a virtual clock. Issuing one
  operation holds Python's GIL for `python_s_per_op` seconds, and one thread
  holds it at a time. The threads take the GIL in virtual-time order (the
  earliest asker first, ties to the lower device), which makes a run
  deterministic: the real threads take turns in that same order.
- Device streams. An operation runs on the device of its first tensor
  argument (tensors start on device 0, where DataParallel keeps the module
  and the batch), after it was issued and after the stream's previous
  operation, for its time on the simulated device (`charges`). The
  host does not wait for it: a GPU runs behind its host. `.item()` and
  `synchronize()` wait.
- Backward. On GPUs autograd's engine runs each device's part of the graph
  in a C++ thread of its own that never takes the GIL (one worker thread per
  device: torch/csrc/autograd/engine.cpp), so backward operations cost
  their stream time only.
- Copies. `SimulatedGPU.receive` moves a tensor between devices (what
  `.to("cuda:1")` does): each GPU has one port to the link, a copy keeps
  both ends' ports busy for one message's time (alpha + bytes * beta on a
  `cost.Link`; on a cluster, `Simulation.p2p_seconds`), and the
  destination's stream waits for it. Its backward sends the gradient back.

What it leaves out: copies and kernels that could share a port or a device
at once, memory, and the CPU-side cost of operations outside Python (the
launch cost is in each kernel's `launch_s`).
"""
import contextlib
import math
import threading
from dataclasses import dataclass, replace

import torch
from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                   register_optimizer_step_pre_hook)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakTensorKeyDictionary

from ddp_teach.sim.runtime.charges import FREE_OPS, kernel_seconds, tensors_in
from ddp_teach.sim.runtime.works import in_backward
from ddp_teach.tracing.events import COMM, COMPUTE, Event
from ddp_teach.tracing.timeline import Timeline

TURN_TIMEOUT_S = 120.0


@dataclass
class _Host:
    """A Python thread's virtual clock; `taking_turns` while it runs."""
    device: int
    clock: float
    taking_turns: bool = True


class SimulatedGPU:
    """One simulated device of a `SimulatedGPUs`: pass it where
    `ddp_teach.dp` takes a device."""

    def __init__(self, gpus: "SimulatedGPUs", index: int):
        self.gpus, self.index = gpus, index

    def __repr__(self) -> str:
        return f"sim:{self.index}"

    def receive(self, tensor: torch.Tensor, label: str, grad_label: str):
        """A copy of `tensor` on this device (differentiable: its backward
        sends the gradient back), charged as a copy named `label` on the
        link; the gradient's copy is named `grad_label`."""
        return _Copy.apply(tensor, self.gpus, self.index, label, grad_label)

    def running(self):
        """Inside the thread that drives this device (`dt.dp.parallel_apply`
        enters it): the thread's operations are charged to the simulation."""
        return self.gpus._thread(("worker", self.index))

    def threads(self, devices):
        """Around starting and joining one thread per device: the caller
        pauses while they run, and goes on from the last one's clock."""
        return self.gpus._fork([d.index for d in devices])


class SimulatedGPUs:
    """`n` simulated devices driven from this process (see the module's doc)."""

    def __init__(self, n: int, simulation, python_s_per_op: float = 2e-6):
        """python_s_per_op: how long issuing one operation holds the GIL.
        2 us is what one small eager operation costs from Python on the
        course's test CPU (notebook 02 measures yours); set your own."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an int >= 1 (the number of devices); got {n!r}")
        if not (python_s_per_op >= 0 and math.isfinite(python_s_per_op)):
            raise ValueError(f"python_s_per_op must be >= 0 seconds; got {python_s_per_op!r}")
        self.simulation = simulation
        self.python_s_per_op = python_s_per_op
        self.devices = [SimulatedGPU(self, i) for i in range(n)]
        self._streams = [0.0] * n   # when each device's stream is next free
        self._ports = [0.0] * n     # when each device's link port is next free
        self._gil_free = 0.0
        self._hosts: dict = {}      # ("main",) or ("worker", device) -> _Host
        self._turns = threading.Condition()
        self._local = threading.local()  # .host, .charging
        self._tags = WeakTensorKeyDictionary()  # tensor -> device index
        self._events: list[Event] = []
        self._stretches: dict = {}  # device -> [phase, start, end]
        self._last_copy: dict = {}  # device -> index in _events of its last copy
        self._in_optimizer = 0
        self._hooks = []

    # ---- the public side ---------------------------------------------------

    def __enter__(self):
        if ("main",) in self._hosts:
            raise RuntimeError("these SimulatedGPUs are already in use; make "
                               "a new SimulatedGPUs for another run")
        self._hosts[("main",)] = _Host(0, 0.0)
        self._hooks = [register_optimizer_step_pre_hook(lambda *_: self._optimizer(1)),
                       register_optimizer_step_post_hook(lambda *_: self._optimizer(-1))]
        self._main = self._thread(("main",))
        self._main.__enter__()
        return self

    def __exit__(self, *exc):
        try:
            self.synchronize()
        finally:
            self._main.__exit__(*exc)
            for hook in self._hooks:
                hook.remove()
        for device in list(self._stretches):
            self._close_stretch(device)

    def synchronize(self) -> float:
        """Like `torch.cuda.synchronize()`: the calling thread waits until
        every device is done; returns its virtual clock, in seconds."""
        host = getattr(self._local, "host", None)
        if host is None:
            raise RuntimeError("synchronize() is for the thread that drives "
                               "the simulated GPUs: call it inside `with gpus:`")
        host.clock = max(host.clock, *self._streams)
        return host.clock

    @property
    def timeline(self) -> Timeline:
        """Every device's compute and copies, in virtual seconds."""
        events = list(self._events)
        events += [Event(d, phase, COMPUTE, start, end)
                   for d, (phase, start, end) in self._stretches.items()]
        return Timeline(events, clock=self.simulation.label, lane="device")

    # ---- threads and their turns -------------------------------------------

    @contextlib.contextmanager
    def _thread(self, key):
        host = self._hosts.get(key)
        if host is None:
            raise RuntimeError(f"{key[-1]} is not a device of this run's threads: "
                               "enter `with gpus:` and let dt.dp.parallel_apply "
                               "start the threads")
        self._local.host, self._local.charging = host, True
        mode = _DriveDevices(self)
        try:
            with mode:
                yield
        finally:
            with self._turns:
                host.taking_turns = False
                self._turns.notify_all()

    @contextlib.contextmanager
    def _fork(self, devices):
        parent = self._local.host
        workers = [("worker", d) for d in devices]
        with self._turns:
            parent.taking_turns = False
            for key, device in zip(workers, devices):
                self._hosts[key] = _Host(device, parent.clock)
        try:
            yield
        finally:
            with self._turns:
                ends = [self._hosts.pop(key).clock for key in workers]
                parent.clock = max(parent.clock, *ends)
                parent.taking_turns = True

    def _take_turn(self, host: _Host) -> None:
        """Wait until `host` is the earliest thread in virtual time."""
        def mine():
            waiting = [h for h in self._hosts.values() if h.taking_turns]
            return min(waiting, key=lambda h: (h.clock, h.device)) is host
        with self._turns:
            if not self._turns.wait_for(mine, timeout=TURN_TIMEOUT_S):
                raise RuntimeError(
                    f"a thread driving simulated device {host.device} waited "
                    f"{TURN_TIMEOUT_S:.0f} s for its turn: another thread of the "
                    "run is blocked outside the simulation (waiting for this one?)")

    # ---- charging ----------------------------------------------------------

    def _optimizer(self, step: int) -> None:
        self._in_optimizer += step

    def _issue(self, host: _Host, device: int) -> float:
        """When `host` has issued one operation for `device`: after holding
        the GIL for python_s_per_op, or at once from autograd's engine."""
        if in_backward():
            return host.clock
        start = max(host.clock, self._gil_free)
        host.clock = self._gil_free = start + self.python_s_per_op
        return host.clock

    def _charge(self, func, args, kwargs, out) -> None:
        host = self._local.host
        device = next((self._tags.get(t, 0) for t in tensors_in((args, kwargs))),
                      host.device)
        for t in tensors_in(out):
            self._tags[t] = device
        if func.is_view or func.overloadpacket in FREE_OPS:
            return
        issued = self._issue(host, device)
        start = max(issued, self._streams[device])
        end = self._streams[device] = start + kernel_seconds(
            self.simulation, func, args, kwargs, out)
        phase = ("optimizer" if self._in_optimizer else
                 "backward" if in_backward() else "forward")
        stretch = self._stretches.get(device)
        if stretch and stretch[0] == phase and stretch[2] == start:
            stretch[2] = end
        else:
            self._close_stretch(device)
            self._stretches[device] = [phase, start, end]
        if func is torch.ops.aten._local_scalar_dense.default:  # .item() waits
            host.clock = max(host.clock, end)

    def _add_copy(self, event: Event) -> None:
        """Record a copy; one that follows the same kind of copy between the
        same devices without a gap extends it (the parameters of one
        replicate are one bar)."""
        last = self._last_copy.get(event.rank)
        if last is not None:
            before = self._events[last]
            if before.name == event.name and before.end == event.start:
                self._events[last] = replace(before, end=event.end,
                                             nbytes=before.nbytes + event.nbytes)
                return
        self._last_copy[event.rank] = len(self._events)
        self._events.append(event)

    def _close_stretch(self, device: int) -> None:
        if device in self._stretches:
            phase, start, end = self._stretches.pop(device)
            self._events.append(Event(device, phase, COMPUTE, start, end))

    def _copy(self, tensor: torch.Tensor, source: int, target: int, label: str):
        """`tensor` copied from device `source` to `target`, charged on the
        link (nothing when they are the same device)."""
        host = self._local.host
        self._take_turn(host)
        self._local.charging = False
        try:
            copy = tensor.detach().clone()
        finally:
            self._local.charging = True
        issued = self._issue(host, target)
        if source != target:
            nbytes = tensor.numel() * tensor.element_size()
            start = max(issued, self._streams[source], self._ports[source],
                        self._ports[target])
            end = start + self.simulation.p2p_seconds(nbytes, source, target)
            self._ports[source] = self._ports[target] = end
            self._streams[target] = max(self._streams[target], end)
            name = f"{label} {source}\u2192{target}"
            for d in (source, target):
                self._add_copy(Event(d, name, COMM, start, end, nbytes, op="copy"))
        self._tags[copy] = target
        with self._turns:
            self._turns.notify_all()
        return copy


class _Copy(torch.autograd.Function):
    """A tensor moved to another simulated device; backward moves its
    gradient back (the role of torch's Broadcast / Gather functions)."""

    @staticmethod
    def forward(ctx, tensor, gpus, target, label, grad_label):
        ctx.gpus, ctx.target, ctx.grad_label = gpus, target, grad_label
        ctx.source = gpus._tags.get(tensor, 0)
        return gpus._copy(tensor, ctx.source, target, label)

    @staticmethod
    def backward(ctx, grad):
        return (ctx.gpus._copy(grad, ctx.target, ctx.source, ctx.grad_label),
                None, None, None, None)


class _DriveDevices(TorchDispatchMode):
    """One thread's operations, charged to the simulated devices in turn."""

    def __init__(self, gpus: SimulatedGPUs):
        super().__init__()
        self.gpus = gpus

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        local = self.gpus._local
        if not local.charging or func.namespace != "aten":
            return func(*args, **kwargs)
        local.charging = False  # the operation's own inner calls are not charged
        try:
            self.gpus._take_turn(local.host)
            out = func(*args, **kwargs)
            self.gpus._charge(func, args, kwargs, out)
        finally:
            local.charging = True
            with self.gpus._turns:
                self.gpus._turns.notify_all()
        return out

