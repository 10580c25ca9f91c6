"""Notebook 10's DDP step, timed on a real GPU and on a simulated one.

The capstone's model is so small that the host, issuing one kernel after
another from Python, sets the pace of its step: the case where a simulator
of the GPU has the least to say. `gpu_vs_sim.py` times this step on the
GPUs at hand, whole and phase by phase, and at larger widths where the GPU
takes over; `published_rows.py` keeps the times measured on the course's
H100 beside the simulator's.
"""
import time

import torch

import ddp_teach as dt
from ddp_teach.tracing.events import COMPUTE

# notebook 10's model and batch: (context, width, layers, heads), rows per rank
CAPSTONE, CAPSTONE_BATCH = (64, 64, 2, 4), 8
PHASES = ("forward", "backward", "optimizer")


def _capstone(rank, device, width, heads):
    """Notebook 10's model in torch's DDP on `device`, its AdamW and a batch:
    (step, drain), where step(mark) runs one training step and calls
    mark(phase) after each of PHASES, and drain waits for the GPU."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    context, _, layers, _ = CAPSTONE
    vocab_size = dt.lm.CharVocab.from_text(dt.lm.stdlib_corpus()).size
    cuda = device == "cuda"
    if cuda:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    model = dt.lm.TinyGPT(vocab_size, context, width, layers, heads).to(device)
    model = DDP(model, device_ids=[torch.cuda.current_device()] if cuda else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-3, foreach=True)
    x, y = torch.randint(vocab_size, (2, CAPSTONE_BATCH, context), device=device)

    def step(mark=lambda phase: None):
        loss = dt.lm.next_token_loss(model(x), y)
        mark("forward")
        loss.backward()
        mark("backward")
        optimizer.step()
        optimizer.zero_grad()
        mark("optimizer")

    return step, (torch.cuda.synchronize if cuda else (lambda: None))


def capstone_step(rank, world_size, device="cpu", steps=1, warmup=2, width=CAPSTONE[1],
                  heads=CAPSTONE[3], phases=False):
    """Seconds per step of notebook 10's DDP step on `device` (its model at
    `width` with `heads` heads), timed from a barrier after `warmup` steps.
    Under `dt.sim.one_rank` (steps=1) the simulated timeline after that
    barrier is the step; in `dt.run` on a GPU the wall clock over `steps`
    steps, the GPU drained at both ends. phases=True: {phase: seconds per
    step} instead, the GPU drained after each phase (which adds its wait)."""
    import torch.distributed as dist

    step, drain = _capstone(rank, device, width, heads)
    spent = dict.fromkeys(PHASES, 0.0)
    last_mark = [0.0]

    def mark(phase):
        """Drain the GPU and charge the time since the last mark to `phase`."""
        drain()
        now = time.perf_counter()
        if phase != "start":
            spent[phase] += now - last_mark[0]
        last_mark[0] = now

    for _ in range(warmup):
        step()
    drain()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        if phases:
            mark("start")
            step(mark)
        else:
            step()
    drain()
    if phases:
        return {phase: seconds / steps for phase, seconds in spent.items()}
    return (time.perf_counter() - start) / steps


def capstone_profile(rank, world_size, device="cuda", steps=10, warmup=3,
                     width=CAPSTONE[1], heads=CAPSTONE[3]) -> dict:
    """Per step of notebook 10's DDP step under torch.profiler: the GPU's
    busy time ("gpu_busy_s": the union of its kernels' spans), how many
    kernels it ran ("kernels") and how many ATen operations the host issued
    ("aten_ops": the outermost ones, not those they call in turn). Draining
    the GPU after each phase (phases=True above) mixes the host's time with
    the waits it adds; the profile tells the GPU's time from the host's."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from ddp_teach.tracing.timeline import total_length
    step, drain = _capstone(rank, device, width, heads)
    for _ in range(warmup):
        step()
    drain()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                           if device == "cuda" else [])
    with profile(activities=activities) as profiled:
        for _ in range(steps):
            step()
        drain()
    events = profiled.events()
    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    outermost = [e for e in events if e.name.startswith("aten::") and not (
        e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::"))]
    busy_us = total_length((e.time_range.start, e.time_range.end) for e in kernels)
    return {"gpu_busy_s": busy_us * 1e-6 / steps, "kernels": len(kernels) / steps,
            "aten_ops": len(outermost) / steps}


def simulated_capstone(simulation, width=CAPSTONE[1], heads=CAPSTONE[3]):
    """The timeline of one simulated `capstone_step` on one GPU of `simulation`."""
    _, timeline = dt.sim.one_rank(capstone_step, 1, simulation,
                                  kwargs={"width": width, "heads": heads})
    return timeline.after_last_barrier()


def simulated_phases(timeline) -> dict:
    """{phase: virtual seconds} of one simulated step: from the end of the
    phase before (the step's start, for forward) to the end of its last
    compute, as a wall clock that drains the GPU after each phase reads it."""
    events = timeline.events
    ends, before = {}, min(e.start for e in events)
    for phase in PHASES:
        end = max(e.end for e in events if e.kind == COMPUTE and e.name == phase)
        ends[phase], before = end - before, end
    return ends
