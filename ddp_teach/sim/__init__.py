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

The modules sit in four subpackages, which import one way (evidence ->
schedules -> runtime -> model, none of them a lesson of the course):
`model` (devices, links, clusters, NCCL's model, efficiency, the
calibrated numbers, Simulation), `runtime` (the recorder, charges,
attention, works, one_rank, SimulatedGPUs), `schedules` (predict and the
pipeline and FSDP2 schedules) and `evidence` (the data and what compares
the simulator with it). The names below are the public ones.

The same program gives the same virtual times on any machine, under any
load. `predict` gives the textbook cases from the same numbers, and
`one_rank` runs one rank of thousands in this process, on the meta device.
`SimulatedGPUs` gives ONE process several simulated devices, for
DataParallel (`ddp_teach.dp`), whose threads share Python's GIL.

How far to trust it: `published` sets the simulator beside published
measurements of real GPUs (each row a `measurement.Measurement`, held to
`measurement.LOW`-`HIGH`), with the kernel benchmarks' figures from
`benchmark_figures`; `gpu_surveys` simulates the surveys of the GPUs
learners have (T4, RTX 4090) and of fp32 products. The measurements
themselves are data files in `evidence/` (TOML, with a manifest), read by
`evidence.loader`; the calibrated constants (`calibrated`, plain numbers)
name the rows they were solved from. These five are the evidence and the
modules that exist to compare with it: `import ddp_teach` does not load
them (the model must not depend on what it is checked against, and a
learner's import should not build every published row); `dt.sim.published` and
the others load on first use, through `__getattr__` below (PEP 562).
"""
from ddp_teach.sim.model import nccl
from ddp_teach.sim.model.cluster import CLUSTERS, Cluster, cluster
from ddp_teach.sim.model.efficiency import Achieved
from ddp_teach.sim.model.hardware import DEVICES, LINKS, Device, device, link
from ddp_teach.sim.model.simulation import Simulation
from ddp_teach.sim.runtime.dataparallel_gpus import SimulatedGPUs
from ddp_teach.sim.runtime.one_rank import one_rank
from ddp_teach.sim.schedules import predict

__all__ = ["Simulation", "Device", "DEVICES", "LINKS", "device", "link", "predict",
           "one_rank", "SimulatedGPUs", "Cluster", "CLUSTERS", "cluster", "Achieved",
           "nccl", "published", "measurement", "benchmark_figures", "gpu_surveys",
           "evidence"]

# Loaded on first use, not at import (see the docstring).
EVIDENCE = ("benchmark_figures", "evidence", "gpu_surveys", "measurement", "published")


def __getattr__(name: str):
    """`dt.sim.published` and the other EVIDENCE modules, imported the first
    time they are asked for; Python then finds them as attributes and does
    not call this again. The imports are written out so that readers (and
    tests/test_package.py's import graph) see them; `from ddp_teach.sim
    import published` here would recurse, since it asks this function first."""
    if name == "benchmark_figures":
        import ddp_teach.sim.evidence.benchmark_figures as module
    elif name == "evidence":
        import ddp_teach.sim.evidence as module
    elif name == "gpu_surveys":
        import ddp_teach.sim.evidence.gpu_surveys as module
    elif name == "measurement":
        import ddp_teach.sim.evidence.measurement as module
    elif name == "published":
        import ddp_teach.sim.evidence.published as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return module


def __dir__() -> list[str]:
    return sorted({*globals(), *EVIDENCE})
