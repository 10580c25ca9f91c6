"""Our ring all-reduce (`ddp_teach.collectives.ring_allreduce`, Python over
gloo's point-to-point messages) against gloo's own `dist.all_reduce`.

Why: the course asks learners to build the ring from `isend` / `irecv` and to
compare it with the library. That comparison only teaches something if the
reference ring is not hopelessly slow, so the project sets a target: on 4
ranks, at messages of 4 MB and more, the ring reaches at least half of gloo's
all_reduce bandwidth.

Each rank times both on the same float32 tensor, a barrier before every
timed call; the two are interleaved (alternating which goes first) so that
noise on a shared machine hits both alike. A repetition's time is the slowest
rank's; the table has the median over repetitions, and algbw / busbw as
nccl-tests defines them (`ddp_teach.cost`). Writes benchmarks/ring_vs_gloo.md
and prints the same.

Run from the repo root: `.venv/bin/python benchmarks/ring_vs_gloo.py`
(about 15 s on 2 cores).
"""
import datetime
import os
import platform
import statistics
import time

import torch
import torch.distributed as dist

import ddp_teach as dt
from ddp_teach import cost
from ddp_teach.collectives import ring_allreduce
from section import publish

WORLD_SIZE = 4
SIZES_BYTES = (1 << 20, 4 << 20, 16 << 20)  # 1, 4 and 16 MiB of float32
WARMUP = 2
REPETITIONS = 25
TARGET_FROM_BYTES = 4 << 20
TARGET_RATIO = 0.5  # ring bandwidth / gloo bandwidth
IMPLEMENTATIONS = {"ring": ring_allreduce, "gloo": dist.all_reduce}


def timed_calls(rank, world_size, sizes, repetitions, warmup):
    """In each worker: seconds of every timed call, {name: [[per repetition]
    per size]}, after checking once that the two agree."""
    check = torch.randn(1000, generator=torch.Generator().manual_seed(rank))
    ours, theirs = ring_allreduce(check.clone()), check.clone()
    dist.all_reduce(theirs)
    assert torch.allclose(ours, theirs, atol=1e-5), "ring differs from gloo"
    seconds = {name: [] for name in IMPLEMENTATIONS}
    for nbytes in sizes:
        tensor = torch.zeros(nbytes // 4)  # zeros: repeated sums stay finite
        for _ in range(warmup):
            for call in IMPLEMENTATIONS.values():
                call(tensor)
        samples = {name: [] for name in IMPLEMENTATIONS}
        for repetition in range(repetitions):
            order = list(IMPLEMENTATIONS)[::1 if repetition % 2 == 0 else -1]
            for name in order:
                dist.barrier()
                start = time.perf_counter()
                IMPLEMENTATIONS[name](tensor)
                samples[name].append(time.perf_counter() - start)
        for name in IMPLEMENTATIONS:
            seconds[name].append(samples[name])
    return {"seconds": seconds, "threads": torch.get_num_threads()}


def slowest_rank_medians(per_rank: list[dict]) -> dict:
    """{name: [median over repetitions of the slowest rank, per size]}."""
    medians = {}
    for name in IMPLEMENTATIONS:
        medians[name] = [
            statistics.median(max(samples) for samples in zip(
                *(rank["seconds"][name][size] for rank in per_rank)))
            for size in range(len(SIZES_BYTES))]
    return medians


def verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def report(medians: dict, threads: int) -> str:
    """The results as markdown: facts, method, table, targets."""
    rows, target_lines = [], []
    gb = cost.GB
    for i, nbytes in enumerate(SIZES_BYTES):
        ring_s, gloo_s = medians["ring"][i], medians["gloo"][i]
        ratio = cost.algbw(nbytes, ring_s) / cost.algbw(nbytes, gloo_s)
        rows.append(
            f"| {nbytes >> 20} MiB | {ring_s * 1e3:.2f} | {gloo_s * 1e3:.2f} | "
            f"{cost.algbw(nbytes, ring_s) / gb:.3f} | "
            f"{cost.busbw('all_reduce', nbytes, ring_s, WORLD_SIZE) / gb:.3f} | "
            f"{cost.algbw(nbytes, gloo_s) / gb:.3f} | "
            f"{cost.busbw('all_reduce', nbytes, gloo_s, WORLD_SIZE) / gb:.3f} | "
            f"{ratio:.2f} |")
        if nbytes >= TARGET_FROM_BYTES:
            target_lines.append(
                f"- ring / gloo bandwidth >= {TARGET_RATIO} at {nbytes >> 20} MiB "
                f"on {WORLD_SIZE} ranks: {ratio:.2f} -> "
                f"**{verdict(ratio >= TARGET_RATIO)}**")
    fit_lines = []
    for name in IMPLEMENTATIONS:
        link = cost.fit_alpha_beta(SIZES_BYTES, medians[name], p=WORLD_SIZE)
        fit_lines.append(f"- {name}: alpha = {link.alpha * 1e3:.2f} ms per "
                         f"message, 1/beta = {link.bandwidth / gb:.2f} GB/s")
    return "\n".join([
        "# Ring all-reduce (ours) vs gloo",
        "",
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"- machine: {len(os.sched_getaffinity(0))} usable CPU cores "
        f"({os.cpu_count()} online), {platform.platform()}",
        f"- python {platform.python_version()}, torch {torch.__version__}, "
        f"{WORLD_SIZE} ranks (gloo, loopback), {threads} intra-op thread(s) "
        f"per rank",
        f"- repetitions: {REPETITIONS} per size and implementation, after "
        f"{WARMUP} warm-up calls of each",
        "",
        "## Method",
        "",
        "Ours: `ddp_teach.collectives.ring_allreduce`, the chunked ring of "
        "Patarasuk & Yuan (2009) in Python: a reduce-scatter and an "
        "all-gather of p-1 steps each, every step an `isend` to the right "
        "neighbour and an `irecv` from the left, then an in-place `add_`. "
        "Gloo: `dist.all_reduce`, gloo's C++ all-reduce. Both sum the same "
        "float32 tensor in place on every rank. Before each timed call all "
        "ranks meet at a barrier; `time.perf_counter()` around the call; a "
        "repetition counts the slowest rank; medians over repetitions. The "
        "two are interleaved, alternating which goes first. algbw = bytes / "
        "time and busbw = algbw x 2(p-1)/p, as nccl-tests defines them "
        "(`ddp_teach.cost.algbw`, `busbw`); busbw is what each rank's link "
        "carried per second.",
        "",
        "| size | ring ms | gloo ms | ring algbw GB/s | ring busbw GB/s "
        "| gloo algbw GB/s | gloo busbw GB/s | ring/gloo bandwidth |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "GB/s are 10^9 bytes per second; MiB are 2^20 bytes.",
        "",
        "## Targets (from the project)",
        "",
        *target_lines,
        "",
        "## Where the time goes",
        "",
        "The ring model t = 2(p-1) alpha + 2(p-1)/p n beta fitted to each "
        "column of times (`ddp_teach.cost.fit_alpha_beta`; three sizes, so "
        "rough; for gloo an effective alpha per ring step):",
        "",
        *fit_lines,
        "",
        "Each ring step waits for the neighbour's message, so the ring pays "
        "2(p-1) = 6 message latencies one after another; with more ranks "
        "than cores each of them includes the time until the scheduler runs "
        "the neighbour. Gloo's ring (gloo/allreduce.cc) runs in C++ and "
        "splits each chunk into at least two segments, posting the next "
        "transfer before reducing the last one, which hides part of that. "
        "Where the two fitted bandwidths are close, the gap is latency, and "
        "it shrinks as messages grow.",
        "",
    ])


def main() -> None:
    per_rank = dt.run(timed_calls, WORLD_SIZE, timeout=300,
                      args=(SIZES_BYTES, REPETITIONS, WARMUP))
    markdown = report(slowest_rank_medians(per_rank), per_rank[0]["threads"])
    publish("ring_vs_gloo.md", markdown)


if __name__ == "__main__":
    main()
