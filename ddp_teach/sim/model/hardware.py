"""The simulated hardware: accelerators and the links between them.

A `Device` turns one tensor operation into seconds with a roofline (Williams,
Waterman & Patterson, "Roofline", CACM 2009): an operation takes as long as
its arithmetic at the device's peak rate or its memory traffic at the
device's memory bandwidth, whichever is longer, plus a fixed cost to launch
a kernel. A link is the alpha-beta `ddp_teach.cost.Link` (seconds per
message, seconds per byte) that the collectives are charged on.

Peak rates and bandwidths are the vendors' datasheet figures (dense, no
sparsity): NVIDIA H100 Tensor Core GPU datasheet (SXM5: 989 TFLOP/s bf16/fp16
tensor, 495 TFLOP/s TF32 tensor, 67 TFLOP/s fp32, 3.35 TB/s HBM3, 80 GB,
NVLink 900 GB/s in both directions together); NVIDIA A100 Tensor Core GPU
datasheet (80GB SXM: 312 TFLOP/s bf16/fp16 tensor, 156 TF32 tensor, 19.5
TFLOP/s fp32, 2,039 GB/s HBM2e); NVIDIA Ada Lovelace architecture
whitepaper (GeForce RTX 4090: 165 TFLOP/s fp16/bf16 tensor with fp32
accumulate, 82.6 TF32 tensor, 82.6 TFLOP/s fp32, 1,008 GB/s GDDR6X, 24 GB);
NVIDIA V100 Tensor Core GPU datasheet (SXM2 32GB: 125 TFLOP/s fp16 tensor,
15.7 TFLOP/s fp32, 900 GB/s; no bf16); NVIDIA T4 datasheet (65 TFLOP/s fp16
tensor, 8.1 TFLOP/s fp32, 320 GB/s GDDR6, 16 GB; no bf16).
"tf32" is not a dtype but the tensor cores' way with fp32 inputs (TF32:
fp32's range, 10 bits of mantissa), on Ampere and later GPUs: torch uses it
for fp32 convolutions by default, and for fp32 matrix products only when a
program asks (`torch.set_float32_matmul_precision("high")`);
`ddp_teach.sim.runtime.charges.math_type` follows those settings. Link
bandwidths are per direction: NVLink 4 450 GB/s, PCIe 4.0 x16 31.5 GB/s
(PCI-SIG), InfiniBand NDR 400 Gb/s = 50 GB/s, Ethernet 100 and 10 Gb/s.

The launch cost (5 us) and the links' per-message latencies are not
datasheet numbers: they are the orders of magnitude that measurements report
(a CUDA kernel launch costs a few microseconds; NCCL's small-message
latency is microseconds inside a node, tens of them across Ethernet). They
are parameters: build a `Device` or a `Link` of your own to change them.

Each preset also carries `achieved`: what real kernels reach on it
(`ddp_teach.sim.model.efficiency`, with the fractions of
`ddp_teach.sim.model.calibrated`), which a `Simulation(compute="achieved")`
charges instead of the datasheet roofline.
"""
import math
from dataclasses import dataclass, field

from ddp_teach.cost import Link
from ddp_teach.sim.model.calibrated import KERNEL_FRACTIONS
from ddp_teach.sim.model.efficiency import Achieved

TFLOPS, GBPS = 1e12, 1e9


@dataclass(frozen=True)
class Device:
    """An accelerator: peak FLOP/s per dtype, memory bandwidth, launch cost;
    and what real kernels reach on it (None: not known)."""
    name: str
    flops: dict = field(hash=False)   # dtype name -> peak FLOP/s
    memory_bandwidth: float           # bytes per second
    memory_bytes: float
    launch_s: float = 5e-6
    achieved: Achieved | None = None

    def __post_init__(self):
        if "float32" not in self.flops:
            raise ValueError(f"Device {self.name!r} needs a float32 peak rate")
        for value in (*self.flops.values(), self.memory_bandwidth,
                      self.memory_bytes):
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"Device {self.name!r}: rates and sizes must "
                                 f"be finite and > 0; got {value!r}")
        if not (self.launch_s >= 0 and math.isfinite(self.launch_s)):
            raise ValueError(f"launch_s must be >= 0 seconds; got {self.launch_s!r}")
        if self.achieved is not None and not isinstance(self.achieved, Achieved):
            raise TypeError("achieved must be a ddp_teach.sim.model.efficiency.Achieved "
                            f"or None; got {type(self.achieved).__name__}")

    def op_seconds(self, flops: float, nbytes: float, dtype: str = "float32") -> float:
        """The roofline time of one kernel: launch, then arithmetic or memory
        traffic, whichever takes longer. Unknown dtypes run at fp32's rate."""
        peak = self.flops.get(dtype, self.flops["float32"])
        return self.launch_s + max(flops / peak, nbytes / self.memory_bandwidth)


# an H100 SXM's and an H200's peaks (the same GH100 chip at the same clocks)
HOPPER_FLOPS = {"float32": 66.9 * TFLOPS, "tf32": 494.7 * TFLOPS,
                "bfloat16": 989.4 * TFLOPS, "float16": 989.4 * TFLOPS}

DEVICES = {
    "H100 SXM": Device("H100 SXM", dict(HOPPER_FLOPS), memory_bandwidth=3350 * GBPS,
                       memory_bytes=80e9, achieved=Achieved(**KERNEL_FRACTIONS["H100 SXM"])),
    # the H100's compute (the same GH100 chip, 132 SMs, at the same clocks)
    # with HBM3e: 4.8 TB/s and 141 GB (NVIDIA H200 Tensor Core GPU datasheet)
    "H200 SXM": Device("H200 SXM", dict(HOPPER_FLOPS), memory_bandwidth=4800 * GBPS,
                       memory_bytes=141e9, achieved=Achieved(**KERNEL_FRACTIONS["H200 SXM"])),
    # HGX B200 datasheet, dense (NVIDIA prints its tensor figures with 2:4
    # sparsity: half of them): 2,250 TFLOP/s bf16/fp16, 1,100 TF32, 75 fp32;
    # 7.7 TB/s HBM3e; 180 GB a GPU (the DGX B200 user guide: 1,440 GB in 8)
    "B200": Device("B200", {"float32": 75 * TFLOPS, "tf32": 1100 * TFLOPS,
                            "bfloat16": 2250 * TFLOPS, "float16": 2250 * TFLOPS},
                   memory_bandwidth=7700 * GBPS, memory_bytes=180e9,
                   achieved=Achieved(**KERNEL_FRACTIONS["B200"])),
    "A100 80GB": Device("A100 80GB", {"float32": 19.5 * TFLOPS, "tf32": 156 * TFLOPS,
                                       "bfloat16": 312 * TFLOPS,
                                       "float16": 312 * TFLOPS},
                        memory_bandwidth=2039 * GBPS, memory_bytes=80e9,
                        achieved=Achieved(**KERNEL_FRACTIONS["A100 80GB"])),
    "RTX 4090": Device("RTX 4090", {"float32": 82.6 * TFLOPS, "tf32": 82.6 * TFLOPS,
                                     "bfloat16": 165.2 * TFLOPS,
                                     "float16": 165.2 * TFLOPS},
                       memory_bandwidth=1008 * GBPS, memory_bytes=24e9,
                       achieved=Achieved(**KERNEL_FRACTIONS["RTX 4090"])),
    "V100 SXM2": Device("V100 SXM2", {"float32": 15.7 * TFLOPS,
                                       "float16": 125 * TFLOPS},
                        memory_bandwidth=900 * GBPS, memory_bytes=32e9,
                        achieved=Achieved(**KERNEL_FRACTIONS["V100 SXM2"])),
    "T4": Device("T4", {"float32": 8.1 * TFLOPS, "float16": 65 * TFLOPS},
                 memory_bandwidth=320 * GBPS, memory_bytes=16e9,
                 achieved=Achieved(**KERNEL_FRACTIONS["T4"])),
}

LINKS = {
    "NVLink 4": Link.from_latency_bandwidth(3e-6, 450 * GBPS),
    "PCIe 4 x16": Link.from_latency_bandwidth(10e-6, 31.5 * GBPS),
    "InfiniBand NDR": Link.from_latency_bandwidth(8e-6, 50 * GBPS),
    "100GbE": Link.from_latency_bandwidth(20e-6, 12.5 * GBPS),
    "10GbE": Link.from_latency_bandwidth(50e-6, 1.25 * GBPS),
}


def device(spec) -> Device:
    """A Device, or the preset of that name (case and spaces ignored)."""
    return preset_named(spec, DEVICES, Device, "device")


def link(spec) -> Link:
    """A Link, or the preset of that name (case and spaces ignored)."""
    return preset_named(spec, LINKS, Link, "link")


def preset_named(spec, presets: dict, kind: type, what: str):
    """`spec` itself if it is a `kind`, else the preset of that name in
    `presets`, case and spaces ignored (devices, links, clusters alike)."""
    if isinstance(spec, kind):
        return spec
    key = {name.lower().replace(" ", ""): name for name in presets}.get(
        str(spec).lower().replace(" ", ""))
    if key is None:
        raise ValueError(f"unknown {what} {spec!r}: use one of "
                         f"{', '.join(map(repr, presets))} or a "
                         f"{kind.__module__}.{kind.__name__} of your own")
    return presets[key]
