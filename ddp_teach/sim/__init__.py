"""Simulated GPUs: time that behaves like a GPU's, on a laptop's CPU.

On a CPU, gloo's communication and the computation share the same cores, so
the lessons about time (communication hidden behind backward, the bucket-size
trade-off) do not show. With `dt.run(fn, n, simulate=Simulation(...))` the
learner's real program runs on real worker processes and real data moves
over gloo, so every result stays real; but each rank keeps a VIRTUAL clock:

- every tensor operation is charged its roofline time on the simulated
  device (`hardware.Device.op_seconds`), on the rank's compute stream;
- every collective is charged its alpha-beta time (`ddp_teach.cost`) on the
  rank's communication channel: it starts when every rank has issued it and
  the channel is free (calls queue in issue order), and `wait()` moves the
  compute stream to its end.

The same program gives the same virtual times on any machine, under any
load. `predict` gives the textbook cases from the same numbers, and
`one_rank` runs one rank of thousands in this process, on the meta device.
`SimulatedGPUs` gives ONE process several simulated devices, for
DataParallel (`ddp_teach.dp`), whose threads share Python's GIL.
"""
from dataclasses import dataclass

from ddp_teach.cost import Link
from ddp_teach.sim import predict
from ddp_teach.sim.gpus import SimulatedGPUs
from ddp_teach.sim.one_rank import one_rank
from ddp_teach.sim.hardware import DEVICES, LINKS, Device, device, link


@dataclass(frozen=True)
class Simulation:
    """What `dt.run(..., simulate=)` simulates: a device per rank and the
    link between them, by preset name or as a `Device` / `cost.Link`."""
    device: Device
    link: Link

    def __init__(self, device_spec="A100 80GB", link_spec="NVLink 4"):
        object.__setattr__(self, "device", device(device_spec))
        object.__setattr__(self, "link", link(link_spec))

    @property
    def link_name(self) -> str:
        return next((name for name, preset in LINKS.items() if preset == self.link),
                    f"a link of {self.link.alpha * 1e6:g} us, "
                    f"{self.link.bandwidth / 1e9:g} GB/s")

    @property
    def label(self) -> str:
        """What a plot of this run's time says, e.g. "simulated A100 80GB +
        NVLink 4"."""
        return f"simulated {self.device.name} + {self.link_name}"


__all__ = ["Simulation", "Device", "DEVICES", "LINKS", "device", "link", "predict",
           "one_rank", "SimulatedGPUs"]
