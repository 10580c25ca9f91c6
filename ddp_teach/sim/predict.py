"""The textbook step times, predicted from the same device and link numbers.

A simulated run (`dt.run(..., simulate=)`) executes the real program; these
functions instead write the schedule down, as a lecture would, so that a
notebook can plot "predicted" beside "simulated" and assert they agree:

- `profile` times one step of a model on ONE simulated device (no ranks, no
  communication): the forward, the backward, and when, during backward, each
  parameter's gradient is ready;
- `compute_only`: forward + backward, the step without data parallelism;
- `naive_ddp`: after backward, one blocking all-reduce (and a division) per
  gradient, one after another;
- `gpipe`: a pipeline step of `ddp_teach.pipeline.gpipe_step` (GPipe,
  Huang et al. 2019), from each stage's times (`pipeline_stage`): every
  blocking send waits for its recv and the link, so a stage idles until
  its neighbour is ready; with equal stages and a free link the idle share
  is GPipe's (p - 1) / (m + p - 1);
- `zero3`: a ZeRO-3 step of `ddp_teach.fsdp` on any link, with and
  without prefetching, from the order and compute of one step traced on a
  free link (`zero3_profile`);
- `bucketed_ddp`: DDP's schedule (Li et al., "PyTorch Distributed", VLDB
  2020): buckets fill in gradient-ready order, each is all-reduced as soon as
  its last gradient is ready AND the link has finished the previous bucket,
  and the step ends when backward and the last all-reduce are both done,
  then every bucket is divided by the world size.

Each collective (and each message of a pipeline) costs its alpha-beta time (`ddp_teach.cost`, ring by
default), each division the device's roofline time of reading and writing
the gradient.
"""
from dataclasses import dataclass

import torch

import torch.nn.functional as F

from ddp_teach.cost import Link, allreduce_time, collective_time
from ddp_teach.ddp import FIRST_BUCKET_CAP_MB, MIB, bucket_indices, check_bucket_cap
from ddp_teach.tracing.events import COMPUTE


@dataclass(frozen=True)
class Profile:
    """One step on one simulated device, in seconds.

    ready: (seconds after backward began, bytes) of each parameter's
    gradient, in `model.parameters()` order."""
    forward_s: float
    backward_s: float
    ready: list
    simulation: object


def profile(model: torch.nn.Module, loss_of, simulation) -> Profile:
    """Time `loss_of(model).backward()` on one simulated device.

    loss_of(model) runs the forward and returns the loss; what it computes is
    charged as forward, what `.backward()` computes as backward."""
    from ddp_teach.sim.runtime import SimulatedRecorder
    clock = SimulatedRecorder(0, simulation)
    params = [p for p in model.parameters() if p.requires_grad]
    ready = {}
    hooks = [p.register_post_accumulate_grad_hook(
        lambda p: ready.__setitem__(p, clock.now())) for p in params]
    try:
        with clock.running():
            loss = loss_of(model)
            forward_s = clock.now()
            loss.backward()
    finally:
        for hook in hooks:
            hook.remove()
    return Profile(forward_s, clock.now() - forward_s,
                   [(ready[p] - forward_s, p.numel() * p.element_size())
                    for p in params], simulation)


def compute_only(prof: Profile) -> float:
    """The step with no data parallelism: forward, then backward."""
    return prof.forward_s + prof.backward_s


def _divide_s(prof: Profile, nbytes: float) -> float:
    """One in-place division of `nbytes` of gradients: read and write them."""
    return prof.simulation.device.op_seconds(0, 2 * nbytes)


def naive_ddp(prof: Profile, world_size: int) -> float:
    """After backward, every gradient all-reduced and divided in turn: all
    the communication is exposed."""
    link = prof.simulation.link
    return compute_only(prof) + sum(
        allreduce_time(nbytes, world_size, link) + _divide_s(prof, nbytes)
        for _, nbytes in prof.ready)


def bucketed_ddp(prof: Profile, world_size: int, bucket_cap_mb: float | None = 25.0,
                 first_bucket_cap_mb: float = FIRST_BUCKET_CAP_MB,
                 overlap: bool = True) -> float:
    """DDP's overlapped schedule (see the module's doc), with
    `ddp_teach.ddp`'s buckets. Its gradients live in the buckets: each step
    zeroes them in forward and backward adds each new gradient into them
    (torch's DDP copies each into its bucket instead: a pass over every
    gradient all the same), which moves every later gradient's ready time.
    overlap=False: the same buckets, all-reduced only once backward is over
    (the baseline against which the DDP paper measures its overlap)."""
    check_bucket_cap(bucket_cap_mb)
    link, device = prof.simulation.link, prof.simulation.device
    cap = None if bucket_cap_mb is None else bucket_cap_mb * MIB
    sizes = [nbytes for _, nbytes in prof.ready]
    forward = prof.forward_s + sum(device.op_seconds(0, 2 * n) for n in sizes)
    ready, added = [0.0] * len(sizes), 0.0
    for i in sorted(range(len(sizes)), key=lambda i: prof.ready[i][0]):
        added += device.op_seconds(0, 3 * sizes[i])  # grad += new gradient
        ready[i] = prof.ready[i][0] + added
    link_free, finish, ends = 0.0, prof.backward_s + added, []
    for bucket in bucket_indices(sizes, cap, first_bucket_cap_mb * MIB):
        nbytes = sum(sizes[i] for i in bucket)
        start = max(max(ready[i] for i in bucket) if overlap else finish,
                    link_free)  # finish: the end of backward, so far
        link_free = start + allreduce_time(nbytes, world_size, link)
        ends.append((link_free, nbytes))
    for end, nbytes in ends:  # wait for each bucket in turn, then divide it
        finish = max(finish, end) + _divide_s(prof, nbytes)
    return forward + finish


@dataclass(frozen=True)
class Stage:
    """One pipeline stage on one simulated device, per micro-batch, in
    seconds: its forward (the loss included on the last stage), its first
    backward of a step (which creates the gradients), each later backward
    (which adds into them), what the last stage does at the end per
    micro-batch (reads its loss), and the bytes of the activation it sends
    on (0 on the last stage)."""
    forward_s: float
    first_backward_s: float
    backward_s: float
    finish_s: float
    boundary_bytes: int


def pipeline_stage(stage: torch.nn.Module, x: torch.Tensor, micro_batches: int,
                   simulation, *, first: bool, target=None,
                   loss_fn=F.mse_loss) -> Stage:
    """Time one stage of `gpipe_step` on one simulated device: `x` is one
    micro-batch's input, `target` its labels on the last stage (None
    elsewhere). Runs two micro-batches as `gpipe_step` does (forwards, then
    backwards, the last first) and leaves the stage's gradients at None."""
    from ddp_teach.sim.runtime import SimulatedRecorder
    clock = SimulatedRecorder(0, simulation)
    last = target is not None
    inputs = [x.detach().clone().requires_grad_(not first) for _ in range(2)]
    stage.zero_grad(set_to_none=True)

    def timed(work):
        start = clock.now()
        result = work()
        return clock.now() - start, result

    with clock.running():
        forward_s, out = timed(lambda: _forward(stage, inputs[0], target,
                                                loss_fn, micro_batches))
        later = _forward(stage, inputs[1], target, loss_fn, micro_batches)
        grad = None if last else torch.empty_like(out)  # free: no kernel
        first_backward_s, _ = timed(lambda: later.backward(grad))
        backward_s, _ = timed(lambda: out.backward(grad))
        finish_s = timed(out.item)[0] if last else 0.0
    stage.zero_grad(set_to_none=True)
    boundary = 0 if last else out.numel() * out.element_size()
    return Stage(forward_s, first_backward_s, backward_s, finish_s, boundary)


def _forward(stage, x, target, loss_fn, micro_batches):
    out = stage(x)
    return out if target is None else loss_fn(out, target) / micro_batches


def gpipe(stages: list, micro_batches: int, link) -> float:
    """The step time of `gpipe_step` on len(stages) ranks: each stage's
    program (receive, forward, send for every micro-batch; then receive,
    backward, send, the last micro-batch first) run against the others'.
    A send and its recv start together once both stages have reached them
    and both links are free, and take one message's alpha-beta time."""
    p, m = len(stages), micro_batches
    programs = []
    for s, stage in enumerate(stages):
        program = []
        for _ in range(m):
            program += [("recv", s - 1)] if s > 0 else []
            program += [("compute", stage.forward_s)]
            program += [("send", s + 1)] if s < p - 1 else []
        for k in range(m):
            program += [("recv", s + 1)] if s < p - 1 else []
            program += [("compute", stage.backward_s if k else stage.first_backward_s)]
            program += [("send", s - 1)] if s > 0 else []
        program += [("compute", m * stage.finish_s)]
        programs.append(program)
    return _run_programs(programs, lambda src, dst: collective_time(
        "send_recv", stages[min(src, dst)].boundary_bytes, 2, link))


def _run_programs(programs, message_s) -> float:
    """Advance every stage through its program: compute runs at once; a
    send runs when its receiver's next step is the matching recv."""
    clock = [0.0] * len(programs)
    link_free = [0.0] * len(programs)
    at = [0] * len(programs)
    moved = True
    while moved:
        moved = False
        for s, program in enumerate(programs):
            while at[s] < len(program) and program[at[s]][0] == "compute":
                clock[s] += program[at[s]][1]
                at[s] += 1
                moved = True
            if at[s] < len(program) and program[at[s]][0] == "send":
                t = program[at[s]][1]
                if at[t] < len(programs[t]) and programs[t][at[t]] == ("recv", s):
                    start = max(clock[s], link_free[s], clock[t], link_free[t])
                    clock[s] = clock[t] = link_free[s] = link_free[t] = \
                        start + message_s(s, t)
                    at[s] += 1
                    at[t] += 1
                    moved = True
    if any(a < len(program) for a, program in zip(at, programs)):
        raise RuntimeError("the pipeline's programs deadlock")  # our bug
    return max(clock)


def zero3_profile(step, world_size: int, simulation, args=()):
    """Rank 0's timeline of `step(rank, world_size, *args)` (a
    `ddp_teach.fsdp` step after a barrier, prefetch off) on a free link:
    the compute between the collectives, in order, with their bytes."""
    from ddp_teach.sim import Simulation  # (the package imports this module)
    from ddp_teach.sim.one_rank import one_rank
    free = Simulation(simulation.device, Link(0.0, 0.0))
    return one_rank(step, world_size, free, args)[1].after_last_barrier()


def zero3(profile, world_size: int, link, prefetch: bool = False) -> float:
    """The step time of the traced ZeRO-3 step on `link`: every all-gather
    and reduce-scatter blocks the rank for its alpha-beta time; with
    `prefetch`, a unit's backward all-gather is issued as soon as the
    previous unit's has arrived (backward order: the reverse of forward's),
    so it runs on the link while that unit computes, and the reduce-scatter
    after that compute queues behind it (backward prefetching: Zhao et al.,
    "PyTorch FSDP", VLDB 2023)."""
    clock = link_free = 0.0
    nbytes, pending, regathered, in_backward = {}, {}, set(), False

    def on_link(op, size):
        nonlocal link_free
        link_free = max(clock, link_free) + collective_time(op, size, world_size,
                                                            link)
        return link_free

    for event in profile:
        if event.kind == COMPUTE:
            clock += event.duration
            in_backward = in_backward or event.name == "backward"
            continue
        unit, op = event.name.removeprefix("unit ").rsplit(" ", 1)
        if op == "reduce-scatter":
            clock = on_link("reduce_scatter", event.nbytes)
        elif not in_backward:
            nbytes[unit] = event.nbytes  # forward: the order of the units
            clock = on_link("all_gather", event.nbytes)
        else:
            clock = (max(clock, pending.pop(unit)) if unit in pending
                     else on_link("all_gather", event.nbytes))
            regathered.add(unit)
            backward_order = list(nbytes)[::-1]
            after = backward_order[backward_order.index(unit) + 1:]
            if prefetch and after and after[0] not in regathered | set(pending):
                pending[after[0]] = on_link("all_gather", nbytes[after[0]])
    return max([clock, *pending.values()])
