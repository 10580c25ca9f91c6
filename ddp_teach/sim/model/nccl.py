"""Which algorithm NCCL runs a collective with, and what its model says it costs.

NCCL does not run one algorithm for every call. For each collective it
estimates, for every algorithm and protocol it has, a time = latency +
bytes / bandwidth, and runs the fastest (`ncclTopoTuneModel` and
`ncclTopoGetAlgoTime` in NVIDIA/nccl, src/graph/tuning.cc; this module
follows release v2.27.7-1, the version behind several of the published
measurements in `benchmarks/sim_vs_published.md`). This module is our own
Python rendering of that model, with its constants:

- algorithms: "ring" (every rank passes chunks to the next: 2(p-1) steps
  for an all-reduce), "tree" (a chain inside each node, a binary tree
  between nodes: latency that grows with log2 of the nodes), "nvls" (the
  NVSwitch reduces and multicasts, NVLink SHARP, inside one node) and
  "nvls_tree" (NVLS inside each node, a tree between nodes);
- protocols: "LL" (8-byte stores with a flag: lowest latency, half the
  bandwidth or less), "LL128" (128-byte lines, 120 of them data: NVLink
  only), "Simple" (plain copies with fences: full bandwidth, highest
  latency).

The model's latency is a base per algorithm and protocol plus a per-hop
latency per link type (NVLink, PCIe, network) times the hops; its bandwidth
is the channels x per-channel bandwidth of the topology NCCL found, capped
per protocol and generation and turned into "algorithm bandwidth" (bytes
of the buffer per second). Where NCCL measures the topology, we take a
`ddp_teach.sim.model.cluster.Cluster`'s figures: per-channel bandwidth = the
fabric's (or the NICs', if lower) over the channels. A time here is NCCL's
*estimate*, which is what its choice rests on; how close real runs come to
it is `ddp_teach.sim.model.comm`'s business.
"""
import math
from dataclasses import dataclass

from ddp_teach.sim.model.cluster import NVLINK

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
ALGORITHMS = ("ring", "tree", "nvls", "nvls_tree")
PROTOCOLS = ("LL", "LL128", "Simple")

# tuning.cc, v2.27.7-1: baseLat (us), per algorithm, for LL / LL128 / Simple
BASE_LATENCY_US = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4),
                   "nvls": (0.0, 0.0, 0.0), "nvls_tree": (0.0, 0.0, 0.0)}
# hwLat (us per hop): by link type, then algorithm, for LL / LL128 / Simple
HOP_LATENCY_US = {
    "NVLink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4),
               "nvls": (0.0, 0.0, 25.0), "nvls_tree": (0.0, 0.0, 25.0)},
    "PCIe": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7),
             "nvls": (0.0, 0.0, 0.0), "nvls_tree": (0.0, 0.0, 0.0)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0),
            "nvls": (0.0, 0.0, 18.0), "nvls_tree": (0.0, 0.0, 14.0)},
}
# llMaxBws (GB/s): rows by GPU generation on one node, (1 node, 2 nodes, more)
LL_MAX_GBPS = {"volta": (39.0, 39.0, 20.4), "ampere": (87.7, 22.5, 19.0),
               "hopper": (141.0, 45.0, 35.0), "blackwell": (282.0, 90.0, 70.0)}
# across nodes the row is the CPU's: Intel hosts use the first row's values
LL_MAX_GBPS_INTEL_HOSTS = LL_MAX_GBPS["volta"]
# per-channel caps (GB/s), (1 node, 2 nodes, more): ring LL128, tree LL128, tree
RING_LL128_CAP = {"volta": (20.0,) * 3, "ampere": (20.0,) * 3,
                  "hopper": (36.7,) * 3, "blackwell": (73.4,) * 3}
TREE_LL128_CAP = {"volta": (20.0,) * 3, "ampere": (20.0,) * 3,
                  "hopper": (36.7, 36.7, 29.0), "blackwell": (73.4, 73.4, 58.0)}
TREE_CAP = {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8),
            "hopper": (38.7, 41.4, 36.0), "blackwell": (77.4, 82.8, 72.0)}
NET_OVERHEAD_US = 1.0  # getNetOverhead on Intel x86 hosts (x3 for Simple)
# treeCorrectionFactor: trees fall short of the model at medium sizes; rows
# LL / LL128 / Simple, columns log2(bytes / 64) from 0 to 23
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7,
     .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8,
     .9, .9, .9, .9, 1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8,
     .7, .7, .8, .9, .9, .9),
)
RING_PLATEAU = 1.4  # multi-node ring Simple all-reduce latency, compute cap >= 80


@dataclass(frozen=True)
class Plan:
    """One algorithm and protocol with NCCL's estimate of it: latency in
    seconds, bandwidth in bytes of the buffer per second."""
    algorithm: str
    protocol: str
    latency_s: float
    bandwidth: float

    def seconds(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bandwidth


def plans(op: str, nbytes: float, ranks: int, nodes: int, cluster) -> list[Plan]:
    """Every algorithm and protocol NCCL would consider for `op` on `nbytes`
    (the whole buffer: all-gather's output, reduce-scatter's input) over
    `ranks` ranks on `nodes` nodes of `cluster`, with its estimate."""
    _check(op, ranks, nodes, nbytes)
    found = []
    for algorithm in ALGORITHMS:
        for protocol in PROTOCOLS:
            plan = _estimate(op, algorithm, protocol, nbytes, ranks, nodes, cluster)
            if plan is not None:
                found.append(plan)
    return found


def choose(op: str, nbytes: float, ranks: int, nodes: int, cluster,
           algorithm: str | None = None) -> Plan:
    """The plan NCCL runs: the fastest estimate, or the fastest protocol of
    `algorithm` when one is forced (as NCCL_ALGO does)."""
    if algorithm is not None and algorithm not in ALGORITHMS:
        raise ValueError(f"unknown NCCL algorithm {algorithm!r}; valid: "
                         f"{', '.join(ALGORITHMS)} (or None: NCCL's choice)")
    if ranks == 1:
        _check(op, ranks, nodes, nbytes)
        return Plan("ring", "Simple", 0.0, math.inf)
    options = [p for p in plans(op, nbytes, ranks, nodes, cluster)
               if algorithm is None or p.algorithm == algorithm]
    if not options:
        raise ValueError(f"NCCL has no {algorithm!r} {op} on {ranks} ranks over "
                         f"{nodes} node(s) of {cluster.name!r}; available: "
                         f"{sorted({p.algorithm for p in plans(op, nbytes, ranks, nodes, cluster)})}")
    return min(options, key=lambda plan: plan.seconds(nbytes))


# enqueue.cc's topoGetAlgoInfo (v2.27.7-1) launches a ring or tree on fewer
# channels than its estimate assumed while nbytes < channels x threads x
# threshold: comm.h's NCCL_{LL,LL128,SIMPLE}_THREAD_THRESHOLD (8, 8, 64
# bytes a thread; a ring's LL threshold is x nRanks, tuning.cc) and the
# threads a channel runs (NCCL_{LL,LL128,SIMPLE}_MAX_NTHREADS: 512, 640, 512)
THREAD_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}
MAX_THREADS = {"LL": 512, "LL128": 640, "Simple": 512}


def channels_used(plan: Plan, nbytes: float, ranks: int, channels: int) -> int:
    """How many of its `channels` NCCL runs `plan` on for `nbytes`: fewer
    for small buffers (ring and tree only; NVLS keeps all of its own). The
    time estimate that chose the plan counts all of them, so the launch is
    slower than NCCL's own estimate by channels / channels_used."""
    if plan.algorithm not in ("ring", "tree"):
        return channels
    threshold = THREAD_THRESHOLD[plan.protocol] * (
        ranks if plan.algorithm == "ring" and plan.protocol == "LL" else 1)
    return max(1, min(channels, int(nbytes // (MAX_THREADS[plan.protocol] * threshold))))


def _check(op, ranks, nodes, nbytes):
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r}; valid: {', '.join(OPS)}")
    for name, value in (("ranks", ranks), ("nodes", nodes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1; got {value!r}")
    if nodes > ranks:
        raise ValueError(f"{nodes} nodes cannot hold only {ranks} ranks")
    if not (nbytes >= 0 and math.isfinite(nbytes)):
        raise ValueError(f"nbytes must be a finite number >= 0; got {nbytes!r}")


def _available(op, algorithm, protocol, ranks, nodes, cluster) -> bool:
    nvlink = cluster.fabric == NVLINK
    if algorithm in ("nvls", "nvls_tree"):
        # NVLink SHARP: Simple only, needs > 2 GPUs in the node; NVLS proper
        # spans one node (across nodes it needs CollNet), NVLS tree several
        if protocol != "Simple" or not cluster.nvls or cluster.gpus_per_node <= 2:
            return False
        if algorithm == "nvls":
            return nodes == 1 and op in ("all_reduce", "all_gather", "reduce_scatter")
        return nodes > 1 and op == "all_reduce"
    if protocol == "LL128" and not nvlink:  # LL128 only up to NVLink paths
        return False
    if op in ("broadcast", "reduce", "all_gather", "reduce_scatter"):
        return algorithm == "ring"
    return True


def _estimate(op, algorithm, protocol, nbytes, ranks, nodes, cluster):
    if not _available(op, algorithm, protocol, ranks, nodes, cluster):
        return None
    p = PROTOCOLS.index(protocol)
    generation = cluster.generation
    column = min(nodes, 3) - 1  # NCCL's index: 1 node, 2 nodes, more
    per_node = ranks / nodes
    channels = cluster.channels
    intra = cluster.fabric_bandwidth / 1e9 / channels  # GB/s per channel
    net = cluster.network_bandwidth / 1e9 / channels if nodes > 1 else intra
    bw_intra = bw_inter = min(intra, net) if nodes > 1 else intra
    if algorithm == "nvls_tree":
        bw_intra, bw_inter = intra, net
    steps = (2 * (ranks - 1) if op == "all_reduce" else ranks - 1
             if op in ("all_gather", "reduce_scatter") else ranks)

    # bandwidth: tuning.cc's busBw, then its conversion to algorithm bandwidth
    bw = bw_intra if nodes <= 2 else bw_inter
    if algorithm == "nvls":
        bw = (min(bw_intra, bw_inter) if op == "all_reduce" else
              min(bw_intra * (per_node - 1) / per_node, bw_inter * 0.9))
    if algorithm == "nvls_tree":
        bw = min(bw_intra, bw_inter if nodes <= 2 else bw_inter / 2)
    bus = channels * bw
    ll_max = (LL_MAX_GBPS[generation] if nodes == 1 else LL_MAX_GBPS_INTEL_HOSTS)[column]
    if algorithm == "ring" and protocol == "LL":
        bus = min(ll_max, bus * 0.5)
    if algorithm == "ring" and protocol == "LL128":
        bus = min(bus * 0.92, channels * RING_LL128_CAP[generation][column])
    if algorithm == "tree":
        bus = min(bus * 0.92, channels * TREE_CAP[generation][column])
        if protocol == "LL":
            bus = min(bus / 3.8, ll_max)
        if protocol == "LL128":
            bus = min(bus * (7 / 9 if nodes == 1 else 120 / 128),
                      channels * TREE_LL128_CAP[generation][column])
    if algorithm == "ring" or op == "all_reduce":
        bus *= (ranks / steps if algorithm == "ring" else
                5 / 6 if algorithm in ("nvls", "nvls_tree") else 0.5)

    # latency: base + hops x per-hop latency of the links crossed
    intra_hw = cluster.fabric if cluster.fabric == NVLINK else "PCIe"
    intra_lat = HOP_LATENCY_US[intra_hw][algorithm][p]
    inter_lat = HOP_LATENCY_US["net"]["tree" if per_node == 1 else algorithm][p]
    latency = BASE_LATENCY_US[algorithm][p]
    if algorithm == "ring":
        if op in ("broadcast", "reduce"):
            hw = intra_hw if nodes == 1 else "net"
            hop = HOP_LATENCY_US[hw]["tree" if protocol == "Simple" else "ring"][p]
            latency += steps * hop
        else:
            if nodes > 1:
                intra_lat = max(intra_lat, NET_OVERHEAD_US * (3 if protocol == "Simple" else 1))
            inter_steps = 0 if nodes == 1 else (2 * (nodes - 1) if op == "all_reduce"
                                                 else nodes - 1)
            latency += (steps - inter_steps) * intra_lat + inter_steps * inter_lat
            if protocol == "Simple" and nodes > 1 and op == "all_reduce" and \
                    nbytes / (channels * ranks) >= 64:
                latency *= RING_PLATEAU
    elif algorithm == "tree":
        latency += 2 * ((per_node - 1) * intra_lat + _log2i(nodes) * inter_lat)
    elif algorithm == "nvls":
        latency = intra_lat
    else:  # nvls_tree
        latency += intra_lat + 2 * _log2i(nodes) * inter_lat

    if algorithm == "tree" and op == "all_reduce":
        size_class = _log2i(int(nbytes) >> 6) if nbytes >= 64 else -1
        if 0 <= size_class < 23:
            bus *= TREE_CORRECTION[p][size_class]
    return Plan(algorithm, protocol, latency * 1e-6, bus * 1e9)


def _log2i(n: int) -> int:
    """floor(log2 n) for n >= 1, as NCCL's log2i."""
    return max(int(n), 1).bit_length() - 1
