"""Checker for notebook 03's GPU recipe: `my_gpu_setup(model)`, called in
each process of a job launched like torchrun, returns the model wrapped
for one process per GPU.

What the reference, `dt.system.ddp_on_local_gpu`, guarantees, each property
checked in every stand-in process below, with the hint that names the
mistake breaking it:
- it returns torch's DistributedDataParallel around the model it was given;
- this process's GPU, cuda:LOCAL_RANK, is the current device when DDP is
  built (DDP's first broadcast is nccl's first work), and still is when the
  function returns (a later barrier() runs on the current device:
  torch/distributed/distributed_c10d.py, barrier);
- every parameter is on that GPU when DDP wraps the model;
- DDP is told the device: device_ids=[LOCAL_RANK] (an int, a torch.device
  or a "cuda:i" string, as DDP accepts), and output_device, if given, is
  the same GPU.

No GPU is needed, and none is used: inside the check, torch.cuda's device
calls (and torch.accelerator's) answer for a node with the case's GPUs,
`Module.to` and `.cuda` note where each parameter was sent and leave it
on the CPU, and torch's DistributedDataParallel is replaced by a recorder
of its arguments (a real DDP refuses device_ids for a model on the CPU).
The group is taken as made (dt.run and torchrun scripts make it first):
dist.get_rank() answers RANK, and init_process_group raises as torch's does
when the group exists. A device index the node does not have raises
torch's "invalid device ordinal", as set_device does on a real node.

The cases run from the smallest job up, so the first failing one is the
smallest: RANK differs from LOCAL_RANK on every node but the first, a node
of one GPU makes RANK an invalid ordinal, and a node of 8 GPUs running 4
processes tells LOCAL_RANK from RANK % device_count() (torch's own last
guess in barrier). Each case is one call in this process: well under a
second for all of them.
"""
import contextlib
import inspect
import operator
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, TODO_MESSAGE,
                                         WRONG, Exercise, Verdict, register)

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


CASES = [  # smallest first
    Case(0, 0, 1, 1, 1),   # one GPU
    Case(1, 1, 2, 2, 2),   # one node of two: RANK is LOCAL_RANK, not 0
    Case(1, 0, 2, 1, 1),   # the second of two nodes of one GPU
    Case(2, 0, 4, 2, 2),   # two nodes of two GPUs
    Case(3, 1, 4, 2, 2),
    Case(5, 1, 8, 4, 8),   # 4 processes on nodes of 8 GPUs
    Case(9, 1, 12, 4, 4),  # the third of three nodes
]

RANK_HINT = ("RANK numbers the processes of the whole job; on the second node "
             "it counts on past the first node's GPUs. The GPU is this "
             "process's place on its own machine: LOCAL_RANK, which torchrun "
             "sets. local_rank = int(os.environ['LOCAL_RANK']).")
MODULO_HINT = ("RANK % torch.cuda.device_count() gives LOCAL_RANK only when every "
               "node runs one process per GPU, in rank order (torch's own last "
               "guess in barrier()). Here a node has more GPUs than processes. "
               "Read LOCAL_RANK, which torchrun sets for this process.")
ZERO_HINT = ("every process of a node got GPU 0: their work would queue on one "
             "GPU, and nccl stops with \"Duplicate GPU detected\". Take the GPU "
             "from int(os.environ['LOCAL_RANK']).")
NO_SET_DEVICE_HINT = ("torch.cuda.set_device(local_rank) was never called, so the "
                      "current device stayed GPU 0. nccl work that has no tensor "
                      "to go by (barrier(), DDP's own calls) runs on the current "
                      "device: every process would create its context on GPU 0. "
                      "Call it first, before DDP.")
SET_AFTER_HINT = ("set_device came after DDP was built: DDP's first nccl call "
                  "(the broadcast of rank 0's parameters) already ran with "
                  "another GPU current. Call torch.cuda.set_device(local_rank) "
                  "first.")
MOVED_AFTER_HINT = ("the model was moved after DDP wrapped it. DDP broadcasts "
                    "the parameters and builds its buckets on the device they "
                    "are on when it is built: move the model first, then wrap.")
NOT_MOVED_HINT = ("the model was still on the CPU when DDP wrapped it: "
                  "model.to(local_rank) first, then DDP.")
DEVICE_IDS_HINT = ("DDP was not told the device: pass device_ids=[local_rank]. "
                   "DDP's docs allow None only when your code puts every input "
                   "on the GPU itself; told the device, DDP moves each batch "
                   "there, as this exercise asks.")
STRING_HINT = ("os.environ holds strings, and the text {text!r} is no "
               "device. Convert it: local_rank = int(os.environ['LOCAL_RANK']).")
CURRENT_AT_RETURN_HINT = ("the GPU must stay current after the function "
                          "returns (the training loop's nccl calls and "
                          "torch.cuda calls use it): torch.cuda.set_device("
                          "local_rank), not a `with torch.cuda.device(...)` "
                          "block that ends before the return.")
ACCELERATOR_INT_HINT = ("torch.device(1) asks the machine which accelerator "
                        "it has, and this checker runs without one: write "
                        "torch.device('cuda', local_rank), which means the "
                        "same on a GPU machine.")


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


def small_model() -> nn.Module:
    """What the checker hands my_gpu_setup: two layers, so that moving one
    of them only is seen."""
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _wrong_gpu(index: int, case: Case, world, never_set: bool = False) -> str:
    """The hint for GPU `index` where LOCAL_RANK was expected."""
    counted = any(what == "device_count" for what, _ in world.events)
    if index == case.rank % case.gpus and counted:
        return MODULO_HINT
    if index == case.rank:
        return RANK_HINT
    return NO_SET_DEVICE_HINT if never_set else ZERO_HINT if index == 0 else (
        "the GPU is LOCAL_RANK, this process's place on its node: "
        "int(os.environ['LOCAL_RANK']).")


def _failure(case, what, expected, received, hint) -> str:
    return (f"with {case.describe()}: {what}.\nExpected {expected}; received "
            f"{received}.\nHint: {hint}")


def _error(case, world, error) -> str:
    invalid = [index for what, index in world.events if what == "invalid ordinal"]
    if world.strings:
        hint = STRING_HINT.format(text=world.strings[0])
    elif invalid:
        hint = _wrong_gpu(invalid[0], case, world)
    elif "must be int, not str" in str(error):
        hint = STRING_HINT.format(text=str(case.local_rank))
    elif "Cannot access accelerator" in str(error):
        hint = ACCELERATOR_INT_HINT
    elif "process group twice" in str(error):
        hint = ("my_gpu_setup runs in a process whose group exists already: "
                "leave init_process_group out, pick the GPU and wrap.")
    else:
        hint = "read the error above; the exercise's text lists each step."
    return (f"with {case.describe()}: your function raised "
            f"{type(error).__name__}: {error}\nHint: {hint}")


def judge(case: Case, world: StandInProcess, model, returned) -> str | None:
    """What went wrong in one stand-in process, or None: the properties in
    the module's docstring, in order."""
    local = case.local_rank
    gpu = f"cuda:{local}"
    if not world.built:
        return _failure(case, "torch's DistributedDataParallel was never built",
                        "the model wrapped by DDP", f"{type(returned).__name__}",
                        "wrap the model: torch.nn.parallel.DistributedDataParallel("
                        "model, device_ids=[local_rank]), and return it.")
    record = next((r for r in world.built if r["wrapper"] is returned), None)
    if record is None:
        return _failure(case, "the function did not return the DDP it built",
                        "the DistributedDataParallel object",
                        type(returned).__name__, "return the wrapped model.")
    if {id(p) for p in record["module"].parameters()} != {
            id(p) for p in model.parameters()}:
        return _failure(case, "DDP wraps another model than the one given",
                        "the parameters of `model`", "other parameters",
                        "wrap the model my_gpu_setup was given.")
    order = [what for what, _ in world.events]
    ddp_at = order.index("ddp")
    if record["current"] != local or any(
            what == "barrier" and detail != local for what, detail in
            world.events[:ddp_at]):
        set_calls = [i for i, what in enumerate(order) if what == "set_device"]
        hint = (SET_AFTER_HINT if set_calls and min(set_calls) > ddp_at
                else _wrong_gpu(record["current"], case, world,
                                never_set=not set_calls))
        return _failure(case, "the current device when DDP was built is not "
                        "this process's GPU", gpu, f"cuda:{record['current']}",
                        hint)
    devices = {str(d) for d in record["devices"]}
    if devices != {gpu}:
        moved_after = "to" in order[ddp_at:]
        wrong = sorted(devices - {gpu})[0]
        hint = (MOVED_AFTER_HINT if moved_after else NOT_MOVED_HINT
                if wrong == "cpu" else _wrong_gpu(int(wrong.split(":")[1]), case, world))
        return _failure(case, "the model's parameters were not on this "
                        "process's GPU when DDP wrapped them", f"all on {gpu}",
                        f"on {', '.join(sorted(devices))}", hint)
    if record["device_ids"] is None:
        return _failure(case, "DDP was not told the device", f"device_ids=[{local}]",
                        "device_ids=None", DEVICE_IDS_HINT)
    if record["device_ids"] != [local]:
        return _failure(case, "DDP was told another device",
                        f"device_ids=[{local}]", f"device_ids={record['device_ids']}",
                        _wrong_gpu(record["device_ids"][0], case, world))
    if record["output_device"] not in (None, local):
        return _failure(case, "DDP's output_device is another GPU",
                        f"output_device={local} (or left out)",
                        f"output_device={record['output_device']}",
                        _wrong_gpu(record["output_device"], case, world))
    if world.current != local:
        return _failure(case, "this process's GPU is not current after the "
                        "function returned", gpu, f"cuda:{world.current}",
                        CURRENT_AT_RETURN_HINT)
    return None


def try_case(fn, case: Case):
    """(verdict status, message) for `fn` in one stand-in process."""
    world, model = StandInProcess(case), small_model()
    with world.installed(fn):
        try:
            returned = fn(model)
        except NotImplementedError:
            return NOT_ATTEMPTED, TODO_MESSAGE
        except Exception as error:  # the learner's code raised: a verdict
            return WRONG, _error(case, world, error)
    if world.strings:
        return WRONG, (f"with {case.describe()}: a device was given as the "
                       f"text {world.strings[0]!r}.\nHint: "
                       f"{STRING_HINT.format(text=world.strings[0])}")
    problem = judge(case, world, model, returned)
    return (WRONG, problem) if problem else (CORRECT, "")


def check_gpu_recipe(fn) -> Verdict:
    for case in CASES:
        status, message = try_case(fn, case)
        if status != CORRECT:
            return Verdict(status, message)
    return Verdict(CORRECT, (
        f"tried {len(CASES)} processes, from a single GPU to the third of "
        "three nodes (RANK 9, LOCAL_RANK 1), and a node of 8 GPUs running 4 "
        "processes: in each, GPU LOCAL_RANK was current before DDP was built "
        "and after, the model was on it, and DDP was told device_ids="
        "[LOCAL_RANK]. (No GPU was used: the checker stood in for torch.cuda "
        "and DDP.)"))


register(Exercise(
    "gpu_recipe", "One process, one GPU", "my_gpu_setup",
    "ddp_teach.system:ddp_on_local_gpu", check_gpu_recipe,
    ["this process's GPU is LOCAL_RANK (its place on its machine), not RANK "
     "(its place in the job): they differ on every node but the first.",
     "the order matters: set the current device, move the model, then wrap "
     "it; os.environ holds strings.",
     "local_rank = int(os.environ['LOCAL_RANK']); torch.cuda.set_device("
     "local_rank); model = model.to(local_rank); return DDP(model, "
     "device_ids=[local_rank])."]))
