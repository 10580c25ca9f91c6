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
- `gpipe`: a pipeline step of `ddp_teach.pipeline.gpipe_step`, from each
  stage's times (`pipeline_stage`; both in `ddp_teach.sim.schedules.pipeline`);
- `zero3`: a ZeRO-3 step of `ddp_teach.fsdp` on any link, with and
  without prefetching, from the order and compute of one step traced on a
  free link (`zero3_profile`); `fsdp2`: the same step as torch's FSDP2
  overlaps it (`ddp_teach.sim.schedules.fsdp`);
- `collective`: one collective's time on the simulation's link or cluster
  (on a cluster, as NCCL would run it: `ddp_teach.sim.model.comm`);
- `bucketed_ddp`: DDP's schedule (Li et al., "PyTorch Distributed", VLDB
  2020): buckets fill in gradient-ready order, each is all-reduced as soon as
  its last gradient is ready AND the link has finished the previous bucket,
  and the step ends when backward and the last all-reduce are both done,
  then every bucket is divided by the world size.

Each collective (and each message of a pipeline) costs what the simulation
charges for it (`collective`: alpha-beta on a link, ring by default; NCCL's
choice on a cluster), each division the device's time to read and write
the gradient. The host clock and the slowdown of overlapped compute of
achieved compute are left out: predictions are exact for datasheet-peak
simulations, and estimates for achieved ones.
"""
from dataclasses import dataclass

import torch

from ddp_teach.buckets import FIRST_BUCKET_CAP_MB, MIB, bucket_indices, check_bucket_cap
from ddp_teach.cost import Link, collective_time
from ddp_teach.sim.model.efficiency import rate_seconds
from ddp_teach.sim.schedules.fsdp import fsdp2  # noqa: F401 (part of predict)
from ddp_teach.sim.runtime.one_rank import one_rank
from ddp_teach.sim.schedules.pipeline import Stage, gpipe, pipeline_stage  # noqa: F401
from ddp_teach.sim.runtime.recorder import SimulatedRecorder
from ddp_teach.sim.model.simulation import Simulation
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


def collective(op: str, nbytes: float, world_size: int, simulation,
               algorithm: str | None = None) -> float:
    """Seconds of collective `op` ("all_reduce", "all_gather",
    "reduce_scatter", "broadcast"; "reduce" too on a cluster) on `nbytes`
    (the whole buffer: all-gather's output, reduce-scatter's input) over
    ranks 0..world_size-1 of `simulation`. On a link: the alpha-beta time
    of `algorithm` (`ddp_teach.cost`; None: ring). On a cluster: what NCCL
    runs, `algorithm` None for NCCL's own choice (ring, tree, NVLS, NVLS
    tree, each with its fastest protocol of LL, LL128, Simple), or "ring",
    "tree", "nvls", "nvls_tree" to force one (as NCCL_ALGO does)."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1; got {world_size!r}")
    return simulation.collective_seconds(op, nbytes, world_size, algorithm)


def _on(spec, op: str, nbytes: float, world_size: int) -> float:
    """A collective's seconds on a `cost.Link` or a Simulation."""
    if isinstance(spec, Link):
        return collective_time(op, nbytes, world_size, spec)
    return spec.collective_seconds(op, nbytes, world_size)


def _streaming_s(simulation, nbytes: float) -> float:
    """One kernel that reads or writes `nbytes`, in the simulation's mode."""
    achieved = simulation.achieved
    if achieved is None:
        return simulation.device.op_seconds(0, nbytes)
    return rate_seconds(simulation.device, achieved, "memory", 0, nbytes)


def compute_only(prof: Profile) -> float:
    """The step with no data parallelism: forward, then backward."""
    return prof.forward_s + prof.backward_s


def _divide_s(prof: Profile, nbytes: float) -> float:
    """One in-place division of `nbytes` of gradients: read and write them."""
    return _streaming_s(prof.simulation, 2 * nbytes)


def naive_ddp(prof: Profile, world_size: int) -> float:
    """After backward, every gradient all-reduced and divided in turn: all
    the communication is exposed."""
    return compute_only(prof) + sum(
        _on(prof.simulation, "all_reduce", nbytes, world_size) + _divide_s(prof, nbytes)
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
    simulation = prof.simulation
    cap = None if bucket_cap_mb is None else bucket_cap_mb * MIB
    sizes = [nbytes for _, nbytes in prof.ready]
    forward = prof.forward_s + sum(_streaming_s(simulation, 2 * n) for n in sizes)
    ready, added = [0.0] * len(sizes), 0.0
    for i in sorted(range(len(sizes)), key=lambda i: prof.ready[i][0]):
        added += _streaming_s(simulation, 3 * sizes[i])  # grad += new gradient
        ready[i] = prof.ready[i][0] + added
    link_free, finish, ends = 0.0, prof.backward_s + added, []
    for bucket in bucket_indices(sizes, cap, first_bucket_cap_mb * MIB):
        nbytes = sum(sizes[i] for i in bucket)
        start = max(max(ready[i] for i in bucket) if overlap else finish,
                    link_free)  # finish: the end of backward, so far
        link_free = start + _on(simulation, "all_reduce", nbytes, world_size)
        ends.append((link_free, nbytes))
    for end, nbytes in ends:  # wait for each bucket in turn, then divide it
        finish = max(finish, end) + _divide_s(prof, nbytes)
    return forward + finish


def zero3_profile(step, world_size: int, simulation, args=()):
    """Rank 0's timeline of `step(rank, world_size, *args)` (a
    `ddp_teach.fsdp` step after a barrier, prefetch off) on a free link:
    the compute between the collectives, in order, with their bytes."""
    free = Simulation(simulation.device, Link(0.0, 0.0), compute=simulation.compute,
                      attention=simulation.attention)
    return one_rank(step, world_size, free, args)[1].after_last_barrier()


def zero3(profile, world_size: int, link, prefetch: bool = False) -> float:
    """The step time of the traced ZeRO-3 step on `link` (a `cost.Link`, or a
    Simulation for its link or cluster): every all-gather and
    reduce-scatter blocks the rank for its time there; with
    `prefetch`, a unit's backward all-gather is issued as soon as the
    previous unit's has arrived (backward order: the reverse of forward's),
    so it runs on the link while that unit computes, and the reduce-scatter
    after that compute queues behind it (backward prefetching: Zhao et al.,
    "PyTorch FSDP", VLDB 2023)."""
    clock = link_free = 0.0
    nbytes, pending, regathered, in_backward = {}, {}, set(), False

    def on_link(op, size):
        nonlocal link_free
        link_free = max(clock, link_free) + _on(link, op, size, world_size)
        return link_free

    for event in profile:
        if event.kind == COMPUTE:
            clock += event.duration
            in_backward = in_backward or event.name == "backward"
            continue
        unit = event.name  # a unit's gathers share its label ("unit 0 all-gather")
        if event.op == "reduce_scatter":
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
