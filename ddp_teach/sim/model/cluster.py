"""Simulated clusters: GPUs in nodes, a fabric inside each node, NICs between.

`ddp_teach.cost.Link` gives every pair of ranks the same wire. A real
cluster has two: inside a node the GPUs talk over NVLink (through NVSwitch)
or PCIe, and nodes talk through their network cards, several per node.
NCCL, the library that runs collectives on NVIDIA GPUs, spreads its rings
and trees over all of a node's NICs, so what a node can send is the sum of
them, and a collective whose ranks share a node never touches the network.
`Cluster` describes that; `ddp_teach.sim.model.nccl` turns it into collective
times. Rank r sits on node r // gpus_per_node.

Bandwidths are the numbers NCCL's own topology code gives the links
(NVIDIA/nccl v2.27.7-1, src/graph/topo.h and topo.cc), since they are what
its tuning model, and so its choice of algorithm, works from:

- NVLink: links per GPU x the per-link rate NCCL assumes for the GPU
  generation (SM80_NVLINK_BW = 20.0 GB/s for A100, SM90_NVLINK_BW = 20.6
  GB/s for H100 and H200, SM100_NVLINK_BW = 40.1 GB/s for B200, from
  NCCL 2.27). An H100 SXM has 18 NVLink 4 links, an A100 SXM 12 NVLink
  3 links (NVIDIA H100 and A100 datasheets): 370.8 and 240 GB/s per
  direction, below the datasheets' 450 and 300 GB/s, as NCCL measures them.
- PCIe: lanes x rate / 80 GB/s (topo.cc), 12 GB/s for Gen3 x16, 24 GB/s for
  Gen4 x16.
- NICs at line rate: InfiniBand NDR 400 Gb/s = 50 GB/s, HDR 200 Gb/s =
  25 GB/s.

Presets (datasheets): NVIDIA DGX H100 (8x H100 SXM, NVLink 4 through four
third-generation NVSwitches, which do in-switch reductions, "NVLink SHARP";
8x ConnectX-7 InfiniBand NDR 400 Gb/s for the compute fabric); NVIDIA
DGX H200 (the same node with 8x H200 SXM: the same NVLink 4, NVSwitches
and NICs, so the same numbers under another name); NVIDIA DGX B200 (8x
B200, NVLink 5 through two NVSwitch trays, 18 links a GPU at NCCL's
SM100_NVLINK_BW = 40.1 GB/s, 721.8 GB/s per direction; 8x ConnectX-7
400 Gb/s; NCCL's channel count on it is not known here, taken as the DGX
H100's 16: extrapolation); NVIDIA
DGX A100 (8x A100 SXM 80GB, NVLink 3 through six NVSwitches; 8x ConnectX-6
HDR 200 Gb/s); a workstation of 4x RTX 4090 on PCIe 4.0 x16 with
peer-to-peer on (no NVLink; a patched driver: NVIDIA's own turns it off on
GeForce cards); the same cards as most desktops run them, 2x RTX 4090 with
no peer-to-peer; and Kaggle's 2x T4 (PCIe 3.0, one machine, no network
between machines), taken to have no peer-to-peer, as most cloud VMs give
(an assumption: check with `torch.cuda.can_device_access_peer(0, 1)`).
Without peer-to-peer NCCL still rates the path through the CPU at the PCIe
link's figure (the lesser of the two legs, src/graph/paths.cc), so its
choice of algorithm is unchanged; real runs are far slower, which the
"host memory" fraction of `ddp_teach.sim.model.comm` charges.
"""
import math
from dataclasses import dataclass

from ddp_teach.sim.model.hardware import preset_named

GBPS = 1e9
NVLINK, PCIE = "NVLink", "PCIe"
GENERATIONS = ("volta", "ampere", "hopper", "blackwell")  # NCCL's tables' rows


@dataclass(frozen=True)
class Cluster:
    """Nodes of `gpus_per_node` GPUs.

    fabric: how the GPUs of a node are joined, "NVLink" or "PCIe";
    fabric_bandwidth: bytes/s per GPU and direction over it, as NCCL rates it;
    nics_per_node, nic_bandwidth: the network cards of a node and each one's
    line rate in bytes/s (0 NICs: a single machine);
    nvls: the switch reduces in place (NVLink SHARP, NCCL's NVLS algorithm);
    generation: the GPU generation NCCL's tuning tables use ("volta" also
    covers Turing, "ampere" also Ada);
    channels: how many rings (or trees) NCCL runs at once inside a node;
    p2p: the GPUs of a node read and write each other's memory over the
    fabric (peer-to-peer). False: NCCL stages every transfer through host
    memory (its SHM transport), as on GeForce cards, whose driver turns
    peer access off, in many VMs and containers, or under
    NCCL_P2P_DISABLE=1; `torch.cuda.can_device_access_peer(0, 1)` tells."""
    name: str
    gpus_per_node: int
    fabric: str
    fabric_bandwidth: float
    nics_per_node: int
    nic_bandwidth: float
    nvls: bool = False
    generation: str = "hopper"
    channels: int = 16
    p2p: bool = True

    def __post_init__(self):
        for field in ("gpus_per_node", "channels"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Cluster {self.name!r}: {field} must be an int "
                                 f">= 1; got {value!r}")
        if isinstance(self.nics_per_node, bool) or \
                not isinstance(self.nics_per_node, int) or self.nics_per_node < 0:
            raise ValueError(f"Cluster {self.name!r}: nics_per_node must be an "
                             f"int >= 0; got {self.nics_per_node!r}")
        if self.fabric not in (NVLINK, PCIE):
            raise ValueError(f"Cluster {self.name!r}: fabric must be {NVLINK!r} "
                             f"or {PCIE!r}; got {self.fabric!r}")
        if self.generation not in GENERATIONS:
            raise ValueError(f"Cluster {self.name!r}: generation must be one of "
                             f"{', '.join(GENERATIONS)}; got {self.generation!r}")
        if not (self.fabric_bandwidth > 0 and math.isfinite(self.fabric_bandwidth)):
            raise ValueError(f"Cluster {self.name!r}: fabric_bandwidth must be "
                             f"finite and > 0 bytes/s; got {self.fabric_bandwidth!r}")
        if self.nics_per_node and not (self.nic_bandwidth > 0
                                       and math.isfinite(self.nic_bandwidth)):
            raise ValueError(f"Cluster {self.name!r}: nic_bandwidth must be "
                             f"finite and > 0 bytes/s; got {self.nic_bandwidth!r}")
        if not self.p2p and self.fabric != PCIE:
            raise ValueError(f"Cluster {self.name!r}: without peer-to-peer (p2p="
                             "False) the GPUs talk through host memory over PCIe: "
                             f"give fabric={PCIE!r}")
        if self.nvls and self.fabric != NVLINK:
            raise ValueError(f"Cluster {self.name!r}: NVLink SHARP (nvls) needs "
                             "an NVLink fabric")

    def node_of(self, rank: int) -> int:
        """The node rank `rank` runs on."""
        return rank // self.gpus_per_node

    def nodes_of(self, ranks) -> tuple[int, int]:
        """(nodes, most ranks on one node) of a group of global ranks."""
        ranks = list(ranks)
        if not ranks:
            raise ValueError("a collective needs at least one rank")
        per_node = {}
        for rank in ranks:
            per_node[self.node_of(rank)] = per_node.get(self.node_of(rank), 0) + 1
        if len(per_node) > 1 and not self.nics_per_node:
            raise ValueError(
                f"cluster {self.name!r} is one machine of {self.gpus_per_node} "
                f"GPUs with no network to another: ranks {sorted(ranks)} span "
                f"{len(per_node)} machines. Use at most {self.gpus_per_node} "
                "ranks, or a cluster with NICs (e.g. 'DGX H100')")
        return len(per_node), max(per_node.values())

    @property
    def network_bandwidth(self) -> float:
        """Bytes/s one node can send to the others, all its NICs together."""
        return self.nics_per_node * self.nic_bandwidth


CLUSTERS = {
    "DGX H100": Cluster("DGX H100", 8, NVLINK, 18 * 20.6 * GBPS, 8, 50 * GBPS,
                        nvls=True, generation="hopper", channels=16),
    "DGX H200": Cluster("DGX H200", 8, NVLINK, 18 * 20.6 * GBPS, 8, 50 * GBPS,
                        nvls=True, generation="hopper", channels=16),
    "DGX B200": Cluster("DGX B200", 8, NVLINK, 18 * 40.1 * GBPS, 8, 50 * GBPS,
                        nvls=True, generation="blackwell", channels=16),
    "DGX A100": Cluster("DGX A100", 8, NVLINK, 12 * 20.0 * GBPS, 8, 25 * GBPS,
                        generation="ampere", channels=12),
    "4x RTX 4090": Cluster("4x RTX 4090", 4, PCIE, 24 * GBPS, 0, 0.0,
                           generation="ampere", channels=2),
    "2x T4 (Kaggle)": Cluster("2x T4 (Kaggle)", 2, PCIE, 12 * GBPS, 0, 0.0,
                              generation="volta", channels=2, p2p=False),
    "2x RTX 4090 (no P2P)": Cluster("2x RTX 4090 (no P2P)", 2, PCIE, 24 * GBPS, 0, 0.0,
                                    generation="ampere", channels=2, p2p=False),
}


def cluster(spec) -> Cluster:
    """A Cluster, or the preset of that name (case and spaces ignored)."""
    return preset_named(spec, CLUSTERS, Cluster, "cluster")
