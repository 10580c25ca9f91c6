"""Collective and point-to-point times on a simulated cluster, as runs measure them.

`ddp_teach.sim.model.nccl` says which algorithm NCCL picks and what NCCL's own
model estimates; its latencies agree with measurements, but real runs move
bytes more slowly than its bandwidth estimates, by an amount that depends
on the algorithm. So a collective is charged

    NCCL's latency + bytes / (NCCL's bandwidth x LINK_FRACTIONS[kind]
                              x channels used / channels)

(a small buffer's ring or tree is launched on fewer channels than NCCL's
estimate counted: `nccl.channels_used`), with `kind` one of four, each
fraction solved from ONE published measurement (a "calibrate" row of
`benchmarks/sim_vs_published.md`):

- "in node" (ring or tree inside one node): all-reduce of 16 GiB on 8x
  H200 with NVLS off, 367.2 GB/s busbw, nccl-tests, NCCL 2.27.7
  (stas00/ml-engineering, network/README.md, "SHARP"); H200 shares H100's
  NVLink 4 fabric;
- "nvls" (NVLink SHARP inside one node): all-reduce of 8 GiB on 8x H100
  SXM, NCCL_ALGO=NVLS, 478.87 GB/s busbw, NCCL 2.18.5 (Azure/AI-
  benchmarking-guide, ND H100 v5 results), with NVLS's chunks below;
- "across nodes" (ring or tree over the network): all-reduce on 4 nodes of
  8x H100 with 8x 400 Gb/s InfiniBand each, 330.93 GB/s busbw, NCCL 2.24.3
  (Voltage Park / Georgia Tech benchmark, as published in
  aigatech/vpbenchmarking); taken at 4 GiB;
- "host memory" (a ring or tree inside a node whose GPUs have no
  peer-to-peer, `Cluster.p2p` False: every byte goes GPU -> host memory ->
  GPU, NCCL's SHM transport): all-reduce of 1 GiB on 2x RTX 2080 Ti on
  PCIe 3.0 x16 with no P2P, 4.00 GB/s busbw, nccl-tests, NCCL of CUDA 12.4
  (Anthony-Hoo/Anthony-Hoo.github.io, posts/AutoDL_Multi-GPU_Interconnection
  _Test.md), simulated on the Kaggle preset, the same class of machine;
- "nvls tree" (NVLS in each node, a tree between them): all-reduce of 512
  MiB on 2 nodes of 8x H20 (NVLink 4, 8x NDR 400 Gb/s per node), 3,219 us,
  NCCL 2.21.5 (NVIDIA/nccl issue 1244).

NVLS moves a buffer in chunks, `NVLS_CHANNELS` channels times one "head"
per GPU of the node at once, and NCCL shrinks the chunk for smaller
buffers: 128 KiB, then 64, 32 and 16 KiB below 64, 8 and 2 times the
concurrent chunks' bytes (`computeColl` in src/enqueue.cc, the same in
releases v2.18.5-1 and v2.27.7-1; one head per GPU: the NVLS graph in
src/graph/search.cc "pulls evenly from all GPUs"). Each chunk pays a fixed
cost beside its bytes, and an all-reduce is two stages (the switch
reduces, then multicasts), so one chunk's time fills the pipeline. So an
NVLS collective takes NCCL's latency + (k + 1) chunk times, for k >= 1
rounds of chunks, and medium buffers, in smaller chunks, reach less of the
bandwidth: at 16 MiB about half of what 8 GiB reaches. The per-chunk cost
`calibrated.NVLS_CHUNK_S` and the "nvls" fraction are solved together from two rows
of the Azure run, 8 GiB (above) and 64 MiB at 361.78 GB/s busbw; the cost
is rounded to two figures and the fraction solved again from the 8 GiB row
with it (the repository's `tools/calibrate.py` re-solves every constant
here from its rows).

Below one round (2 MiB on 8 GPUs) NCCL 2.18 does not spread the buffer
over its channels: channel c takes bytes [c, c + 1) x heads x chunk, so
128 KiB keeps one channel busy and the other fifteen idle, and every size
from 128 KiB to 2 MiB leaves the busiest channel the same 128 KiB (the
NVLS all-reduce kernel, src/collectives/device/all_reduce.h in v2.18.5-1):
the time stays flat over that range, as the Azure run, on NCCL 2.18.5,
shows (42-45 us). (NCCL 2.19 and later divide a buffer among the channels
before the kernel runs, by rules not modelled here; NCCL's own choice at
these sizes is a ring with LL, not NVLS, so only a forced NVLS all-reduce
meets this.) The busiest channel's bytes then set the time, at its 1/16 of
the bandwidth, and a chunk costs `calibrated.NVLS_ONE_CHANNEL_S` with one channel
working, rising linearly to `calibrated.NVLS_CHUNK_S` with all of them (a stated
assumption: the channels share the switch). `calibrated.NVLS_ONE_CHANNEL_S` is solved
from the Azure run's 128 KiB row, where exactly one channel works; none of
the others saw either constant.

Point-to-point (send / recv) has no tuning model in NCCL: we charge it as
one step of a Simple ring over the link between the two ranks (NVLink or
PCIe inside a node, the GPU's share of its node's NICs across nodes), at
the same achieved fractions.
"""
import math

from ddp_teach.sim.model import calibrated, nccl
from ddp_teach.sim.model.cluster import NVLINK

# The calibrated numbers (`calibrated.LINK_FRACTIONS`, `calibrated.NVLS_CHUNK_S`,
# `calibrated.NVLS_ONE_CHANNEL_S`) are read from `calibrated` when a time is computed,
# so that tools/calibrate.py can try other values.
NVLS_CHANNELS = 16        # NCCL_NVLS_NCHANNELS' default (src/transport/nvls.cc)


def kind_of(plan, nodes: int, cluster) -> str:
    """Which achieved fraction applies to a plan on `nodes` nodes of `cluster`."""
    if plan.algorithm == "nvls":
        return "nvls"
    if plan.algorithm == "nvls_tree":
        return "nvls tree"
    if nodes > 1:
        return "across nodes"
    return "in node" if cluster.p2p else "host memory"


def collective_seconds(op: str, nbytes: float, ranks, cluster,
                       algorithm: str | None = None) -> float:
    """Seconds of `op` on `nbytes` (the whole buffer) over the global
    `ranks` (an int n for ranks 0..n-1, or a list) of `cluster`, with NCCL's
    choice of algorithm (or the one forced)."""
    ranks = range(ranks) if isinstance(ranks, int) and not isinstance(ranks, bool) \
        else list(ranks)
    nodes, _ = cluster.nodes_of(ranks)
    plan = nccl.choose(op, nbytes, len(ranks), nodes, cluster, algorithm)
    if len(ranks) == 1:
        return 0.0
    bandwidth = plan.bandwidth * calibrated.LINK_FRACTIONS[kind_of(plan, nodes, cluster)] \
        * nccl.channels_used(plan, nbytes, len(ranks), cluster.channels) / cluster.channels
    if plan.algorithm == "nvls":
        return plan.latency_s + nvls_chunks_seconds(nbytes, bandwidth, len(ranks) // nodes)
    return plan.latency_s + nbytes / bandwidth


def nvls_chunk_bytes(nbytes: float, concurrent: int) -> int:
    """The chunk NCCL's NVLS moves `nbytes` in, with `concurrent` chunks
    in flight (channels x heads): src/enqueue.cc's schedule."""
    chunk = 131072
    for times, smaller in ((64, 65536), (8, 32768), (2, 16384)):
        if nbytes < times * concurrent * chunk:
            chunk = smaller
    return chunk


def nvls_chunks_seconds(nbytes: float, bandwidth: float, gpus_per_node: int) -> float:
    """Seconds an NVLS collective moves `nbytes` in at `bandwidth` (bytes of
    the buffer per second, all channels together), round by round of chunks
    (see the module's doc); NCCL's latency comes on top."""
    concurrent = NVLS_CHANNELS * gpus_per_node
    per_channel = gpus_per_node * nvls_chunk_bytes(nbytes, concurrent)  # per round
    channel_bandwidth = bandwidth / NVLS_CHANNELS
    rounds = nbytes / (per_channel * NVLS_CHANNELS)
    if rounds >= 1:
        return (rounds + 1) * (per_channel / channel_bandwidth + calibrated.NVLS_CHUNK_S)
    working = math.ceil(nbytes / per_channel)  # the first channels, the others idle
    one, every = calibrated.NVLS_ONE_CHANNEL_S, calibrated.NVLS_CHUNK_S
    chunk_s = one + (every - one) \
        * (working - 1) / (NVLS_CHANNELS - 1)
    return 2 * (min(nbytes, per_channel) / channel_bandwidth + chunk_s)


def p2p_seconds(nbytes: float, source: int, target: int, cluster) -> float:
    """Seconds of a send from global rank `source` to `target` (see the
    module's doc)."""
    for name, rank in (("source", source), ("target", target)):
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ValueError(f"{name} must be a global rank, an int >= 0; got {rank!r}")
    if not nbytes >= 0:
        raise ValueError(f"nbytes must be >= 0; got {nbytes!r}")
    nodes, _ = cluster.nodes_of([source, target])
    if source == target:
        return 0.0
    ring_simple = nccl.PROTOCOLS.index("Simple")
    if nodes == 1:
        hop = nccl.HOP_LATENCY_US["NVLink" if cluster.fabric == NVLINK else "PCIe"]
        bandwidth = cluster.fabric_bandwidth * calibrated.LINK_FRACTIONS[
            "in node" if cluster.p2p else "host memory"]
    else:
        hop = nccl.HOP_LATENCY_US["net"]
        share = cluster.network_bandwidth / cluster.gpus_per_node
        bandwidth = min(share, cluster.fabric_bandwidth) * calibrated.LINK_FRACTIONS["across nodes"]
    latency_us = nccl.BASE_LATENCY_US["ring"][ring_simple] + hop["ring"][ring_simple]
    return latency_us * 1e-6 + nbytes / bandwidth
