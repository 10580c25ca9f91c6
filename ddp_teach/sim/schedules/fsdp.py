"""The step time of a ZeRO-3 step scheduled as torch's FSDP2 schedules it.

The course's FSDP (`ddp_teach.fsdp`) waits for every forward all-gather and
every reduce-scatter, and prefetches one unit ahead in backward only;
`predict.zero3` times that schedule. torch's FSDP2 (`fully_shard`) overlaps
more: its collectives run on CUDA streams of their own, the CPU runs ahead
of the GPU, so the next unit's all-gather is issued while the current unit
computes, in forward ("implicit prefetching") as in backward, and a unit's
reduce-scatter runs while the next unit's backward computes; the step
waits for the last reduce-scatter at the end of backward (Zhao et al.,
"PyTorch FSDP", VLDB 2023, section 3.3; torch's FSDP2 design,
torch/distributed/fsdp/_fully_shard). `fsdp2` replays a traced step of the
course's FSDP under those rules:

- each compute stretch first issues the next all-gather of the trace (one
  ahead: FSDP2 keeps at most the current and the next unit gathered);
- an all-gather blocks compute only until it has arrived;
- a reduce-scatter is issued when it is reached and blocks nothing until
  the end of backward: the optimizer's step waits for all of them;
- collectives queue on one channel in issue order, and compute that runs
  beside one is slowed by the device's `overlap_slowdown` (achieved compute).
"""
from ddp_teach.sim.model.efficiency import overlapped_end
from ddp_teach.tracing.events import COMPUTE


def fsdp2(profile, world_size: int, simulation) -> float:
    """Seconds of the step in `profile` (`predict.zero3_profile`: rank 0's
    compute and collectives on a free link) scheduled as FSDP2 would, with
    `simulation`'s collective times for `world_size` ranks."""
    items = []
    for event in profile:
        if event.kind == COMPUTE:
            items.append(("optimizer" if event.name == "optimizer" else "compute",
                          event.duration))
        else:
            items.append((event.op, event.nbytes))
    achieved = simulation.achieved
    slowdown = achieved.overlap_slowdown if achieved is not None else 1.0
    clock = channel_free = 0.0
    busy, arrived, scatters = [], {}, []

    def issue(index):
        nonlocal channel_free
        op, nbytes = items[index]
        start = max(clock, channel_free)
        channel_free = start + simulation.collective_seconds(op, nbytes, world_size)
        busy.append((start, channel_free))
        return channel_free

    for index, (what, amount) in enumerate(items):
        if what == "optimizer":  # after backward, which waits for its scatters
            clock = max([clock, *scatters]) + amount
        elif what == "compute":
            upcoming = next((i for i in range(index + 1, len(items))
                             if items[i][0] == "all_gather"), None)
            if upcoming is not None and upcoming not in arrived:
                arrived[upcoming] = issue(upcoming)
            clock = overlapped_end(clock, amount, busy, slowdown)
        elif what == "all_gather":
            if index not in arrived:
                arrived[index] = issue(index)
            clock = max(clock, arrived[index])
        else:
            scatters.append(issue(index))
    return max([clock, *scatters])
