"""The simulator run as published benchmarks run, in their units.

Each function here gives the figure a benchmark program reports, for the
configuration it ran, as the simulator predicts it: nccl-tests' busbw or
time of one collective on a cluster preset (`ddp_teach.sim.model.comm`), the
TFLOP/s of a matrix product or of fused attention, and STREAM's TB/s, at
the achieved rates a short benchmark reaches (`ddp_teach.sim.model.efficiency`,
burst=True: no sustained-load discount). `ddp_teach.sim.evidence.published` sets
them beside the published figures.
"""
from ddp_teach import cost
from ddp_teach.sim.model import efficiency
from ddp_teach.sim.schedules import predict
from ddp_teach.sim.model.hardware import DEVICES
from ddp_teach.sim.model.simulation import Simulation


def busbw(cluster, op, nbytes, ranks, algorithm=None):
    """nccl-tests' busbw in GB/s of one simulated collective."""
    seconds = predict.collective(op, nbytes, ranks, Simulation(
        "H100 SXM", cluster=cluster, compute="peak"), algorithm)
    return cost.busbw(op, nbytes, seconds, ranks) / 1e9


def micros(cluster, op, nbytes, ranks, algorithm=None):
    """Microseconds of one simulated collective."""
    return predict.collective(op, nbytes, ranks, Simulation(
        "H100 SXM", cluster=cluster, compute="peak"), algorithm) * 1e6


def matmul_tflops(device, m, n, k, dtype="bfloat16"):
    """TFLOP/s of one m x k by k x n product, as a benchmark runs it: dtype
    a 16-bit type, "float32", or "tf32" (fp32 inputs on the tensor cores)."""
    d = DEVICES[device]
    element_bytes = {"float32": 4, "tf32": 4, "float64": 8}.get(dtype, 2)
    seconds = efficiency.matmul_seconds(d, d.achieved, m, n, k, 1, dtype,
                                        element_bytes * (m * k + k * n + m * n),
                                        burst=True)
    return 2 * m * n * k / seconds / 1e12


def stream_tbps(device, arrays, elements=2 ** 28, element_bytes=8):
    """TB/s of a STREAM kernel touching `arrays` arrays of fp64 (copy 2, triad 3)."""
    d = DEVICES[device]
    nbytes = arrays * elements * element_bytes
    return nbytes / efficiency.rate_seconds(d, d.achieved, "memory", 0, nbytes,
                                            burst=True) / 1e12


def host_us_per_op(device):
    """Microseconds of host time the simulator charges to issue one eager op."""
    return DEVICES[device].achieved.host_s_per_op * 1e6


def attention_tflops(device, batch, heads, length, head_dim, forward_only=False,
                     kernel="flash", dtype="bfloat16", causal=False):
    """TFLOP/s of fused attention (forward, or forward and backward), 16-bit,
    run by `kernel` ("flash": FlashAttention-2; "cudnn": cuDNN's), FLOPs as
    FlashAttention-2's benchmark counts them (halved with a causal mask)."""
    d = DEVICES[device]
    flops = efficiency.attention_flops(batch, heads, length, length, head_dim, causal)
    nbytes = 4 * batch * heads * length * head_dim * 2
    passes = [(flops, nbytes)] + ([] if forward_only else [(2.5 * flops, 2 * nbytes)])
    seconds = sum(efficiency.rate_seconds(d, d.achieved, "attention", f, b, dtype,
                                          burst=True, attention=kernel, causal=causal)
                  for f, b in passes)
    return sum(f for f, _ in passes) / seconds / 1e12
