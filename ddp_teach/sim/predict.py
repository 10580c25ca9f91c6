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
- `bucketed_ddp`: DDP's schedule (Li et al., "PyTorch Distributed", VLDB
  2020): buckets fill in gradient-ready order, each is all-reduced as soon as
  its last gradient is ready AND the link has finished the previous bucket,
  and the step ends when backward and the last all-reduce are both done,
  then every bucket is divided by the world size.

Each collective costs its alpha-beta time (`ddp_teach.cost`, ring by
default), each division the device's roofline time of reading and writing
the gradient.
"""
from dataclasses import dataclass

import torch

from ddp_teach.cost import allreduce_time
from ddp_teach.ddp import FIRST_BUCKET_CAP_MB, MIB, bucket_indices


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
                 first_bucket_cap_mb: float = FIRST_BUCKET_CAP_MB) -> float:
    """DDP's overlapped schedule (see the module's doc), with
    `ddp_teach.ddp`'s buckets. Its gradients live in the buckets: each step
    zeroes them in forward and backward adds each new gradient into them
    (torch's DDP copies each into its bucket instead: a pass over every
    gradient all the same), which moves every later gradient's ready time."""
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
        start = max(max(ready[i] for i in bucket), link_free)
        link_free = start + allreduce_time(nbytes, world_size, link)
        ends.append((link_free, nbytes))
    for end, nbytes in ends:  # wait for each bucket in turn, then divide it
        finish = max(finish, end) + _divide_s(prof, nbytes)
    return forward + finish
