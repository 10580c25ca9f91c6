"""Why is my DDP slower than one GPU? Naming the cause from a timeline.

Notebook 11's diagnosis lab provokes the usual causes on simulated GPUs and
reads each one's symptom in `Timeline.summary()`; `diagnose` is the
exercise's reference: the rules a person applies to a DDP run's timeline
and a one-GPU run of the same model, in the order that keeps them apart.

Two causes the simulator has no preset for are emulated, and say so:
- every rank on GPU 0 (no `torch.cuda.set_device(local_rank)`): the ranks
  time-share one device, so `shared_device` gives each rank a device with
  1/N of its arithmetic rate and memory bandwidth (an assumption: real
  time-slicing adds context switches, so it is a best case);
- no peer-to-peer between GPUs (`NCCL_P2P_DISABLE=1`, or consumer GPUs and
  containers where P2P is off): NCCL then stages data through host memory
  (its SHM transport), so every byte crosses PCIe twice; `host_memory_link`
  halves the link's bandwidth and doubles its latency (an assumption, not a
  measurement: real copies through host memory are often slower still).
"""
import statistics

from ddp_teach.cost import Link

CAUSES = ("healthy", "straggler", "same_gpu", "host_bound", "starved_loader",
          "no_overlap", "buckets_too_small", "slow_link")

# The thresholds of `diagnose`: each sits between what a healthy run shows
# and what the cause shows, with room on both sides.
SPREAD = 0.2            # compute differing across ranks, as a share of one GPU's
SHARED = 0.6            # compute per rank, as a share of N x one GPU's
HOST_IDLE = 0.15        # the one-GPU run's own idle share: kernels wait for the host
WAITING = 0.05          # idle on EVERY rank, as a share of one GPU's step
HIDDEN = 0.1            # overlap as a share of communication: below it, none
MANY_ALL_REDUCES = 24   # all-reduces per step: one per parameter tensor
SLOW_BUS = 20e9         # bytes/s of bus bandwidth: below PCIe 4's 31.5 GB/s


def shared_device(device, world_size: int):
    """`device` time-shared by `world_size` ranks: each gets 1/N of its
    peak rates and memory bandwidth (see the module's doc)."""
    from ddp_teach.sim import Device
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1; got {world_size!r}")
    return Device(f"{device.name} shared by {world_size}",
                  {dtype: rate / world_size for dtype, rate in device.flops.items()},
                  device.memory_bandwidth / world_size, device.memory_bytes,
                  device.launch_s, device.achieved)


def host_memory_link(link: Link) -> Link:
    """`link` without peer-to-peer: half the bandwidth, twice the latency
    (see the module's doc)."""
    return Link.from_latency_bandwidth(2 * link.alpha, link.bandwidth / 2)


def every_rank(timeline, world_size: int):
    """`timeline`'s one rank copied onto ranks 0..world_size-1: what
    `dt.sim.one_rank` assumes (every rank runs the same program at the same
    time), as a Timeline with a lane per rank, for `diagnose`."""
    from dataclasses import replace

    from ddp_teach.tracing import Timeline
    if len(timeline.ranks) != 1:
        raise ValueError(f"expected the timeline of one rank; got ranks {timeline.ranks}")
    return Timeline([replace(event, rank=rank) for rank in range(world_size)
                     for event in timeline], timeline.clock, timeline.lane)


def bus_bandwidth(nbytes: float, seconds: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth of one all-reduce: the algorithm's rate
    (bytes / seconds) times 2(n-1)/n, the share of the buffer each rank
    sends in a ring, so that it reads as the link's speed whatever n is
    (NVIDIA/nccl-tests, doc/PERFORMANCE.md)."""
    if seconds <= 0:
        return float("inf")
    return nbytes / seconds * 2 * (world_size - 1) / world_size


def step_report(run, alone) -> dict:
    """How a DDP run's step compares with one GPU's, from their timelines:
    step_s (the slowest rank's span), vs_one (step over one GPU's step),
    speedup (samples per second over one GPU's, with the same batch per
    rank), and exposed_s, idle_s, overlap (means over ranks)."""
    rows, (one,) = list(run.summary().values()), alone.summary().values()
    step = max(row["span_s"] for row in rows)
    comm = sum(row["comm_s"] for row in rows)
    return dict(step_s=step, vs_one=step / one["span_s"],
                speedup=len(rows) * one["span_s"] / step,
                exposed_s=statistics.mean(row["exposed_comm_s"] for row in rows),
                idle_s=statistics.mean(row["idle_s"] for row in rows),
                overlap=sum(row["overlap_s"] for row in rows) / comm if comm else 0.0)


def diagnose(run, alone) -> str:
    """The cause (one of CAUSES) of what slows the DDP run `run` (a
    Timeline of one step on every rank) against `alone` (a Timeline of the
    same model's step on one GPU, with the same batch per GPU).

    Checked in this order, since some causes also show another's symptom
    (a tiny model's one bucket does not overlap either; a straggler makes
    the others idle):
    1. straggler: one rank computes longer than the others;
    2. same_gpu: every rank computes about N times one GPU's time;
    3. host_bound: the one-GPU run itself leaves its GPU idle;
    4. starved_loader: every rank idles (waits for its batch);
    5. no_overlap: communication starts only once backward is done;
    6. buckets_too_small: one all-reduce per parameter tensor;
    7. slow_link: the all-reduces run at a bus bandwidth below PCIe's;
    8. healthy otherwise."""
    rows = run.summary()
    (one,) = alone.summary().values()
    world_size = len(rows)
    compute = [row["compute_s"] for row in rows.values()]
    if max(compute) - min(compute) > SPREAD * one["compute_s"]:
        return "straggler"
    if world_size > 1 and min(compute) > SHARED * world_size * one["compute_s"]:
        return "same_gpu"
    if one["idle_frac"] > HOST_IDLE:
        return "host_bound"
    if min(row["idle_s"] for row in rows.values()) > WAITING * one["span_s"]:
        return "starved_loader"
    first = rows[run.ranks[0]]
    if first["overlap_s"] < HIDDEN * first["comm_s"]:
        return "no_overlap"
    all_reduces = run.filter(kind="comm", rank=run.ranks[0]).events
    if len(all_reduces) > MANY_ALL_REDUCES:
        return "buckets_too_small"
    largest = max(all_reduces, key=lambda e: e.nbytes)
    if bus_bandwidth(largest.nbytes, largest.duration, world_size) < SLOW_BUS:
        return "slow_link"
    return "healthy"
