"""What a simulated run simulates: the device of every rank and how ranks talk.

Two models of the wires, from the simple to the real:

- `Simulation(device, link)`: one alpha-beta `ddp_teach.cost.Link` between
  every pair of ranks, each collective charged its textbook algorithm's
  time (ring by default); devices at datasheet peak. The model a lecture
  draws, and notebook 01's.
- `Simulation(device, cluster=...)`: rank r on node r // gpus_per_node of a
  `Cluster`; each collective charged as NCCL runs it (its choice of
  algorithm and protocol, hierarchical when the ranks span nodes:
  `ddp_teach.sim.model.comm`), and devices as real kernels run them, with a host
  that issues each eager operation (`ddp_teach.sim.model.efficiency`).

`compute` picks the devices' model either way: "peak" (datasheet
roofline, no host time) or "achieved"; by default "peak" with a link and
"achieved" with a cluster. `attention` picks the fused-attention kernel
achieved compute charges `scaled_dot_product_attention` as: "flash"
(FlashAttention-2, what torch up to 2.10 runs) or "cudnn" (what torch 2.11
and later run on Hopper GPUs); None, torch's own choice on the device
(`ddp_teach.sim.model.efficiency`). A run that reproduces a published one names
the kernel that run used.
"""
from dataclasses import dataclass

from ddp_teach import cost
from ddp_teach.sim.model import comm
from ddp_teach.sim.model.cluster import Cluster, cluster as cluster_preset
from ddp_teach.sim.model.efficiency import Achieved, attention_kernel
from ddp_teach.sim.model.hardware import LINKS, Device, device, link

COMPUTE_MODES = ("peak", "achieved")


@dataclass(frozen=True)
class Simulation:
    """A device per rank, and a link or a cluster between them (see the
    module's doc); each by preset name or as an object of its own."""
    device: Device
    link: cost.Link | None
    cluster: Cluster | None = None
    compute: str = "peak"
    attention: str = "flash"

    def __init__(self, device_spec="A100 80GB", link_spec=None, *, cluster=None,
                 compute=None, attention=None):
        if cluster is not None and link_spec is not None:
            raise ValueError("give a link (one wire for every pair of ranks) or "
                             "a cluster (nodes, NVLink, NICs), not both")
        chosen_device = device(device_spec)
        chosen_cluster = None if cluster is None else cluster_preset(cluster)
        mode = compute or ("peak" if chosen_cluster is None else "achieved")
        if mode not in COMPUTE_MODES:
            raise ValueError(f"compute must be one of {COMPUTE_MODES}; got {compute!r}")
        if mode == "achieved" and chosen_device.achieved is None:
            raise ValueError(
                f"no achieved figures for device {chosen_device.name!r}: give it "
                "Device(..., achieved=dt.sim.Achieved(...)) or use compute='peak'")
        object.__setattr__(self, "device", chosen_device)
        object.__setattr__(self, "link", None if chosen_cluster else
                           link("NVLink 4" if link_spec is None else link_spec))
        object.__setattr__(self, "cluster", chosen_cluster)
        object.__setattr__(self, "compute", mode)
        object.__setattr__(self, "attention",
                           attention_kernel(chosen_device.achieved, attention))

    @property
    def achieved(self) -> Achieved | None:
        """The device's achieved figures when they are charged, else None."""
        return self.device.achieved if self.compute == "achieved" else None

    def collective_seconds(self, op: str, nbytes: float, ranks,
                           algorithm: str | None = None) -> float:
        """Seconds of collective `op` on `nbytes` over `ranks` (an int n for
        ranks 0..n-1, or a list of global ranks). `algorithm`: the link's
        textbook algorithm (`ddp_teach.cost`), or NCCL's on a cluster
        ("ring", "tree", "nvls", "nvls_tree"); None: the default / NCCL's
        choice."""
        if self.cluster is not None:
            return comm.collective_seconds(op, nbytes, ranks, self.cluster, algorithm)
        count = ranks if isinstance(ranks, int) else len(list(ranks))
        return cost.collective_time(op, nbytes, count, self.link, algorithm)

    def p2p_seconds(self, nbytes: float, source: int, target: int) -> float:
        """Seconds of one message of `nbytes` from rank `source` to `target`."""
        if self.cluster is not None:
            return comm.p2p_seconds(nbytes, source, target, self.cluster)
        return cost.collective_time("send_recv", nbytes, 2, self.link)

    @property
    def link_name(self) -> str:
        if self.cluster is not None:
            return f"{self.cluster.name} nodes"
        return next((name for name, preset in LINKS.items() if preset == self.link),
                    f"a link of {self.link.alpha * 1e6:g} us, "
                    f"{self.link.bandwidth / 1e9:g} GB/s")

    @property
    def label(self) -> str:
        """What a plot of this run's time says, e.g. "simulated A100 80GB +
        NVLink 4" or "simulated H100 SXM (achieved) in DGX H100 nodes"."""
        if self.cluster is None and self.compute == "peak":
            return f"simulated {self.device.name} + {self.link_name}"
        joined = "in" if self.cluster is not None else "+"
        return f"simulated {self.device.name} ({self.compute}) {joined} {self.link_name}"
