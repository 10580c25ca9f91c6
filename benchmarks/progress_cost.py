"""What `dt.progress` costs a training step.

Why: the capstone and the sweeps call `dt.progress(step, total, loss=...)`
every step, so its cost must be negligible beside a step (the project issue
asks for it measured here). A worker sends at most ten reports a second, so
most calls are a clock read and a comparison; the reports that are sent
cost a JSON line on a pipe and the kernel's drawing.

Measured inside `dt.run` workers (2 ranks): the time per call of a loop that
only calls `dt.progress`, against the same loop without it, and a small real
step (a 2-layer MLP of width 256, batch 32, forward, backward and SGD) with
and without the call. Repetitions interleave the variants so that noise on
a shared machine hits them alike. Writes benchmarks/progress_cost.md.

Run from the repo root: `make bench`.
"""
import datetime
import os
import platform
import statistics

import torch

import ddp_teach as dt
from section import publish

WORLD_SIZE = 2
CALLS = 20_000
STEPS = 300
REPEATS = 5
TARGET_FRACTION = 0.01  # of a small step


def per_call_seconds(rank, world_size, report: bool) -> float:
    """Seconds per iteration of a loop that does nothing else."""
    import time
    started = time.perf_counter()
    for step in range(CALLS):
        if report:
            dt.progress(step + 1, CALLS, loss=0.5)
    return (time.perf_counter() - started) / CALLS


def per_step_seconds(rank, world_size, report: bool) -> float:
    """Median seconds of a small training step, with or without the call."""
    import time
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 256)
    times = []
    for step in range(STEPS):
        started = time.perf_counter()
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if report:
            dt.progress(step + 1, STEPS, loss=loss.item())
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure() -> dict:
    samples = {key: [] for key in ("loop", "loop+progress", "step", "step+progress")}
    for repeat in range(REPEATS):
        for report in ((False, True) if repeat % 2 == 0 else (True, False)):
            suffix = "+progress" if report else ""
            samples["loop" + suffix].append(
                max(dt.run(per_call_seconds, WORLD_SIZE, args=(report,))))
            samples["step" + suffix].append(
                max(dt.run(per_step_seconds, WORLD_SIZE, args=(report,))))
    return {key: statistics.median(values) for key, values in samples.items()}


def report(medians: dict) -> str:
    call = medians["loop+progress"] - medians["loop"]
    step = medians["step"]
    fraction = call / step
    met = fraction <= TARGET_FRACTION
    lines = [
        "# dt.progress: its cost on a step",
        "",
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"- machine: {os.cpu_count()} CPUs, {platform.platform()}",
        f"- python {platform.python_version()}, torch {torch.__version__}",
        f"- {WORLD_SIZE} ranks; {REPEATS} interleaved repetitions; medians",
        "",
        "| what | median |",
        "|---|---|",
        f"| empty loop, per iteration | {medians['loop'] * 1e9:.0f} ns |",
        f"| loop calling dt.progress, per iteration | {medians['loop+progress'] * 1e9:.0f} ns |",
        f"| **dt.progress, per call** | **{call * 1e9:.0f} ns** |",
        f"| small step (MLP 256, batch 32, fwd+bwd+SGD) | {step * 1e6:.1f} us |",
        f"| the same step calling dt.progress | {medians['step+progress'] * 1e6:.1f} us |",
        "",
        "## Target",
        "",
        f"- one call <= {TARGET_FRACTION:.0%} of the small step: "
        f"{fraction:.3%} -> **{'met' if met else 'NOT met'}**",
        "",
        "## Method",
        "",
        f"*Per call*: {CALLS:,} iterations in each worker, with and without the "
        "call; the difference per iteration (most calls only read the clock, "
        "since a worker sends at most ten reports a second). *Step*: the "
        f"median of {STEPS} steps per worker. Each value is the slower rank's; "
        "variants alternate in order between repetitions.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    text = report(measure())
    publish("progress_cost.md", text)


if __name__ == "__main__":
    main()
