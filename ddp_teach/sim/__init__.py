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

That is `Simulation(device, link)`, a lecture's model. `Simulation(device,
cluster=...)` is a real cluster's (`simulation`): nodes joined by NICs,
collectives as NCCL runs them (`cluster`, `nccl`, `comm`), kernels as fast
as real ones, not as the datasheet (`efficiency`, with the fractions of
`calibrated`), and a host that issues each operation.

The same program gives the same virtual times on any machine, under any
load. `predict` gives the textbook cases from the same numbers, and
`one_rank` runs one rank of thousands in this process, on the meta device.
`SimulatedGPUs` gives ONE process several simulated devices, for
DataParallel (`ddp_teach.dp`), whose threads share Python's GIL.

How far to trust it: `published` sets the simulator beside published
measurements of real GPUs (each row a `measurement.Measurement`, held to
`measurement.LOW`-`HIGH`), with the kernel benchmarks' figures from
`benchmark_figures`; `gpu_surveys` holds its rows for the GPUs learners
have (T4, RTX 4090) and for fp32 products.
"""
from ddp_teach.sim import (benchmark_figures, gpu_surveys, measurement, nccl, predict,
                           published)
from ddp_teach.sim.cluster import CLUSTERS, Cluster, cluster
from ddp_teach.sim.efficiency import Achieved
from ddp_teach.sim.gpus import SimulatedGPUs
from ddp_teach.sim.hardware import DEVICES, LINKS, Device, device, link
from ddp_teach.sim.one_rank import one_rank
from ddp_teach.sim.simulation import Simulation

__all__ = ["Simulation", "Device", "DEVICES", "LINKS", "device", "link", "predict",
           "one_rank", "SimulatedGPUs", "Cluster", "CLUSTERS", "cluster", "Achieved",
           "nccl", "published", "measurement", "benchmark_figures", "gpu_surveys"]
