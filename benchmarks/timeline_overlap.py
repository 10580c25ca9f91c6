"""Does DDP hide gradient communication behind backward? Measured, and drawn.

The course's central claim (Li et al., VLDB'20) is that DDP overlaps the
all-reduce of gradient buckets with the rest of the backward pass, while a
naive loop that all-reduces after backward cannot. This benchmark traces both
on the course's reference MLP (`ddp_teach.models`: 8 x Linear(1024, 1024) +
ReLU, batch 256) at world size 2, reports each rank's overlap (the HTA metric) and
step time, and draws the two timelines on one axis. It also measures what
tracing costs: the same DDP step traced and untraced, interleaved.

Run from the repo root: `make bench`. Writes benchmarks/timeline_overlap.md
and benchmarks/ddp_vs_naive.png.
"""
import os
import statistics

import torch
import torch.distributed as dist

import ddp_teach as dt
from ddp_teach.models import reference_mlp
from section import publish

HERE = os.path.dirname(os.path.abspath(__file__))
WORLD_SIZE, WIDTH, DEPTH, BATCH = 2, 1024, 8, 256
WARMUP_STEPS, STEPS = 2, 6
OVERHEAD_REPEATS = 5  # the noise on 2 shared cores is about +-10% per run
LOOP_CALLS, LOOP_REPEATS = 2000, 5  # the tight loops of the event-by-event count
TARGET = 0.05  # tracing may add at most 5% to a step


def mlp() -> torch.nn.Module:
    return reference_mlp(WIDTH, DEPTH)


def train(rank, world_size, variant: str) -> list[float]:
    """Seconds per step (forward + backward + gradient sync) on this rank."""
    import time
    model = dt.trace_layers(mlp())  # compute spans per layer, not per call
    if variant == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    torch.manual_seed(rank)
    batch = torch.randn(BATCH, WIDTH)
    step_times = []
    for step in range(WARMUP_STEPS + STEPS):
        started = time.perf_counter()
        model(batch).square().mean().backward()
        if variant == "naive":  # one blocking all-reduce per parameter
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world_size
        step_times.append(time.perf_counter() - started)
        model.zero_grad()
    return step_times[WARMUP_STEPS:]


def seconds_per_event(rank, world_size) -> dict:
    """Seconds each of three things takes on one rank, best of LOOP_REPEATS
    loops of LOOP_CALLS: an empty `dt.span`, an all-reduce of one float, and
    a step of a one-layer DDP model (one gradient bucket). Run traced and
    untraced, the difference is what recording one event of each kind adds."""
    import time
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    x, one = torch.randn(2, 4), torch.ones(1)

    def span():
        with dt.span("x"):
            pass

    def bucket():
        model(x).sum().backward()

    best = {}
    for name, call in (("span", span), ("collective", lambda: dist.all_reduce(one)),
                       ("ddp bucket", bucket)):
        loops = []
        for _ in range(LOOP_REPEATS):
            started = time.perf_counter()
            for _ in range(LOOP_CALLS):
                call()
            loops.append((time.perf_counter() - started) / LOOP_CALLS)
        best[name] = min(loops)
    return best


def events_per_step(result) -> dict:
    """How many spans, collectives and DDP buckets one rank records per step."""
    events = [e for e in result.timeline.events if e.rank == 0]
    buckets = sum(e.name.startswith("ddp bucket") for e in events)
    collectives = sum(e.kind == "comm" for e in events) - buckets
    spans = len(events) - buckets - collectives
    steps = WARMUP_STEPS + STEPS
    return {"span": spans / steps, "collective": collectives / steps,
            "ddp bucket": buckets / steps}


def median_step_ms(result) -> float:
    return 1000 * statistics.median(t for rank_times in result for t in rank_times)


def main() -> None:
    traced = {v: dt.run(train, WORLD_SIZE, args=(v,), trace=True, timeout=300)
              for v in ("naive", "ddp")}
    figure = dt.Timeline.compare(
        traced["naive"].timeline, traced["ddp"].timeline,
        labels=("naive: all-reduce each gradient after backward",
                "torch DDP: bucket all-reduces during backward"))
    figure.savefig(os.path.join(HERE, "ddp_vs_naive.png"), dpi=110)

    plain, with_trace = [], []
    for _ in range(OVERHEAD_REPEATS):  # interleaved, so noise hits both alike
        plain.append(median_step_ms(dt.run(train, WORLD_SIZE, args=("ddp",))))
        with_trace.append(median_step_ms(
            dt.run(train, WORLD_SIZE, args=("ddp",), trace=True)))
    overhead = statistics.median(with_trace) / statistics.median(plain) - 1
    untraced = dt.run(seconds_per_event, 1, timeout=300)[0]
    traced_loops = dt.run(seconds_per_event, 1, trace=True, timeout=300)[0]
    added = {kind: traced_loops[kind] - untraced[kind] for kind in untraced}
    counts = events_per_step(traced["ddp"])
    added_ms = 1000 * sum(added[kind] * counts[kind] for kind in counts)
    accounted = added_ms / statistics.median(plain)

    rows = []
    for variant, result in traced.items():
        overlap = result.timeline.overlap()
        buckets = {e.name for e in result.timeline.events if e.kind == "comm"}
        rows.append(f"| {variant} | {median_step_ms(result):.0f} | "
                    f"{overlap[0]:.2f} | {overlap[1]:.2f} | {len(buckets)} |")
    markdown = "\n".join([
        "# Overlap of communication with backward (torch DDP vs naive)",
        "",
        f"MLP {DEPTH} x Linear({WIDTH}, {WIDTH}) + ReLU, batch {BATCH}, world "
        f"size {WORLD_SIZE}, gloo, {STEPS} traced steps after {WARMUP_STEPS} "
        "warm-up steps. Overlap: the HTA metric, the fraction of communication "
        "time during which the rank was computing (each layer's forward and "
        "backward, recorded by `dt.trace_layers`).",
        "",
        "| variant | median step ms | overlap rank 0 | overlap rank 1 "
        "| distinct comm names |",
        "|---|---|---|---|---|",
        *rows,
        "",
        "![naive vs DDP timelines](ddp_vs_naive.png)",
        "",
        "## Tracing overhead",
        "",
        "Event by event (one rank, best of "
        f"{LOOP_REPEATS} loops of {LOOP_CALLS:,} calls, traced minus untraced): "
        + ", ".join(f"{kind} {1e6 * added[kind]:+.1f} us (x {counts[kind]:.1f} "
                    "a step)" for kind in counts)
        + f". Together {added_ms:.2f} ms of a {statistics.median(plain):.0f} ms "
        f"step: **{accounted:+.2%}** (target: below {TARGET:.0%}; "
        f"{'met' if accounted < TARGET else 'NOT met'}).",
        "",
        f"End to end, torch DDP step untraced vs traced, {OVERHEAD_REPEATS} "
        f"interleaved runs of {STEPS} steps: median "
        f"{statistics.median(plain):.0f} ms vs "
        f"{statistics.median(with_trace):.0f} ms ({100 * overhead:+.1f}%). "
        "Each repetition's traced / untraced ratio, to show that the noise "
        "between runs is larger than what tracing adds: "
        + ", ".join(f"{t / p:.2f}" for t, p in zip(with_trace, plain)) + ".",
        "",
    ])
    publish("timeline_overlap.md", markdown)


if __name__ == "__main__":
    main()
