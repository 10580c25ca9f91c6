"""What this machine offers a run: cores, GPUs, the backend, the loopback.

Kept apart from the launcher so that notebook 00's environment check and the
launcher's choices come from the same functions.
"""
import os
import socket

BACKENDS = ("auto", "gloo", "nccl")
# What "auto" gives a run with a GPU per rank: one process group with a
# backend per device type (torch.distributed's "device:backend" form), so
# collectives on GPU tensors go through nccl and those on CPU tensors (a
# count, a flag, a notebook's torch.ones(4)) through gloo, where plain nccl
# would refuse them.
GPU_AND_CPU = "cpu:gloo,cuda:nccl"


def cpu_cores() -> int:
    """Cores this process may use (respects taskset / container limits)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no affinity call
        return os.cpu_count() or 1


def threads_per_rank(world_size: int) -> int:
    """Intra-op threads per worker, so that ranks do not fight over cores."""
    return max(1, cpu_cores() // world_size)


def gpu_count() -> int:
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def choose_backend(backend: str, world_size: int) -> str:
    """'auto' is nccl for GPU tensors and gloo for CPU ones (GPU_AND_CPU)
    when there is a GPU per rank, else gloo; 'nccl' without enough GPUs is
    refused before anything starts."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got "
                         f"{backend!r}")
    gpus = gpu_count() if backend != "gloo" else 0
    if backend == "nccl" and gpus < world_size:
        raise ValueError(
            f"backend='nccl' needs one CUDA GPU per rank: world_size={world_size} "
            f"but this machine has {gpus}. Use backend='gloo' (CPU) or 'auto'.")
    if backend == "auto":
        return GPU_AND_CPU if gpus >= world_size else "gloo"
    return backend


def uses_nccl(backend: str) -> bool:
    """Whether a process group's backend (as `dist.get_backend()` names it:
    "nccl", "gloo" or GPU_AND_CPU) sends GPU tensors through nccl."""
    return "nccl" in backend


def collective_device():
    """The device whose tensors this rank's default group moves fastest: its
    GPU where nccl is in the backend, else the CPU (gloo)."""
    import torch
    import torch.distributed as dist
    if uses_nccl(dist.get_backend()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def loopback_interface() -> str:
    """The loopback interface's name ('lo' on Linux, 'lo0' on macOS)."""
    for _, name in socket.if_nameindex():
        if name.startswith("lo"):
            return name
    return "lo"


def describe() -> dict:
    """The facts notebook 00 prints: cores, GPUs, backend, versions."""
    import torch
    import torch.distributed as dist
    return {"torch": torch.__version__, "cpu_cores": cpu_cores(),
            "cuda_gpus": gpu_count(), "gloo": dist.is_gloo_available(),
            "nccl": dist.is_nccl_available(),
            "backend for 2 ranks": choose_backend("auto", 2),
            "threads per rank at 2 ranks": threads_per_rank(2)}


def ddp_on_local_gpu(model, **ddp_options):
    """One process per GPU, as notebook 03 runs it with nccl: this process's
    GPU is LOCAL_RANK (its place on its machine, not RANK, its place in the
    job), made current before any nccl work, the model moved there first,
    then wrapped by torch's DDP told that device (which moves each batch
    there). Without set_device every process's current device is GPU 0,
    and nccl calls that have no tensor to go by run there: barrier() uses
    the current device (torch/distributed/distributed_c10d.py, barrier).
    Checked without a GPU by ddp_teach/exercises/nb03_gpu_recipe.py."""
    import os

    import torch
    local_rank = int(os.environ["LOCAL_RANK"])  # which GPU of this machine
    torch.cuda.set_device(local_rank)           # this process drives it
    model = model.to(local_rank)                # the model first, then DDP
    return torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[local_rank], output_device=local_rank, **ddp_options)
