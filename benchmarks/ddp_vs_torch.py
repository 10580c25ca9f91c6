"""The course's DistributedDataParallel against torch's, step for step.

Model: the MLP of the course's reference sheet (8 x Linear(1024, 1024) +
ReLU, 32 MiB of gradients), batch 256 per rank, CPU gloo, world sizes 2
and 4. Three variants, each timed over forward + backward (no optimizer):

* compute: the bare model, no communication at all (the floor);
* torch:   torch.nn.parallel.DistributedDataParallel, default settings;
* ours:    ddp_teach.ddp.DistributedDataParallel, default 25 MB buckets.

A step ends when `backward()` returns, when both DDPs hold the averaged
gradients. `zero_grad()` (set_to_none, as `optimizer.zero_grad()` does) runs
after each step, outside the timed window, for every variant; so ours pays
for zeroing its bucket buffers inside its forward, as it would in training.
Each variant is one `dt.run` per repetition, the variants interleaved over
the repetitions so that noise from other work on the machine hits all of
them alike; the figure is the median over every rank's measured steps.

A last run of ours, instrumented from outside (ddp.py is not changed),
splits its step into the forward's re-attachment of gradient views, the
gradient hooks, the all-reduce launches, the wait for them, and the rest of
the final synchronisation (the division by the world size).

Run from the repo root: `make bench` (or `.venv/bin/python
benchmarks/ddp_vs_torch.py`). Writes benchmarks/ddp_vs_torch.md.
"""
import datetime
import os
import platform
import statistics
import sys
import time

import torch

import ddp_teach as dt
from ddp_teach.models import reference_mlp
from ddp_teach.system import threads_per_rank
from section import publish

WIDTH, DEPTH, BATCH = 1024, 8, 256
WORLD_SIZES = (2, 4)
WARMUP_STEPS, STEPS, REPEATS = 1, 4, 3
VARIANTS = ("compute", "torch", "ours")
TARGET = 1.10  # ours / torch step time
TIMEOUT = 300.0


def mlp() -> torch.nn.Module:
    return reference_mlp(WIDTH, DEPTH)


def wrap(variant: str, model):
    if variant == "torch":
        return torch.nn.parallel.DistributedDataParallel(model)
    if variant == "ours":
        return dt.ddp.DistributedDataParallel(model)
    return model


def steps(rank, world_size, variant: str) -> list[float]:
    """Seconds per step (forward + backward, gradients synced) on this rank."""
    model = wrap(variant, mlp())
    torch.manual_seed(rank)
    batch = torch.randn(BATCH, WIDTH)
    times = []
    for _ in range(WARMUP_STEPS + STEPS):
        started = time.perf_counter()
        model(batch).square().mean().backward()
        times.append(time.perf_counter() - started)
        model.zero_grad()
    return times[WARMUP_STEPS:]


def breakdown(rank, world_size) -> dict:
    """Where our step goes, in seconds per step: the same loop as `steps`
    with timers wrapped around the parts of ours (patched in this worker
    only, before the model is built)."""
    import torch.distributed as dist
    from ddp_teach import ddp
    spent = dict(attach=0.0, hooks=0.0, launch=0.0, finish=0.0, wait=0.0)

    def timed(key, fn):
        def inner(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[key] += time.perf_counter() - t
        return inner

    class TimedWork:
        def __init__(self, work):
            self._work = work

        def wait(self, *args, **kwargs):
            return timed("wait", self._work.wait)(*args, **kwargs)

    all_reduce = dist.all_reduce

    def launch(*args, **kwargs):
        work = timed("launch", all_reduce)(*args, **kwargs)
        return TimedWork(work) if kwargs.get("async_op") else work

    dist.all_reduce = launch
    ddp.Bucket.attach_grads = timed("attach", ddp.Bucket.attach_grads)
    cls = ddp.DistributedDataParallel
    cls._on_gradient_ready = timed("hooks", cls._on_gradient_ready)
    cls.finish_gradient_synchronization = timed(
        "finish", cls.finish_gradient_synchronization)

    model = cls(mlp())
    torch.manual_seed(rank)
    batch = torch.randn(BATCH, WIDTH)
    forward_s = backward_s = 0.0
    for step in range(WARMUP_STEPS + STEPS):
        if step == WARMUP_STEPS:
            spent.update(dict.fromkeys(spent, 0.0))
            forward_s = backward_s = 0.0
        t0 = time.perf_counter()
        loss = model(batch).square().mean()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        forward_s += t1 - t0
        backward_s += t2 - t1
        model.zero_grad()
    per_step = {k: v / STEPS for k, v in spent.items()}
    per_step.update(forward=forward_s / STEPS, backward=backward_s / STEPS,
                    n_buckets=len(model.buckets))
    return per_step


def median_ms(samples: list[float]) -> float:
    return 1000 * statistics.median(samples)


def measure(world_size: int) -> dict:
    samples = {v: [] for v in VARIANTS}
    for _ in range(REPEATS):
        for variant in VARIANTS:
            result = dt.run(steps, world_size, args=(variant,), timeout=TIMEOUT)
            samples[variant] += [t for rank_times in result for t in rank_times]
    parts = dt.run(breakdown, world_size, timeout=TIMEOUT)
    mean_parts = {k: statistics.mean(p[k] for p in parts) for k in parts[0]}
    return {"ms": {v: median_ms(s) for v, s in samples.items()},
            "spread": {v: (1000 * min(s), 1000 * max(s)) for v, s in samples.items()},
            "n": {v: len(s) for v, s in samples.items()},
            "parts": mean_parts}


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f
                       if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count()
    return (f"{cpu}, {cores} usable cores (shared with other work), "
            f"{platform.system()} {platform.release()}; Python "
            f"{platform.python_version()}, torch {torch.__version__}, gloo "
            f"over loopback; intra-op threads per rank: "
            + ", ".join(f"{threads_per_rank(w)} at world {w}" for w in WORLD_SIZES))


def report(results: dict, took_s: float) -> str:
    lines = [
        "# Our DistributedDataParallel vs torch's",
        "",
        f"Date: {datetime.date.today().isoformat()}. Machine: {machine()}.",
        "",
        f"MLP {DEPTH} x (Linear({WIDTH}, {WIDTH}) + ReLU), batch {BATCH} per rank, "
        f"CPU gloo. Step = forward + backward with gradients averaged when "
        f"`backward()` returns (no optimizer). Median over every rank's steps: "
        f"{REPEATS} interleaved repetitions x {STEPS} measured steps after "
        f"{WARMUP_STEPS} warm-up, per variant. Overlap efficiency = compute-only "
        f"step time / DDP step time (1.0: communication fully hidden). "
        f"Target: ours <= {TARGET:.2f} x torch's DDP.",
        "",
        "| world size | compute-only ms | torch DDP ms | ours ms | ours / torch "
        "| efficiency torch | efficiency ours | target |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for world_size, r in results.items():
        ms = r["ms"]
        ratio = ms["ours"] / ms["torch"]
        lines.append(
            f"| {world_size} | {ms['compute']:.0f} | {ms['torch']:.0f} | "
            f"{ms['ours']:.0f} | {ratio:.2f} | {ms['compute'] / ms['torch']:.2f} | "
            f"{ms['compute'] / ms['ours']:.2f} | "
            f"{'met' if ratio <= TARGET else 'NOT met'} |")
    lines += ["", "Spread (min - max ms over all measured steps, n steps):", ""]
    for world_size, r in results.items():
        lines.append(f"- world {world_size}: " + "; ".join(
            f"{v} {lo:.0f}-{hi:.0f} (n={r['n'][v]})"
            for v, (lo, hi) in r["spread"].items()))
    lines += [
        "",
        "## Where our step goes",
        "",
        "One extra run of ours per world size, timers wrapped around its parts "
        "from outside ddp.py; ms per step, mean over ranks. *attach*: the "
        "forward's re-pointing (and zeroing) of `.grad` views into the bucket "
        "buffers; *hooks*: all gradient hooks, launches included; *launch*: the "
        "`all_reduce(async_op=True)` calls themselves; *finish*: the end-of-"
        "backward callback, of which *wait* is waiting for the all-reduces and "
        "the rest is launching leftover buckets and dividing by the world size.",
        "",
        "| world size | buckets | forward | of which attach | backward | hooks "
        "| launch | finish | of which wait | finish minus wait |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for world_size, r in results.items():
        p = {k: (v * 1000 if k != "n_buckets" else v) for k, v in r["parts"].items()}
        lines.append(
            f"| {world_size} | {p['n_buckets']:.0f} | {p['forward']:.1f} | "
            f"{p['attach']:.1f} | {p['backward']:.1f} | {p['hooks']:.1f} | "
            f"{p['launch']:.1f} | {p['finish']:.1f} | {p['wait']:.1f} | "
            f"{p['finish'] - p['wait']:.1f} |")
    lines += ["", f"Benchmark wall time: {took_s:.0f} s.", ""]
    return "\n".join(lines)


def main() -> None:
    started = time.perf_counter()
    results = {}
    for world_size in WORLD_SIZES:
        results[world_size] = measure(world_size)
        print(f"world {world_size}: {results[world_size]['ms']}", file=sys.stderr)
    text = report(results, time.perf_counter() - started)
    publish("ddp_vs_torch.md", text)


if __name__ == "__main__":
    main()
