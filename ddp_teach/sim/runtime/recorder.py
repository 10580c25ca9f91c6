"""Inside each worker of a simulated run: the virtual clock and its charges.

A `SimulatedRecorder` replaces the trace's recorder. Its clock is the rank's
compute stream, in virtual seconds from the start of the function:

- `running()` puts a dispatch mode (`charges.ChargeEveryOp`) around the
  learner's function, which sees every ATen operation (forward, the autograd engine's backward, the
  optimizer's update), lets the CPU compute it, and moves the clock by the
  operation's time on the simulated device (`charges`: a roofline at
  datasheet peak, or what real kernels achieve). Views and allocations are
  free. The time the CPU took never enters the clock. Meanwhile
  scaled_dot_product_attention is charged as one fused kernel
  (`attention`).
- With achieved compute there is a host clock too: each operation costs the
  host `host_s_per_op` to issue, and its kernel starts once it is issued and
  the stream is free, so small kernels wait for the host. `.item()` and a
  barrier make the host wait for the stream; a blocking collective makes
  only the stream wait, as NCCL's do. Inside `optimizer.step()`, operations
  on nothing but 0-dimensional CPU tensors are the host's own: torch's
  optimizers keep their step counters as such "CPU scalars" beside
  parameters on the GPU, unless capturable or fused (`_init_group` in
  torch/optim/adam.py and adamw.py), and read them with `.item()` without
  waiting for the GPU; they cost host time and no kernel. Compute that
  runs while a collective occupies the channel is slowed by
  `overlap_slowdown`.
- `record_call` (every torch.distributed collective, wrapped as in a traced
  run) first exchanges, over the same group, each rank's issue time and when
  its communication channel is free; the collective starts at the latest of
  them, lasts the simulation's time for it (`Simulation.collective_seconds`:
  alpha-beta on a link, NCCL's algorithms on a cluster) and occupies the
  channel until then, so calls queue in issue order. A blocking send or
  recv does the same with its one peer. Only then is the real call made, so
  real data still moves. A blocking call moves the clock to the end; an
  async one returns a work whose `wait()` does, and a future taken during
  backward moves it at the end of backward (when torch's DDP waits for its
  buckets).

Compute is recorded as one event per stretch of a phase ("forward",
"backward", "optimizer"), in place of the program's own `span` and
`trace_layers` marks; the clock only depends on the program and the tensor
shapes, so the events are the same on any machine under any load.
"""
import collections
import contextlib
import functools
import inspect

import torch
import torch.distributed as dist
from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                   register_optimizer_step_pre_hook)

from ddp_teach import compat
from ddp_teach.sim.runtime.attention import fused_attention
from ddp_teach.sim.runtime.charges import ChargeEveryOp
from ddp_teach.sim.model.efficiency import overlapped_end
from ddp_teach.sim.runtime.works import VirtualWork, in_backward
from ddp_teach.tracing.events import COMM, COMPUTE
from ddp_teach.tracing.operations import call_bytes, operation
from ddp_teach.tracing.recorder import Recorder

# torch.distributed call -> (cost model op, the argument holding its buffer); an
# event's op and nbytes are `tracing.operations`', as a traced run's are
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
PHASES = ("forward", "backward", "optimizer")


class SimulatedRecorder(Recorder):
    """A rank's virtual clock, compute stream and communication channel."""

    def __init__(self, rank: int, simulation):
        super().__init__(rank)
        self.simulation = simulation
        self.achieved = simulation.achieved  # None: datasheet peak, no host
        self.clock = 0.0       # the compute stream, virtual seconds
        self.host = 0.0        # when the host has issued everything so far
        self.channel_free = 0.0
        self._busy = collections.deque()  # (start, end) of collectives on it
        self.in_optimizer = 0  # depth of optimizer.step() calls
        self.charging = True   # False while the simulator does its own work
        self._stretch = None   # [phase, start, end] of the compute being recorded

    def now(self) -> float:
        """When everything issued so far is done and issued."""
        return max(self.clock, self.host)

    def mark(self, name, kind, start, end, nbytes=0) -> None:
        """The program's own marks (`span`, `trace_layers`) are left out:
        a simulated run records its compute itself, phase by phase."""

    @contextlib.contextmanager
    def running(self):
        compat.register_meta_collectives()  # a step on meta tensors, torch 2.9-2.10
        hooks = [register_optimizer_step_pre_hook(lambda *_: self._enter_optimizer(1)),
                 register_optimizer_step_post_hook(lambda *_: self._enter_optimizer(-1))]
        try:
            with fused_attention(self), ChargeEveryOp(self):
                yield
        finally:
            for hook in hooks:
                hook.remove()

    def _enter_optimizer(self, step: int) -> None:
        self.in_optimizer += step

    def kernel(self, seconds: float) -> None:
        """One kernel of `seconds` (alone on the GPU): issued by the host,
        run on the compute stream, slowed where a collective runs beside it."""
        achieved = self.achieved
        if achieved is None:
            self.compute(seconds)
            return
        self.host += achieved.host_s_per_op
        start = max(self.host, self.clock)
        self.wait_until(start)
        self.compute(self._stretched(start, seconds, achieved.overlap_slowdown) - start)

    def _stretched(self, start: float, work: float, slowdown: float) -> float:
        busy = self._busy
        while busy and busy[0][1] <= start:
            busy.popleft()
        return overlapped_end(start, work, busy, slowdown)

    def host_op(self) -> None:
        """An operation the host does alone: its issue time, no kernel."""
        if self.achieved is not None:
            self.host += self.achieved.host_s_per_op

    def sync_host(self) -> None:
        """The host waits for the stream (`.item()`, a barrier)."""
        self.host = max(self.host, self.clock)

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
        if self.achieved is not None:
            self.host += self.achieved.host_s_per_op  # the launch
        try:
            nbytes = call_bytes(name, call, args, kwargs)  # what a traced run counts
            if name in POINT_TO_POINT:
                start = self._agreed_with_peer(name, bound.arguments)
                end = start + self.simulation.p2p_seconds(
                    nbytes, self.rank, bound.arguments[POINT_TO_POINT[name]])
            else:
                op, data = COLLECTIVES[name]
                group = bound.arguments.get("group")
                start = self._agreed_start(group)
                end = start + self.simulation.collective_seconds(
                    op, nbytes, _global_ranks(group))
            self.channel_free = end
            self._busy.append((start, end))
            self.charging = False  # what the CPU backend does inside is the link's
            result = call(*args, **kwargs)  # the real data, moved for real
        finally:
            local.depth = 0
            self.charging = True
        self.add(getattr(local, "label", None) or compat.traced_name(name), COMM, start,
                 end, nbytes, op=operation(name))
        if bound.arguments.get("async_op"):
            self._pending.append(result)
            tensor = bound.arguments.get(data) if name in COLLECTIVES else None
            return VirtualWork(result, end, self, tensor)
        self._close_stretch()  # compute before a blocking call is its own
        self.wait_until(end)   # event, even where the call takes no time
        if name == "barrier":
            self.sync_host()
        return result

    def _issued(self) -> float:
        """When a call issued now can start on this rank: the host has issued
        it and the compute stream has done what came before."""
        return max(self.clock, self.host)

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
            return max(self._issued(), self.channel_free)
        self.charging = False  # bookkeeping, not the program's work
        try:
            mine = torch.tensor([self._issued(), self.channel_free], dtype=torch.float64)
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
            return max(self._issued(), self.channel_free)
        self.charging = False  # bookkeeping, not the program's work
        try:
            mine = torch.tensor([self._issued(), self.channel_free], dtype=torch.float64)
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


def _global_ranks(group) -> list:
    """The global ranks of `group` (the default group when None)."""
    if group is None or group is dist.GroupMember.WORLD:
        return list(range(dist.get_world_size()))
    return dist.get_process_group_ranks(group)


def _is_fake(group) -> bool:
    """True in torch's fake process group (`ddp_teach.sim.runtime.one_rank`): one
    process stands for every rank, and all of them are assumed to issue
    each call when it does."""
    return dist.get_backend(group) == "fake"


@functools.cache
def _signature(call):
    return inspect.signature(call)
