"""Checker for notebook 11's diagnosis exercise: `diagnose(run, alone)`
names why a DDP run is slower than it should be, from its timeline and a
one-GPU timeline of the same model (reference: ddp_teach/diagnosis.py).

The cases are built here, not run: a step per rank drawn from the schedule
the simulator runs (forward, then backward layer by layer; a gradient
bucket's all-reduce starts once every rank has filled it and the channel
is free, and lasts `ddp_teach.cost.collective_time` on the link; a rank
that is done waits, idle, for the last all-reduce). Building them takes
milliseconds, where simulating 8 causes x 5 cases on real workers would
take minutes. Each case varies the world size (2 to 5 ranks), the depth,
the layer's time and size, the link (PCIe 4 x16 with peer-to-peer or
NVLink 4; PCIe through host memory for slow_link) and the seed. Any rule
that names every case right is accepted; the first wrong one shown is the
smallest (fewest ranks, then fewest layers), with its timelines' summaries,
expected against received, and the hint for the cause it missed.
"""
import random

from ddp_teach import cost
from ddp_teach.diagnosis import CAUSES, host_memory_link
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, TODO_MESSAGE,
                                         WRONG, Exercise, Verdict, register)
from ddp_teach.tracing.events import COMM, COMPUTE, Event
from ddp_teach.tracing.timeline import Timeline

MIB = 2 ** 20
CASES_PER_CAUSE = 5
PCIE = cost.Link.from_latency_bandwidth(10e-6, 31.5e9)     # dt.sim.LINKS' presets
NVLINK = cost.Link.from_latency_bandwidth(3e-6, 450e9)
HOST_BOUND_GAP = 7e-6   # the host's time to issue one kernel (sim.efficiency)

HINTS = {
    "healthy": "nothing is wrong here: communication hides behind backward, "
               "every rank computes as long as one GPU, and nobody idles. "
               "Return 'healthy' when no symptom is present.",
    "straggler": "one rank computes longer than the others (compare compute_s "
                 "across ranks): it never idles, and every other rank waits "
                 "for it before the last all-reduce.",
    "same_gpu": "every rank's compute_s is about N times the one-GPU run's: "
                "N processes share one device (no set_device(local_rank)).",
    "host_bound": "the one-GPU run itself idles (its idle_frac): its kernels "
                  "are so small that the GPU waits for the host to issue the "
                  "next one. Look at `alone`, not only at the DDP run.",
    "starved_loader": "EVERY rank idles, each by a different amount, while "
                      "computing as long as one GPU: each waits for its "
                      "batch. A straggler leaves one rank with no idle time.",
    "no_overlap": "overlap_s is about 0: the all-reduce starts only after "
                  "backward ends (one bucket for everything, or an "
                  "all-reduce after backward), so all of it is exposed.",
    "buckets_too_small": "count the all-reduces on a rank (run.filter("
                         "kind='comm', rank=0)): one per parameter tensor, "
                         "dozens of small ones, each paying the link's latency.",
    "slow_link": "the all-reduces are as few and as large as in a healthy "
                 "run, but slow: their bus bandwidth (nbytes / duration x "
                 "2(n-1)/n) is below PCIe 4's 31.5 GB/s, as without "
                 "peer-to-peer, through host memory.",
}


def _step(ranks: int, layers: int, forward_s: float, layer_bytes: int, link,
          buckets: str = "default", late_s=None, compute_scale=None,
          host_bound: bool = False):
    """One DDP step on `ranks` ranks as the simulator schedules it, as a
    Timeline; ranks=1 gives the one-GPU step (no all-reduce).

    late_s[r]: rank r waits idle this long for its batch, after zero_grad;
    compute_scale[r]: rank r's kernels take this many times longer;
    buckets: "default" (1 MiB first, then 25 MiB, as torch), "per_parameter"
    or "one"; host_bound: each layer's kernels leave the GPU idle while the
    host issues the next (a gap of HOST_BOUND_GAP per kernel)."""
    late_s = late_s or [0.0] * ranks
    scale = compute_scale or [1.0] * ranks
    sizes = []   # gradients in the order backward makes them: (bytes, layer)
    for layer in reversed(range(layers)):
        sizes += [(layer_bytes, layer), (max(4, layer_bytes // 1024), layer)]
    cap = {"default": 25 * MIB, "per_parameter": 0, "one": float("inf")}[buckets]
    groups, current, limit = [], [], 1 * MIB if buckets == "default" else cap
    for size, layer in sizes:
        current.append((size, layer))
        if sum(s for s, _ in current) >= limit:
            groups.append(current)
            current, limit = [], cap
    groups += [current] if current else []
    events, ready = [], []   # ready[r][layer]: when layer's gradient exists on r
    gap = HOST_BOUND_GAP if host_bound else 0.0
    for rank in range(ranks):
        # the step opens with zero_grad on every rank; a late batch leaves
        # the GPU idle after it, until the forward can start
        events.append(Event(rank, "zero_grad", COMPUTE, 0.0, 1e-6))
        t, done = 1e-6 + late_s[rank], {}
        for phase, share, order in (("forward", 1.0, range(layers)),
                                    ("backward", 2.0, reversed(range(layers)))):
            for layer in order:
                kernel = forward_s * share * scale[rank]
                events.append(Event(rank, phase, COMPUTE, t, t + kernel))
                t += kernel + gap
                done[layer] = t
        ready.append((done, t))
    channel, comm_end = 0.0, 0.0
    if ranks > 1:
        for group in groups:
            nbytes = sum(s for s, _ in group)
            last = min(layer for _, layer in group)  # backward's last to fill it
            filled = max(ready[r][1] if buckets == "one" else ready[r][0][last]
                         for r in range(ranks))
            start = max(filled, channel)
            channel = start + cost.collective_time("all_reduce", nbytes, ranks, link)
            events += [Event(r, "all_reduce", COMM, start, channel, nbytes, op="all_reduce")
                       for r in range(ranks)]
        comm_end = channel
    for rank in range(ranks):
        begin = max(ready[rank][1], comm_end)
        events.append(Event(rank, "optimizer", COMPUTE, begin,
                            begin + 0.02 * forward_s * layers))
    return Timeline(events, clock="built by the checker (simulated schedule)")


def _case(cause: str, seed: int) -> dict:
    """One seeded case of `cause`: its parameters and both timelines."""
    rng = random.Random(f"{cause}-{seed}")
    ranks = rng.randint(2, 5)
    layers = rng.randint(16, 32) if cause == "buckets_too_small" else rng.randint(4, 12)
    layer_mib = rng.choice([1, 2, 4, 8, 16]) if cause != "host_bound" else 0.0625
    layer_bytes = int(layer_mib * MIB)
    link = rng.choice([PCIE, NVLINK])
    # backward (2x forward) long enough to hide the all-reduces of a healthy run
    per_byte = 2 * (ranks - 1) / ranks / link.bandwidth
    forward_s = rng.uniform(2.0, 4.0) * layer_bytes * per_byte + 50e-6
    spec = dict(ranks=ranks, layers=layers, forward_s=forward_s,
                layer_bytes=layer_bytes, link=link)
    alone = dict(spec, ranks=1)
    step = 3 * layers * forward_s
    if cause == "straggler":
        slow = rng.randrange(ranks)
        spec["compute_scale"] = [rng.uniform(1.5, 2.0) if r == slow else 1.0
                                 for r in range(ranks)]
    elif cause == "same_gpu":
        spec["compute_scale"] = [float(ranks)] * ranks
    elif cause == "host_bound":
        spec.update(forward_s=rng.uniform(2e-6, 4e-6), host_bound=True)
        alone.update(forward_s=spec["forward_s"], host_bound=True)
    elif cause == "starved_loader":
        spec["late_s"] = [rng.uniform(0.2, 0.6) * step for _ in range(ranks)]
    elif cause == "no_overlap":
        spec["buckets"] = "one"
    elif cause == "buckets_too_small":
        # a layer's backward shorter than its two all-reduces: they queue up
        each = cost.collective_time("all_reduce", 0.25 * MIB, ranks, link)
        spec.update(buckets="per_parameter", layer_bytes=int(0.25 * MIB),
                    forward_s=rng.uniform(0.4, 0.7) * each)
        alone.update(layer_bytes=spec["layer_bytes"], forward_s=spec["forward_s"])
    elif cause == "slow_link":
        spec["link"] = host_memory_link(PCIE)
        spec["forward_s"] = alone["forward_s"] = (
            rng.uniform(1.0, 1.5) * layer_bytes * 2 * (ranks - 1) / ranks
            / PCIE.bandwidth + 50e-6)
    link_name = ("PCIe 4 x16 through host memory (no P2P)" if cause == "slow_link"
                 else "NVLink 4" if spec["link"] is NVLINK else "PCIe 4 x16")
    return dict(cause=cause, seed=seed, ranks=ranks, layers=layers,
                link=link_name, run=_step(**spec), alone=_step(**alone))


def cases() -> list[dict]:
    """Every case, smallest first: fewest ranks, then fewest layers."""
    every = [_case(cause, seed) for cause in CAUSES for seed in range(CASES_PER_CAUSE)]
    return sorted(every, key=lambda c: (c["ranks"], c["layers"], CAUSES.index(c["cause"])))


def _shown(case: dict, got) -> str:
    return (f"{case['ranks']} ranks, an MLP of {case['layers']} layers, "
            f"{case['link']} (seed {case['seed']}): expected "
            f"{case['cause']!r}, got {got!r}.\nThe DDP run:\n"
            f"{case['run'].summary_table()}\nthe one-GPU run:\n"
            f"{case['alone'].summary_table()}\nHint: {HINTS[case['cause']]}")


def check_diagnose(fn) -> Verdict:
    every = cases()
    wrong = []
    for case in every:
        try:
            got = fn(case["run"], case["alone"])
        except NotImplementedError:
            return Verdict(NOT_ATTEMPTED, TODO_MESSAGE)
        if got not in CAUSES:
            return Verdict(WRONG, f"return one of {', '.join(map(repr, CAUSES))}; "
                                  f"got {got!r}.\n" + _shown(case, got))
        if got != case["cause"]:
            wrong.append((case, got))
    if wrong:
        case, got = wrong[0]
        return Verdict(WRONG, f"{len(wrong)} of {len(every)} runs named wrong; "
                              f"the smallest: {_shown(case, got)}")
    return Verdict(CORRECT, f"all {len(every)} runs named right: "
                            f"{CASES_PER_CAUSE} of each of the {len(CAUSES)} "
                            f"causes, on 2 to 5 ranks, NVLink and PCIe.")


register(Exercise(
    "diagnose", "Why is this DDP run slow? Name the cause",
    "diagnose", "ddp_teach.diagnosis:diagnose", check_diagnose,
    ["Compare like with like: compute_s across ranks, then against the "
     "one-GPU run's compute_s; idle_s on every rank; overlap_s against comm_s.",
     "Some causes show another's symptom too (a straggler makes the others "
     "idle; a tiny model's single bucket does not overlap): test the "
     "distinctive symptom first, straggler and shared GPU before idle, idle "
     "before overlap.",
     "The all-reduces themselves are in run.filter(kind='comm', rank=0): "
     "their number (one per parameter tensor?) and their bus bandwidth, "
     "nbytes / duration x 2(n-1)/n, against PCIe 4's 31.5 GB/s."]))
