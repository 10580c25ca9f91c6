"""Notebook 03's GPU recipe (`my_gpu_setup`): planted mistakes (PLANTED, run
by test_registry.py with the reference and the stub), right answers in
other styles, the smallest failing process named, mutants of the
reference, the stand-ins taken away after every check, and the notebook's
GPU cell doing what the reference does. No GPU is needed: the checker
stands in for torch.cuda and DDP."""
import ast
import inspect
import os
import textwrap
from pathlib import Path

import nbformat
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_teach.exercises import nb03_gpu_recipe as recipe
from ddp_teach.system import ddp_on_local_gpu

NOTEBOOK = Path(__file__).parents[2] / "notebooks" / "03_ddp.ipynb"


# -- wrong answers, each a mistake the exercise is about
def device_from_rank(model):
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    return DDP(model.to(rank), device_ids=[rank])


def device_from_dist_rank(model):
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    return DDP(model.to(rank), device_ids=[rank])


def rank_modulo_device_count(model):
    gpu = dist.get_rank() % torch.cuda.device_count()
    torch.cuda.set_device(gpu)
    return DDP(model.to(gpu), device_ids=[gpu])


def no_set_device(model):
    local_rank = int(os.environ["LOCAL_RANK"])
    return DDP(model.to(local_rank), device_ids=[local_rank])


def set_device_after_ddp(model):
    local_rank = int(os.environ["LOCAL_RANK"])
    net = DDP(model.to(local_rank), device_ids=[local_rank])
    torch.cuda.set_device(local_rank)
    return net


def device_ids_left_out(model):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    return DDP(model.to(local_rank))


def hard_coded_zero(model):
    torch.cuda.set_device(0)
    return DDP(model.to(0), device_ids=[0])


def local_rank_left_a_string(model):
    local_rank = os.environ["LOCAL_RANK"]
    torch.cuda.set_device(f"cuda:{local_rank}")
    return DDP(model.to(f"cuda:{local_rank}"), device_ids=[local_rank])


def string_in_torch_device(model):
    device = torch.device("cuda", os.environ["LOCAL_RANK"])
    torch.cuda.set_device(device)
    return DDP(model.to(device), device_ids=[device])


def model_moved_after_ddp(model):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    net = DDP(model, device_ids=[local_rank])
    model.to(local_rank)
    return net


def model_never_moved(model):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    return DDP(model, device_ids=[local_rank])


def current_only_inside_a_block(model):
    local_rank = int(os.environ["LOCAL_RANK"])
    with torch.cuda.device(local_rank):
        return DDP(model.to(local_rank), device_ids=[local_rank])


def output_device_zero(model):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    return DDP(model.to(local_rank), device_ids=[local_rank], output_device=0)


def returns_the_bare_model(model):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = model.to(local_rank)
    DDP(model, device_ids=[local_rank])
    return model


def creates_the_group_again(model):
    dist.init_process_group("nccl")
    return ddp_on_local_gpu(model)


def one_layer_moved(model):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model[0].to(local_rank)
    return DDP(model, device_ids=[local_rank])


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("gpu_recipe", device_from_rank, ("RANK=1, LOCAL_RANK=0", "invalid device ordinal",
                                      "RANK numbers the processes of the whole job")),
    ("gpu_recipe", device_from_dist_rank, ("RANK=1, LOCAL_RANK=0",
                                           "RANK numbers the processes")),
    ("gpu_recipe", rank_modulo_device_count, ("RANK=5, LOCAL_RANK=1",
                                              "Expected cuda:1; received cuda:5",
                                              "RANK % torch.cuda.device_count()")),
    ("gpu_recipe", no_set_device, ("RANK=1, LOCAL_RANK=1", "never called")),
    ("gpu_recipe", set_device_after_ddp, "set_device came after DDP was built"),
    ("gpu_recipe", device_ids_left_out, ("Expected device_ids=[0]; received "
                                         "device_ids=None", "DDP was not told")),
    ("gpu_recipe", hard_coded_zero, ("RANK=1, LOCAL_RANK=1", "got GPU 0",
                                     "Duplicate GPU detected")),
    ("gpu_recipe", local_rank_left_a_string, ("the text '0' is no device",
                                              "int(os.environ['LOCAL_RANK'])")),
    ("gpu_recipe", string_in_torch_device, "os.environ holds strings"),
    ("gpu_recipe", model_moved_after_ddp, "moved after DDP wrapped it"),
    ("gpu_recipe", model_never_moved, "still on the CPU when DDP wrapped it"),
    ("gpu_recipe", one_layer_moved, ("received on cpu, cuda:0", "still on the CPU")),
    ("gpu_recipe", current_only_inside_a_block, ("not current after the function "
                                                 "returned", "with torch.cuda.device")),
    ("gpu_recipe", output_device_zero, ("RANK=1, LOCAL_RANK=1", "output_device=0",
                                        "got GPU 0")),
    ("gpu_recipe", returns_the_bare_model, "return the wrapped model"),
    ("gpu_recipe", creates_the_group_again, "leave init_process_group out"),
]


# -- right answers in other styles
def with_a_device_object(model):
    local_rank = int(os.getenv("LOCAL_RANK"))
    device = torch.device(f"cuda:{local_rank}")
    torch.cuda.set_device(device)
    return DDP(model.to(device), device_ids=[device], output_device=device)


def with_cuda_and_current_device(model):
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    model.cuda()
    return nn.parallel.DistributedDataParallel(
        model, device_ids=[torch.cuda.current_device()])


def with_cuda_index_and_strings(model):
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(f"cuda:{local_rank}")
    return torch.nn.parallel.DistributedDataParallel(
        model.cuda(local_rank), device_ids=[f"cuda:{local_rank}"])


def with_torch_accelerator(model):
    local_rank = dist.get_node_local_rank()
    torch.accelerator.set_device_index(local_rank)
    return DDP(model.to("cuda"), device_ids=[local_rank])


def with_keyword_arguments(model):
    from torch.nn.parallel import DistributedDataParallel
    local_rank = int(os.environ["LOCAL_RANK"])
    assert torch.cuda.is_available() and local_rank < torch.cuda.device_count()
    torch.cuda.set_device(device=local_rank)
    dist.barrier()
    return DistributedDataParallel(module=model.to(device=torch.device(
        "cuda", local_rank)), device_ids=[local_rank])


RIGHT = [ddp_on_local_gpu, with_a_device_object, with_cuda_and_current_device,
         with_cuda_index_and_strings, with_torch_accelerator, with_keyword_arguments]


@pytest.mark.parametrize("right", RIGHT, ids=lambda f: f.__name__)
def test_right_answers_in_other_styles_are_correct(right, verdict):
    passed, seen = verdict("gpu_recipe", right)
    assert passed and "✅" in seen, seen


def test_a_mistake_is_shown_on_the_smallest_process_that_shows_it(verdict):
    """Hard-coded 0 passes on LOCAL_RANK 0 and fails first on the smallest
    job where LOCAL_RANK is 1: one node of two GPUs."""
    _, seen = verdict("gpu_recipe", hard_coded_zero)
    assert "with RANK=1, LOCAL_RANK=1 (a job of 1 node x 2 processes, 2 GPUs " \
           "per node)" in seen, seen
    assert "Expected cuda:1; received cuda:0" in seen, seen


def test_the_cases_run_from_the_smallest_job_and_tell_rank_from_local_rank():
    sizes = [case.world_size for case in recipe.CASES]
    assert sizes == sorted(sizes)
    assert any(c.rank != c.local_rank for c in recipe.CASES)
    assert any(c.rank >= c.gpus for c in recipe.CASES)  # RANK: invalid ordinal
    assert any(c.rank % c.gpus != c.local_rank for c in recipe.CASES)
    for case in recipe.CASES:  # torchrun's numbering, node by node
        node = case.rank // case.local_world_size
        assert case.rank == node * case.local_world_size + case.local_rank
        assert case.local_rank < case.local_world_size <= case.gpus


def test_the_stand_ins_are_taken_away_after_a_check(verdict):
    before = {"set_device": torch.cuda.set_device, "to": nn.Module.to,
              "cuda": nn.Module.cuda, "ddp": nn.parallel.DistributedDataParallel,
              "get_rank": dist.get_rank, "barrier": dist.barrier,
              "env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK")},
              "DDP": globals()["DDP"]}
    for fn in (ddp_on_local_gpu, device_from_rank, creates_the_group_again):
        verdict("gpu_recipe", fn)
    after = {"set_device": torch.cuda.set_device, "to": nn.Module.to,
             "cuda": nn.Module.cuda, "ddp": nn.parallel.DistributedDataParallel,
             "get_rank": dist.get_rank, "barrier": dist.barrier,
             "env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK")},
             "DDP": globals()["DDP"]}
    assert after == before
    assert DDP is nn.parallel.distributed.DistributedDataParallel


def _reference_mutants():
    """The reference's source with one edit each: a statement dropped, two
    neighbouring statements swapped, a name or argument changed."""
    source = textwrap.dedent(inspect.getsource(ddp_on_local_gpu))
    body = ast.parse(source).body[0].body
    steps = [n for n in body[1:] if not isinstance(n, ast.Import)]  # no docstring
    lines = source.splitlines()
    mutants = {}
    for step in steps[1:-1]:  # keep the read and the return
        mutants[f"drop line {step.lineno}"] = "\n".join(
            l for i, l in enumerate(lines, 1) if i != step.lineno)
    for first, second in zip(steps[1:-1], steps[2:-1]):
        swapped = list(lines)
        swapped[first.lineno - 1], swapped[second.lineno - 1] = (
            lines[second.lineno - 1], lines[first.lineno - 1])
        mutants[f"swap {ast.unparse(first)} | {ast.unparse(second)}"] = "\n".join(swapped)
    for old, new in [('"LOCAL_RANK"', '"RANK"'), ("int(os.environ", "(os.environ"),
                     ("set_device(local_rank)", "set_device(0)"),
                     ("model.to(local_rank)", "model.to(0)"),
                     ("device_ids=[local_rank]", "device_ids=[0]"),
                     ("device_ids=[local_rank]", "device_ids=None"),
                     ("output_device=local_rank", "output_device=0"),
                     ("model = model.to(local_rank)", "model.to('cpu')"),
                     ("return torch", "torch")]:
        assert old in source, old
        mutants[f"{old} -> {new}"] = source.replace(old, new, 1)
    return mutants


# moving the model to cuda:LOCAL_RANK by its index before set_device is
# right too: the device is named, and set_device still comes before DDP
EQUIVALENT = {"swap torch.cuda.set_device(local_rank) | model = model.to(local_rank)"}


def test_every_mutant_of_the_reference_is_rejected_but_the_equivalent_one(capsys):
    rejected, kept = 0, []
    mutants = _reference_mutants()
    for name, source in mutants.items():
        namespace = dict(vars(inspect.getmodule(ddp_on_local_gpu)))
        exec(compile(source, f"<mutant {name}>", "exec"), namespace)
        if not recipe.check_gpu_recipe(namespace["ddp_on_local_gpu"]).status == "correct":
            rejected += 1
        else:
            kept.append(name)
    with capsys.disabled():
        print(f"\ngpu_recipe: {rejected} of {len(mutants)} mutants rejected")
    assert set(kept) == EQUIVALENT, kept


def test_the_notebook_gpu_cell_runs_the_reference_recipe():
    """The cell that runs on 2 GPUs (and the exercise's reference) take the
    same steps: LOCAL_RANK as an int, set_device, the model moved, DDP told
    the device."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    [cell] = [c for c in nb.cells if c.cell_type == "code"
              and c.source.startswith("def gpu_train(")]
    steps = ['int(os.environ["LOCAL_RANK"])', "torch.cuda.set_device(local_rank)",
             ".to(local_rank)", "device_ids=[local_rank], output_device=local_rank"]
    reference = inspect.getsource(ddp_on_local_gpu)
    for step in steps:
        assert step in cell.source and step in reference, step
    assert cell.source.index("set_device") < cell.source.index("TorchDDP(")
