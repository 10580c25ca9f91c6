"""Single-process data parallelism, rebuilt from its four primitives.

`torch.nn.DataParallel` trains on several devices from ONE Python process:
every forward it

1. `scatter`s the mini-batch into one piece per device,
2. `replicate`s the module onto those devices,
3. `parallel_apply`s each replica to its piece, one thread per device,
4. `gather`s the outputs back onto one device.

Backward then runs through the same graph in reverse: gather's backward
splits the output gradient, each replica's backward runs on its device, and
the copies made by `replicate` sum their gradients into the ORIGINAL
parameters' `.grad` -- that sum *is* the data-parallel all-reduce. For a loss
that is a mean over the gathered batch the result equals a one-device
full-batch step.

torch's own primitives (torch/nn/parallel/scatter_gather.py, replicate.py,
parallel_apply.py, data_parallel.py) only accept CUDA devices. The versions
here follow the same ideas in our own small code and also accept "virtual"
CPU devices: `devices=["cpu"] * 3` means three devices, each a thread on the
CPU, labelled "cpu:0", "cpu:1", "cpu:2" in messages. CUDA devices
(`["cuda:0", "cuda:1"]`) work too, and so do the simulated GPUs of
`ddp_teach.sim.SimulatedGPUs`, whose devices bring their own copies
(`receive`) and thread set-up (`threads`, `running`), so that the same code
runs in their virtual time. The cost the course measures is visible in
`DataParallel.forward`: the module is replicated again on every call.

Where the bytes go differs from torch's. `replicate` here copies each
parameter from the first device to one device after another, and autograd
brings each copy's gradient back the same way, so the first device's link
carries the model 2 (n - 1) times per step (tests/sim/test_dataparallel_gpus.py checks
it on simulated GPUs). torch's replicate makes all the copies with one
autograd function, `Broadcast` (torch/nn/parallel/_functions.py), whose
forward is `comm.broadcast_coalesced` and whose backward is
`comm.reduce_add_coalesced` (torch/nn/parallel/comm.py): on GPUs, NCCL's
broadcast and reduce, pipelined along a ring, so device 0's link carries
the model once each way whatever n; without NCCL torch too copies to and
adds from one device after another. Notebook 02, section 11, counts both.
"""
import contextlib
import threading
import traceback

import torch
from torch import nn

__all__ = ["scatter", "replicate", "parallel_apply", "gather",
           "data_parallel_forward", "DataParallel"]


def _device(device) -> torch.device:
    """A torch.device; virtual CPU devices ("cpu", "cpu:1") all mean the CPU."""
    device = torch.device(device)
    return torch.device("cpu") if device.type == "cpu" else device


def _move(tensor: torch.Tensor, device, label: str, grad_label: str,
          copy: bool = False) -> torch.Tensor:
    """`tensor` on `device`, differentiably. `label` names the copy (and
    `grad_label` its gradient's way back) on a simulated GPU's timeline."""
    if hasattr(device, "receive"):
        return device.receive(tensor, label, grad_label)
    return tensor.to(_device(device), copy=copy)


def _threads_for(devices):
    """Around the lifetime of parallel_apply's threads (simulated GPUs
    schedule them; other devices need nothing)."""
    first = devices[0] if devices else None
    return first.threads(devices) if hasattr(first, "threads") else \
        contextlib.nullcontext()


def _inside_thread(device):
    """What a replica's thread enters to run on `device`."""
    if hasattr(device, "running"):
        return device.running()
    device = _device(device)
    return torch.cuda.device(device) if device.type == "cuda" else \
        contextlib.nullcontext()


def _labels(devices) -> list[str]:
    """Names for messages: the i-th plain "cpu" entry is called "cpu:i"."""
    out = []
    for i, d in enumerate(devices):
        if not hasattr(d, "receive"):  # a simulated GPU names itself
            d = torch.device(d)
        out.append(f"cpu:{i}" if getattr(d, "type", None) == "cpu" and d.index is None
                   else str(d))
    return out


def _is_namedtuple(obj) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


def scatter(inputs, devices, dim=0) -> list:
    """Split `inputs` into one piece per device along `dim`.

    Tensors are cut with `tensor.chunk(len(devices), dim)` -- a batch of 10
    on 3 devices gives 4, 4, 2, and a batch of 3 on 4 devices gives only 3
    pieces -- and each piece is moved with `.to(device)` (a no-op on CPU).
    Both operations are differentiable, so the gradient of a piece flows back
    to `inputs`. Tuples (including namedtuples), lists and dicts are split
    element-wise and keep their type (and keys); any other object is passed
    by reference to every piece. As in torch (scatter_gather.py), the result
    has as many pieces as the SHORTEST split, so fewer than len(devices)
    when the batch is small.
    """
    if not devices:
        raise ValueError("scatter needs at least one device")

    def split(obj) -> list:
        if isinstance(obj, torch.Tensor):
            chunks = obj.chunk(len(devices), dim)
            return [_move(c, d, "scatter", "input grads")
                    for c, d in zip(chunks, devices)]
        if isinstance(obj, (tuple, list)) and len(obj) > 0:
            per_item = [split(item) for item in obj]  # item -> pieces
            pieces = list(zip(*per_item))             # piece -> items
            if _is_namedtuple(obj):
                return [type(obj)(*p) for p in pieces]
            return [type(obj)(p) for p in pieces]
        if isinstance(obj, dict) and len(obj) > 0:
            keys = list(obj)
            pieces = zip(*[split(obj[k]) for k in keys])
            return [type(obj)(zip(keys, p)) for p in pieces]
        return [obj] * len(devices)  # non-tensor (or empty container)

    return split(inputs)


def replicate(module: nn.Module, devices) -> list[nn.Module]:
    """One replica of `module` per device, differentiably tied to it.

    Each replica is a shallow per-module copy of the original tree (same
    classes, names, hooks and forward code; made with torch's
    `Module._replicate_for_data_parallel`, as torch/nn/parallel/replicate.py
    does). Its parameters are NOT new leaf Parameters: they are
    `param.to(device, copy=True)` -- a clone on the CPU, a transfer on CUDA,
    the role of torch's Broadcast autograd function -- so a backward pass
    through any replica accumulates into the ORIGINAL parameters' `.grad`.
    The copies are stored as plain tensor attributes, so
    `list(replica.parameters())` is EMPTY (there is nothing to optimise in
    a replica: step the original module). A Parameter used in two places
    (tied weights) or a submodule used twice is copied once per replica,
    memoised by identity, so it stays shared inside the replica.

    Buffers are copied detached, so a replica can change its buffers (e.g.
    BatchNorm running statistics in train mode) without touching the
    original: those updates are thrown away with the replica. (torch's
    DataParallel lets the replica on device_ids[0] share buffers with the
    original, so its running-statistics updates survive; ours do not.)
    """
    return [_copy_module(module, d, {}) for d in devices]


def _copy_module(module: nn.Module, device, memo: dict) -> nn.Module:
    """Copy one module (and, recursively, its children) for `device`."""
    if id(module) in memo:
        return memo[id(module)]
    replica = module._replicate_for_data_parallel()  # _parameters = {}
    memo[id(module)] = replica
    for name, param in module._parameters.items():
        if param is not None and id(param) not in memo:
            memo[id(param)] = _move(param, device, "replicate", "reduce grads",
                                    copy=True)  # differentiable
        # a plain attribute, not a Parameter: forward reads it as self.<name>
        object.__setattr__(replica, name, None if param is None else memo[id(param)])
    buffers = {}
    for name, buf in module._buffers.items():
        if buf is not None and id(buf) not in memo:
            memo[id(buf)] = _move(buf.detach(), device, "replicate", "",
                                  copy=True)
        buffers[name] = None if buf is None else memo[id(buf)]
    replica._buffers = buffers
    replica._modules = {name: None if child is None else _copy_module(child, device, memo)
                        for name, child in module._modules.items()}
    return replica


def parallel_apply(replicas, inputs, devices) -> list:
    """Run `replicas[i]` on `inputs[i]` in one thread per replica.

    `inputs[i]` is unpacked as positional arguments if it is a tuple, else
    passed as the single argument. Outputs come back in replica order. No
    thread starts its replica until all threads exist, so all really run
    side by side (and have distinct `threading.get_ident()`s).
    Autograd's grad mode is thread-local, so the caller's
    `torch.is_grad_enabled()` is set again inside each thread; on CUDA the
    thread also selects its device (and a simulated GPU charges the
    thread's operations to its own clock). If a replica raises, the caller gets a
    RuntimeError naming the replica index and device with the original
    traceback text, chained from the original exception
    (cf. torch/nn/parallel/parallel_apply.py and its ExceptionWrapper).
    """
    if not len(replicas) == len(inputs) == len(devices):
        raise ValueError(f"need one input and one device per replica, got {len(replicas)} "
                         f"replicas, {len(inputs)} inputs, {len(devices)} devices")
    labels = _labels(devices)
    grad_enabled = torch.is_grad_enabled()
    results: list = [None] * len(replicas)
    errors: list = [None] * len(replicas)

    go = threading.Event()  # all threads are alive before any runs its replica

    def work(i, replica, args, device):
        go.wait()
        try:
            with torch.set_grad_enabled(grad_enabled), _inside_thread(device):
                results[i] = replica(*args) if isinstance(args, tuple) else replica(args)
        except BaseException as exc:  # reported to the caller below
            errors[i] = (exc, traceback.format_exc())

    threads = [threading.Thread(target=work, args=(i, r, x, d), name=f"replica-{i}")
               for i, (r, x, d) in enumerate(zip(replicas, inputs, devices))]
    with _threads_for(devices):
        try:
            for t in threads:
                t.start()
        finally:
            go.set()
        for t in threads:
            t.join()
    for i, error in enumerate(errors):
        if error is not None:
            exc, text = error
            raise RuntimeError(f"replica {i} on {labels[i]} raised {type(exc).__name__}: "
                               f"{exc}\n\nOriginal traceback:\n{text}") from exc
    return results


def gather(outputs, target, dim=0):
    """Concatenate per-device `outputs` on the `target` device along `dim`.

    The inverse of `scatter`: tensors are moved with `.to(target)` and joined
    with `torch.cat` (both differentiable, so backward splits the gradient
    back to each device); 0-dim tensors (e.g. a per-replica loss) are
    stacked into a vector instead. Tuples, lists and dicts are gathered
    element-wise; None stays None; any other value comes back as the list
    of per-device values (cf. torch/nn/parallel/scatter_gather.py).
    """
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        moved = [_move(o, target, "gather", "output grads") for o in outputs]
        if first.dim() == 0:
            return torch.stack(moved)
        return torch.cat(moved, dim)
    if first is None:
        return None
    if isinstance(first, dict):
        if any(set(o) != set(first) for o in outputs):
            raise ValueError("all outputs must be dicts with the same keys")
        return type(first)((k, gather([o[k] for o in outputs], target, dim)) for k in first)
    if isinstance(first, (tuple, list)):
        if any(len(o) != len(first) for o in outputs):
            raise ValueError("all outputs must have the same length")
        items = [gather(list(column), target, dim) for column in zip(*outputs)]
        return type(first)(*items) if _is_namedtuple(first) else type(first)(items)
    return list(outputs)


def data_parallel_forward(module: nn.Module, inputs, devices, output_device=None,
                          dim=0):
    """DataParallel's forward from the four primitives: scatter `inputs`,
    replicate `module` onto as many devices as there are pieces (a batch
    smaller than the device count gives fewer), apply each replica to its
    piece in its own thread, gather the outputs on `output_device` (default
    `devices[0]`). A tuple of inputs gives each replica a tuple of arguments.

    The module is replicated on EVERY call: the cost that makes DataParallel
    slower than DDP, whose replicas live as long as the processes (torch's
    data_parallel.py does the same four steps in `DataParallel.forward`).
    """
    pieces = scatter(inputs, devices, dim)
    used = devices[:len(pieces)]
    replicas = replicate(module, used)  # on EVERY forward: the cost
    outputs = parallel_apply(replicas, pieces, used)
    return gather(outputs, devices[0] if output_device is None else output_device,
                  dim)


class DataParallel(nn.Module):
    """`nn.DataParallel` made of `scatter`, `replicate`, `parallel_apply`, `gather`.

    `DataParallel(module, ["cpu"] * 3)` splits each batch into 3 pieces
    (along `dim`), runs a fresh replica of `module` on each in its own
    thread, and returns the concatenated output on `output_device`
    (default `devices[0]`). Gradients land in `self.module`'s parameters,
    so optimise `dp.module.parameters()` (or `dp.parameters()`: the same
    tensors). Only positional inputs are split. The module is not moved:
    keep it where its parameters should live (torch requires
    device_ids[0]); its replicas are copied to their devices from there.
    With one device the module is simply called on the inputs.
    See torch/nn/parallel/data_parallel.py for the original.
    """

    def __init__(self, module: nn.Module, devices, output_device=None, dim=0):
        super().__init__()
        devices = list(devices)
        if not devices:
            raise ValueError("DataParallel needs at least one device")
        self.module = module
        self.devices = devices
        self.output_device = devices[0] if output_device is None else output_device
        self.dim = dim

    def forward(self, *inputs):
        if len(self.devices) == 1 or not inputs:
            return self.module(*inputs)
        return data_parallel_forward(self.module, inputs, self.devices,
                                     self.output_device, self.dim)
