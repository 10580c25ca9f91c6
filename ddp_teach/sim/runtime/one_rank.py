"""One rank of a large simulated run, in this process, without the data.

`dt.run(..., simulate=)` starts a worker per rank and moves real data, which
limits it to a few ranks and to models that fit in memory. Many lessons
need neither: every rank of ZeRO-3 or DDP runs the same program on the same
shapes, so one rank's timeline is everyone's. `one_rank` runs `fn(0,
world_size)` here, as rank 0 of torch's *fake* process group (collectives
return at once and move nothing) with the simulated clock of
`ddp_teach.sim.runtime.recorder`: every operation is charged its roofline time,
every collective its alpha-beta time for `world_size` ranks, queued on the
link. Build the model on the meta device (shapes, no memory, no
arithmetic) and a step of a 7-billion-parameter model on 1,024 simulated
GPUs takes seconds.

What it assumes: every rank issues each call when rank 0 does (no
stragglers, no rank-dependent work); what it cannot give: values, since
meta tensors have none.
"""
import torch.distributed as dist

from ddp_teach.sim.runtime.recorder import SimulatedRecorder
from ddp_teach.tracing.recorder import recording
from ddp_teach.tracing.timeline import Timeline


def one_rank(fn, world_size: int, simulation, args=(), kwargs=None):
    """(fn's return value, rank 0's Timeline in virtual seconds) of
    `fn(0, world_size, *args, **kwargs)` run here as rank 0 of `world_size`
    identical simulated ranks (see the module's doc)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore
    if isinstance(world_size, bool) or not isinstance(world_size, int) \
            or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1; got {world_size!r}")
    if dist.is_initialized():
        raise RuntimeError("one_rank makes its own (fake) process group; this "
                           "process already has one: call it outside dt.run "
                           "workers and after destroy_process_group()")
    dist.init_process_group("fake", store=FakeStore(), rank=0,
                            world_size=world_size)
    recorder = SimulatedRecorder(0, simulation)
    try:
        with recording(recorder), recorder.running():
            value = fn(0, world_size, *args, **(kwargs or {}))
    finally:
        dist.destroy_process_group()
    return value, Timeline(recorder.finish(), clock=simulation.label)
