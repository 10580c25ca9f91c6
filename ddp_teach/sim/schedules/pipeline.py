"""The step time of a GPipe pipeline, from each stage's simulated times.

`gpipe` times a step of `ddp_teach.pipeline.gpipe_step` (GPipe, Huang et
al., NeurIPS 2019) from each stage's times (`pipeline_stage`): every
blocking send waits for its recv and the link, so a stage idles until its
neighbour is ready; with equal stages and a free link the idle share is
GPipe's (p - 1) / (m + p - 1). Part of `ddp_teach.sim.schedules.predict`.
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ddp_teach.cost import Link, collective_time
from ddp_teach.sim.runtime.recorder import SimulatedRecorder


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
    and both links are free, and take one message's time: alpha-beta on
    `link` (a `cost.Link`), or stage s on rank s of a Simulation."""
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
    def message_s(src, dst):
        nbytes = stages[min(src, dst)].boundary_bytes
        if isinstance(link, Link):
            return collective_time("send_recv", nbytes, 2, link)
        return link.p2p_seconds(nbytes, src, dst)
    return _run_programs(programs, message_s)


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
