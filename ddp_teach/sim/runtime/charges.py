"""What one ATen operation costs on a simulated device, in seconds.

Two ways to charge it:

- at datasheet peak (`Simulation(compute="peak")`): the roofline of
  `hardware.Device.op_seconds`, FLOPs from torch's own
  `torch.utils.flop_counter` registry (matrix products, convolutions,
  attention), bytes from the operation's tensors;
- as achieved (`compute="achieved"`): by kind of kernel, with the fractions
  of `ddp_teach.sim.model.efficiency`: matrix products by their shape (tiles and
  waves), convolutions, and everything else at the memory bandwidth real
  kernels reach.

Views and allocations (FREE_OPS) launch no kernel and are free.
`ChargeEveryOp(recorder)` applies these charges to a running program: a
dispatch mode that sees every ATen operation below autograd, so backward's
operations are charged as forward's are.
"""
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from ddp_teach.sim.model import efficiency

aten = torch.ops.aten
FREE_OPS = {aten.empty, aten.empty_strided, aten.empty_like, aten.detach,
            aten.lift_fresh, aten.alias, aten._unsafe_view, aten.set_}
MATMULS = {aten.mm: 0, aten.addmm: 1, aten.bmm: 0, aten.baddbmm: 1}  # -> first factor
CONVOLUTIONS = {aten.convolution, aten._convolution, aten.convolution_backward}


def op_seconds(device, func, args, kwargs, out) -> float:
    """One ATen operation's roofline time on `device` at datasheet peak."""
    flops, nbytes, dtype = _work(func, args, kwargs, out)
    return device.op_seconds(flops, nbytes, math_type(device, func, dtype))


def math_type(device, func, dtype: str) -> str:
    """What an operation computes in: "tf32" for an fp32 convolution or
    matrix product that torch lets run on the tensor cores (by default
    convolutions may, products may not: `tf32_allowed`) on a GPU with TF32
    units, else its dtype."""
    if dtype != "float32" or "tf32" not in device.flops:
        return dtype
    packet = func.overloadpacket
    kind = "conv" if packet in CONVOLUTIONS else "matmul" if packet in MATMULS else None
    return "tf32" if kind and tf32_allowed(kind) else dtype


def tf32_allowed(kind: str) -> bool:
    """Whether torch's settings let fp32 `kind` ("conv" or "matmul") use
    TF32. From torch 2.9 each backend has an `fp32_precision` ("tf32",
    "ieee", or "none": ask the one above it); the older switches
    (`cudnn.allow_tf32`, `set_float32_matmul_precision`) set them too, but
    reading those after a program used the new ones is an error, so the new
    ones are read, and the old ones only on a torch without them."""
    backends = torch.backends
    chain = ((getattr(backends.cudnn, "conv", None), backends.cudnn, backends)
             if kind == "conv" else (getattr(backends.cuda, "matmul", None), backends))
    values = [getattr(backend, "fp32_precision", None) for backend in chain]
    if all(value is None for value in values):  # a torch before the new settings
        return (backends.cudnn.allow_tf32 if kind == "conv"
                else torch.get_float32_matmul_precision() != "highest")
    return next((value for value in values if value not in (None, "none")),
                "ieee") == "tf32"


def achieved_seconds(device, achieved, func, args, kwargs, out) -> float:
    """One ATen operation's time on `device` as real kernels run it."""
    flops, nbytes, dtype = _work(func, args, kwargs, out)
    dtype = math_type(device, func, dtype)
    packet = func.overloadpacket
    if packet in MATMULS:
        a, b = args[MATMULS[packet]], args[MATMULS[packet] + 1]
        batch = a.shape[0] if a.dim() == 3 else 1
        return efficiency.matmul_seconds(device, achieved, a.shape[-2], b.shape[-1],
                                         a.shape[-1], batch, dtype, nbytes)
    kind = "conv" if packet in CONVOLUTIONS else "memory"
    return efficiency.rate_seconds(device, achieved, kind, flops, nbytes, dtype)


def kernel_seconds(simulation, func, args, kwargs, out) -> float:
    """The charge of `simulation`'s mode: achieved or datasheet peak."""
    achieved = simulation.achieved
    if achieved is None:
        return op_seconds(simulation.device, func, args, kwargs, out)
    return achieved_seconds(simulation.device, achieved, func, args, kwargs, out)


def attention_seconds(simulation, q, k, v, causal: bool, backward: bool) -> float:
    """Fused attention of q (B, H, Lq, d) against k, v (B, Hkv, Lk, d) on
    `simulation`'s device, by its attention kernel: its FLOPs as
    FlashAttention-2 counts them, its bytes those of q, k, v and the output
    (and their gradients in backward), at the mode's rates."""
    *lead, queries, head_dim = q.shape
    batch_heads = 1
    for size in lead:
        batch_heads *= size
    flops = efficiency.attention_flops(batch_heads, 1, queries, k.shape[-2],
                                       head_dim, causal, backward)
    tensors = (q, k, v, q) * (2 if backward else 1)  # q's shape: the output
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    dtype = str(q.dtype).removeprefix("torch.")
    achieved = simulation.achieved
    if achieved is None:
        return simulation.device.op_seconds(flops, nbytes, dtype)
    return efficiency.rate_seconds(simulation.device, achieved, "attention",
                                   flops, nbytes, dtype, attention=simulation.attention,
                                   causal=causal)


def _work(func, args, kwargs, out):
    """(FLOPs, bytes, dtype name) of one operation."""
    counter = flop_registry.get(func.overloadpacket)
    flops = counter(*args, **kwargs, out_val=out) if counter else 0
    tensors = list(tensors_in((args, kwargs, out)))
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    floating = [t.dtype for t in tensors if t.is_floating_point()]
    dtype = str(floating[-1]).removeprefix("torch.") if floating else "float32"
    return flops, nbytes, dtype


def tensors_in(value):
    """The tensors in `value`: a tensor, or lists, tuples and dicts of them
    (an operation's arguments and results)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)
    elif isinstance(value, dict):
        yield from tensors_in(list(value.values()))


class ChargeEveryOp(TorchDispatchMode):
    """While active: every ATen operation the program runs moves `recorder`'s
    clock by its simulated time (`kernel_seconds`), unless it is free
    (FREE_OPS, views) or the host's own (an optimizer's step counters)."""

    def __init__(self, recorder):
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        recorder = self.recorder
        if (recorder.charging and func.namespace == "aten"
                and not func.is_view and func.overloadpacket not in FREE_OPS):
            if recorder.in_optimizer and _on_cpu_scalars((args, kwargs, out)):
                recorder.host_op()  # a step counter: the host's, no kernel
                return out
            recorder.kernel(kernel_seconds(recorder.simulation, func, args, kwargs, out))
            if func is torch.ops.aten._local_scalar_dense.default:  # .item()
                recorder.sync_host()
        return out


def _on_cpu_scalars(value) -> bool:
    """True when every tensor in `value` is a 0-dim CPU tensor (and there is one)."""
    tensors = list(tensors_in(value))
    return bool(tensors) and all(t.dim() == 0 and t.device.type == "cpu" for t in tensors)
