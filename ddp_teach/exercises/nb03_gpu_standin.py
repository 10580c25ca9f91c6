"""The stand-in process that notebook 03's GPU-recipe checker
(nb03_gpu_recipe.py) calls `my_gpu_setup` in: no GPU is needed, and none
is used.

Inside `StandInProcess.installed`, torch.cuda's device calls (and
torch.accelerator's) answer for a node with the case's GPUs and keep a
current device, as a fresh process's starts at 0; `Module.to` and `.cuda`
note where each parameter was sent and leave it on the CPU; torch's
DistributedDataParallel is replaced by a recorder of its arguments (a
real DDP refuses device_ids for a model on the CPU). The group is taken
as made (dt.run and torchrun scripts make it first): dist.get_rank()
answers RANK, barrier() notes the current device, and init_process_group
raises as torch's does when the group exists. A device index the node
does not have raises torch's "invalid device ordinal", as set_device does
on a real node; text that is no device raises as torch.device does. Device
arguments are read as torch's `_get_device_index` reads them (an int, a
torch.device, "cuda:i"; "cuda" alone is the current device).
"""
import contextlib
import inspect
import operator
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

REAL_DDP = nn.parallel.DistributedDataParallel
DDP_SIGNATURE = inspect.signature(REAL_DDP.__init__)


@dataclass(frozen=True)
class Case:
    """One process of a job: its RANK and LOCAL_RANK, the job's size, and
    the GPUs of its node (at least the processes it runs)."""
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    gpus: int

    def describe(self) -> str:
        nodes = self.world_size // self.local_world_size
        return (f"RANK={self.rank}, LOCAL_RANK={self.local_rank} (a job of "
                f"{nodes} node{'s' * (nodes > 1)} x {self.local_world_size} "
                f"process{'es' * (self.local_world_size > 1)}, {self.gpus} "
                f"GPU{'s' * (self.gpus > 1)} per node)")


class InvalidOrdinal(RuntimeError):
    """What torch.cuda.set_device raises for a GPU the node does not have."""


class StandInProcess:
    """One process of `case`'s job, as my_gpu_setup sees it: torch.cuda
    answering for the node's GPUs, Module.to recording where parameters
    were sent, DDP recording its arguments. Every call is noted in
    `events`, in order."""

    def __init__(self, case: Case):
        self.case = case
        self.current = 0  # a fresh process's current device
        self.events = []  # (what, detail) in call order
        self.placed = {}  # id(parameter) -> the device it was sent to
        self.built = []   # the DDP records, in order
        self.strings = []  # device arguments given as text of digits

    # -- devices, as torch's _get_device_index reads them
    def index(self, device, optional=True) -> int:
        """The GPU index `device` names (None: the current one), raising as
        torch does for text that is not a device and for a GPU the node
        does not have."""
        if isinstance(device, str):
            if device.strip().isdigit():
                self.strings.append(device)
            device = torch.device(device)  # raises "Invalid device string"
        if isinstance(device, torch.device):
            if device.type != "cuda":
                raise ValueError(f"Expected a cuda device, but got: {device}")
            if device.index is None:
                if not optional:
                    raise ValueError("Expected a torch.device with a specified "
                                     f"index or an integer, but got:{device}")
                return self.current
            device = device.index
        if device is None:
            return self.current
        index = operator.index(device)
        if not 0 <= index < self.case.gpus:
            self.events.append(("invalid ordinal", index))
            raise InvalidOrdinal(
                f"CUDA error: invalid device ordinal (GPU {index} asked for on "
                f"a node of {self.case.gpus} GPU{'s' * (self.case.gpus > 1)})")
        return index

    def device_count(self) -> int:
        self.events.append(("device_count", self.case.gpus))
        return self.case.gpus

    def set_device(self, device):
        index = self.index(device, optional=False)
        self.events.append(("set_device", index))
        self.current = index

    def device_context(self, device):
        """torch.cuda.device(i): current inside the block only."""
        world = self

        class DeviceBlock:
            def __enter__(self):
                self.before = world.current
                world.set_device(device)

            def __exit__(self, *exc):
                world.current = self.before
                world.events.append(("set_device", self.before))
        return DeviceBlock()

    # -- the model's moves
    def move(self, module, device):
        target = (torch.device("cpu") if device is None or
                  isinstance(device, torch.device) and device.type == "cpu"
                  else torch.device("cuda", self.index(device)))
        self.events.append(("to", target))
        for parameter in module.parameters():
            self.placed[id(parameter)] = target
        return module

    def module_to(self, module, *args, **kwargs):
        device = kwargs.get("device", args[0] if args else None)
        if isinstance(device, torch.Tensor):
            device = device.device
        if isinstance(device, torch.dtype):
            device = None
        if isinstance(device, int) and not isinstance(device, bool):
            device = torch.device("cuda", device)
        if device is None:
            return module
        return self.move(module, device)

    def module_cuda(self, module, device=None):
        return self.move(module, torch.device("cuda") if device is None else
                         device if isinstance(device, (str, torch.device))
                         else torch.device("cuda", operator.index(device)))

    # -- DDP
    def record_ddp(self, wrapper, arguments):
        module = arguments["module"]
        device_ids = arguments.get("device_ids")
        output_device = arguments.get("output_device")
        if device_ids is not None and len(device_ids) > 1:
            raise ValueError("device_ids can only be None or contain a single "
                             "element.")
        record = {
            "wrapper": wrapper, "module": module, "current": self.current,
            "devices": [self.placed.get(id(p), torch.device("cpu"))
                        for p in module.parameters()],
            "device_ids": None if not device_ids else
            [self.index(d) for d in device_ids],
            "output_device": None if output_device is None else
            self.index(output_device)}
        self.events.append(("ddp", record))
        self.built.append(record)

    def recording_ddp(self):
        world = self

        class DistributedDataParallel(nn.Module):
            """Stands in for torch's: notes its arguments, wraps the module."""

            def __init__(self, *args, **kwargs):
                super().__init__()
                bound = DDP_SIGNATURE.bind(None, *args, **kwargs)
                self.module = bound.arguments["module"]
                world.record_ddp(self, bound.arguments)

            def forward(self, *args, **kwargs):
                return self.module(*args, **kwargs)
        return DistributedDataParallel

    # -- the process group, taken as made
    def barrier(self, *args, **kwargs):
        self.events.append(("barrier", self.current))

    def init_process_group(self, *args, **kwargs):
        raise RuntimeError("trying to initialize the default process group "
                           "twice! (the group exists before my_gpu_setup runs: "
                           "dt.run or the script made it)")

    def replacements(self):
        """(owner, attribute, stand-in) for every call the check answers."""
        case, cuda, accelerator = self.case, torch.cuda, torch.accelerator
        recorder = self.recording_ddp()
        return [
            (cuda, "set_device", self.set_device),
            (cuda, "current_device", lambda: self.current),
            (cuda, "device_count", self.device_count),
            (cuda, "is_available", lambda: True),
            (cuda, "device", self.device_context),
            (cuda, "synchronize", lambda device=None: None),
            (accelerator, "set_device_index", self.set_device),
            (accelerator, "set_device_idx", self.set_device),
            (accelerator, "current_device_index", lambda: self.current),
            (accelerator, "current_device_idx", lambda: self.current),
            (accelerator, "device_count", self.device_count),
            (accelerator, "is_available", lambda: True),
            (accelerator, "current_accelerator",
             lambda check_available=False: torch.device("cuda")),
            # functions, not bound methods, so that model.to(...) binds model
            (nn.Module, "to", lambda module, *a, **k: self.module_to(module, *a, **k)),
            (nn.Module, "cuda", lambda module, device=None: self.module_cuda(module, device)),
            (nn.parallel, "DistributedDataParallel", recorder),
            (nn.parallel.distributed, "DistributedDataParallel", recorder),
            (dist, "get_rank", lambda group=None: case.rank),
            (dist, "get_world_size", lambda group=None: case.world_size),
            (dist, "is_initialized", lambda: True),
            (dist, "init_process_group", self.init_process_group),
            (dist, "barrier", self.barrier),
        ]

    @contextlib.contextmanager
    def installed(self, fn):
        """Inside: this process's environment and stand-ins, also where the
        learner's globals hold torch's own objects (`from torch.nn.parallel
        import DistributedDataParallel as DDP`)."""
        pairs = self.replacements()
        saved = [(owner, name, getattr(owner, name)) for owner, name, _ in pairs]
        by_real = {id(real): fake for (_, _, real), (_, _, fake) in
                   zip(saved, pairs)}
        learner_globals = getattr(fn, "__globals__", {})
        swapped = {name: value for name, value in learner_globals.items()
                   if id(value) in by_real}
        env = {"RANK": self.case.rank, "LOCAL_RANK": self.case.local_rank,
               "WORLD_SIZE": self.case.world_size,
               "LOCAL_WORLD_SIZE": self.case.local_world_size,
               "GROUP_RANK": self.case.rank // self.case.local_world_size}
        env_before = {name: os.environ.get(name) for name in env}
        try:
            os.environ.update({name: str(value) for name, value in env.items()})
            for owner, name, fake in pairs:
                setattr(owner, name, fake)
            for name, value in swapped.items():
                learner_globals[name] = by_real[id(value)]
            yield self
        finally:
            for name, value in swapped.items():
                learner_globals[name] = value
            for owner, name, real in saved:
                setattr(owner, name, real)
            for name, value in env_before.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
