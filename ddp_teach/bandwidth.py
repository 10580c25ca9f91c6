"""`ddp_teach.bandwidth`: measure what collectives cost on this machine.

The alpha-beta model of `ddp_teach.cost` says what a collective should
cost; `sweep` measures it on real ranks, size by size, in nccl-tests'
units (time, algbw, busbw: its doc/PERFORMANCE.md), and `Sweep.fit` finds
the model's alpha and beta for the machine at hand. All-gather and
reduce-scatter are timed with all_gather_single and reduce_scatter_single,
the names torch 2.13 prefers to all_gather_into_tensor and
reduce_scatter_tensor. Each size is timed as nccl-tests times it: warm-up
calls first, then timed calls each after a barrier, and the slowest rank's
median is the row's time, since a collective ends when its last rank does.
"""
import statistics
import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ddp_teach.cost import (GB, Link, algbw, busbw, busbw_factor, collective_time,
                            fit_alpha_beta)

SWEPT_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


class SweepRow(NamedTuple):
    size_bytes: int
    seconds: float
    algbw: float  # bytes per second
    busbw: float  # bytes per second


@dataclass
class Sweep:
    """A measured sweep: one row per message size (see `sweep`)."""
    op: str
    world_size: int
    backend: str
    rows: list[SweepRow]

    def table(self) -> str:
        lines = [f"{self.op} on {self.world_size} ranks ({self.backend})",
                 f"{'size (B)':>12} {'time (µs)':>12} {'algbw (GB/s)':>13} "
                 f"{'busbw (GB/s)':>13}"]
        lines += [f"{r.size_bytes:>12d} {r.seconds * 1e6:>12.1f} "
                  f"{r.algbw / GB:>13.3f} {r.busbw / GB:>13.3f}" for r in self.rows]
        return "\n".join(lines)

    def fit(self) -> Link:
        return fit_alpha_beta([r.size_bytes for r in self.rows],
                              [r.seconds for r in self.rows],
                              p=self.world_size, op=self.op)

    def plot(self):
        """Time and busbw against size, measured and as the fitted model."""
        from matplotlib.figure import Figure
        link = self.fit()
        sizes = np.array([r.size_bytes for r in self.rows], float)
        smooth = np.geomspace(sizes.min(), sizes.max(), 100)
        model_s = np.array([collective_time(self.op, n, self.world_size, link)
                            for n in smooth])
        factor = busbw_factor(self.op, self.world_size)
        label = (f"model: α = {link.alpha * 1e6:.1f} µs, "
                 f"1/β = {link.bandwidth / GB:.2f} GB/s")
        fig = Figure(figsize=(11, 4.2), layout="constrained")
        time_ax, bw_ax = fig.subplots(1, 2)
        time_ax.loglog(sizes, [r.seconds * 1e6 for r in self.rows], "o",
                       label="measured (median of the slowest rank)")
        time_ax.loglog(smooth, model_s * 1e6, "-", label=label)
        time_ax.set(xlabel="message size (bytes)", ylabel="time (µs)",
                    title="time per call")
        bw_ax.semilogx(sizes, [r.busbw / GB for r in self.rows], "o")
        bw_ax.semilogx(smooth, smooth / model_s * factor / GB, "-")
        top = max(r.busbw / GB for r in self.rows)
        if link.beta > 0:  # 1/β for the ring algorithms
            no_latency = Link(0.0, link.beta)
            limit = busbw(self.op, smooth[-1], collective_time(
                self.op, smooth[-1], self.world_size, no_latency), self.world_size)
            bw_ax.axhline(limit / GB, color="gray", ls=":",
                          label="model's busbw as size → ∞")
            top = max(top, limit / GB)
        bw_ax.set(xlabel="message size (bytes)", ylabel="busbw (GB/s)",
                  title="bus bandwidth", ylim=(0, 1.1 * top))
        for ax in (time_ax, bw_ax):
            ax.grid(True, which="both", alpha=0.3)
        handles = time_ax.get_lines() + bw_ax.get_lines()[2:]
        fig.legend(handles=handles, loc="outside lower center", ncols=3)
        fig.suptitle(f"{self.op} on {self.world_size} ranks ({self.backend})")
        return fig


def sweep(world_size: int = 2, sizes=None, op: str = "all_reduce",
          iters: int = 5, warmup: int = 2, timeout: float = 120) -> Sweep:
    """Time `op` on float32 arrays of each size (bytes, the whole array as in
    nccl-tests; default 4 KB to 4 MB) on `world_size` real ranks.

    Each rank runs `warmup` untimed calls, then `iters` timed ones, each after
    a barrier, and keeps the median; a row's time is the slowest rank's. Sizes
    are rounded to whole float32 elements that split evenly over the ranks.
    """
    from ddp_teach.launcher import run
    if op not in SWEPT_OPS:
        raise ValueError(f"cannot sweep {op!r}; valid: {', '.join(SWEPT_OPS)}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size (number of ranks) must be an int >= 1; "
                         f"got {world_size!r}")
    if sizes is None:
        sizes = [4096 * 4 ** k for k in range(6)]  # 4 KB .. 4 MB
    if not sizes or any(not s > 0 for s in sizes):
        raise ValueError(f"sizes must be a non-empty list of byte counts > 0; "
                         f"got {sizes!r}")
    if iters < 1 or warmup < 0:
        raise ValueError(f"need iters >= 1 and warmup >= 0; got iters={iters}, "
                         f"warmup={warmup}")
    numels = [max(1, round(s / 4 / world_size)) * world_size for s in sizes]
    result = run(_median_seconds, world_size, timeout=timeout,
                 args=(op, numels, iters, warmup))
    rows = []
    for i, numel in enumerate(numels):
        size, seconds = 4 * numel, max(per_rank[i] for per_rank in result)
        rows.append(SweepRow(size, seconds, algbw(size, seconds),
                             busbw(op, size, seconds, world_size)))
    return Sweep(op, world_size, result.backend, rows)


def _median_seconds(rank, world_size, op, numels, iters, warmup):
    """In each worker: the median seconds of one call of `op` per size (a
    progress bar per rank shows the sizes done)."""
    import torch
    import torch.distributed as dist

    from ddp_teach.launcher.progress_bars import progress
    from ddp_teach.system import collective_device
    device = collective_device()
    on_gpu = device.type == "cuda"
    wait_for_device = torch.cuda.synchronize if on_gpu else (lambda: None)
    medians = []
    for numel in numels:
        full = torch.zeros(numel, device=device)  # zeros: sums never overflow
        shard = torch.zeros(numel // world_size, device=device)
        call = {"all_reduce": lambda: dist.all_reduce(full),
                "all_gather": lambda: dist.all_gather_single(full, shard),
                "reduce_scatter": lambda: dist.reduce_scatter_single(shard, full),
                "broadcast": lambda: dist.broadcast(full, src=0)}[op]
        for _ in range(warmup):
            call()
        samples = []
        for _ in range(iters):
            wait_for_device()
            dist.barrier()
            start = time.perf_counter()
            call()
            wait_for_device()
            samples.append(time.perf_counter() - start)
        medians.append(statistics.median(samples))
        progress(len(medians), len(numels), median_us=medians[-1] * 1e6)
    return medians
