"""Checker for notebook 03's GPU recipe: `my_gpu_setup(model)`, called in
each process of a job launched like torchrun, returns the model wrapped
for one process per GPU.

What the reference, `dt.system.ddp_on_local_gpu`, guarantees, each property
checked in every stand-in process below, with the hint that names the
mistake breaking it:
- it returns torch's DistributedDataParallel around the model it was given;
- this process's GPU, cuda:LOCAL_RANK, is the current device when DDP is
  built (DDP's construction makes nccl's first calls: it checks the
  parameters' shapes across ranks and broadcasts rank 0's, torch/nn/
  parallel/distributed.py, init_sync), and still is when the
  function returns (a later barrier() runs on the current device:
  torch/distributed/distributed_c10d.py, barrier);
- every parameter is on that GPU when DDP wraps the model;
- DDP is told the device: device_ids=[LOCAL_RANK] (an int, a torch.device
  or a "cuda:i" string, as DDP accepts), and output_device, if given, is
  the same GPU.

No GPU is needed, and none is used: the calls run in a stand-in process
(nb03_gpu_standin.py) where torch.cuda answers for the case's node and
DDP records its arguments.

The cases run from the smallest job up, so the first failing one is the
smallest: RANK differs from LOCAL_RANK on every node but the first, a node
of one GPU makes RANK an invalid ordinal, and a node of 8 GPUs running 4
processes tells LOCAL_RANK from RANK % device_count() (torch's own last
guess in barrier). Each case is one call in this process: well under a
second for all of them.
"""
from torch import nn

from ddp_teach.exercises.nb03_gpu_standin import Case, StandInProcess
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, TODO_MESSAGE,
                                         WRONG, Exercise, Verdict, register)

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
SET_AFTER_HINT = ("set_device came after DDP was built: DDP's first nccl calls "
                  "(checking the parameters' shapes across ranks, then "
                  "broadcasting rank 0's) already ran with another GPU "
                  "current. Call torch.cuda.set_device(local_rank) first.")
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
    elif "not compiled with CUDA" in str(error):
        hint = ("the checker has no GPU and stands in only for torch.cuda's "
                "set_device, current_device, device_count, is_available, "
                "device and synchronize (and torch.accelerator's): the recipe "
                "needs no other torch.cuda call.")
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
