"""From a notebook function to a script that `torchrun` runs unchanged.

`dt.run` workers already see torchrun's environment (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT), so the function tested in a cell is
already a torchrun program; what it lacks is a file. `export` writes one:
the function's source, what it needs from the notebook, and an entry point
that does what `dt.run` did around it (`init_process_group` from the
environment, the call, `destroy_process_group`) and then, as `dt.run`'s
workers do, leaves with `os._exit`: Python's own shutdown can abort a
process whose gloo threads are still running (the entry point says why).

Why a function and not `%%writefile`: `%%writefile` copies one cell as it
is, so the script and the code you tested are two copies that drift apart.
`export` writes the function you just ran with `dt.run`, and finds what it
uses by itself: modules become imports, functions and classes defined in
the notebook are copied (and what they use, in turn), functions from
installed modules are imported, plain constants are written as literals.
Anything else (a tensor, a model, an open file in a notebook variable) is
refused with its name: a script cannot carry it; build it in the function.

`torchrun` (from `ddp_teach.torchrun`, here for short) runs the script
from the notebook and reads each rank's return value back.
"""
import ast
import dis
import inspect
import linecache
import os
import sys
import textwrap
import types
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from ddp_teach.launcher.torchrun import TorchrunResult, free_port, run_commands, torchrun

__all__ = ["export", "source", "torchrun", "run_commands", "TorchrunResult",
           "free_port", "train", "torchrun_main"]

ENTRY_POINT = '''

def _main():
    """torchrun starts this file once per worker, each with RANK,
    WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set."""
    import argparse
    import os
    import sys
    import torch
    import torch.distributed as _dist
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", help="folder for each rank's return value")
    out = parser.parse_args().out
{call}
    if out:
        path = os.path.join(out, f"rank{{os.environ['RANK']}}.pt")
        torch.save(result, path)
    # Leave without Python's shutdown. Importing torch._dynamo (DDP's
    # constructor does) keeps a gloo group that already exists, and its
    # threads, alive after destroy_process_group. A thread that is still
    # freeing the last collective of backward needs the interpreter; if
    # Python is shutting down by then, the process aborts with "terminate
    # called without an active exception". All is saved: flush and go.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    _main()
'''
AUTO_BACKEND = '''\
    # a GPU for each of this machine's workers: nccl for GPU tensors and
    # gloo for CPU ones, in one group; otherwise gloo
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    enough = gpus >= int(os.environ["LOCAL_WORLD_SIZE"])
    backend = "cpu:gloo,cuda:nccl" if enough else "gloo"
'''
SETUP_CALL = '''\
    if "nccl" in backend:  # LOCAL_RANK: this worker's GPU on its machine
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    # no address, rank or size: init_method="env://" reads them from torchrun
    _dist.init_process_group(backend)
    try:
        rank, world_size = _dist.get_rank(), _dist.get_world_size()
        result = {name}(rank, world_size, *ARGS, **KWARGS)
        # every rank done with its collectives before any rank leaves
        _dist.barrier()
    finally:
        _dist.destroy_process_group()'''
PLAIN_CALL = "    result = {name}(*ARGS, **KWARGS)"


def train(rank: int, world_size: int, steps: int = 3) -> list:
    """Notebook 07's training job: torch's DDP on a tiny model, each rank
    with its own batches (seeded by its rank); the final parameters. The
    same seeds give the same result under `dt.run` and under torchrun, which
    is how the notebook shows that a launcher changes nothing else."""
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 4, generator=g)).square().mean().backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def torchrun_main() -> list:
    """The body of a script that torchrun starts (notebook 07's exercise):
    who this process is comes from the environment torchrun sets, RANK and
    WORLD_SIZE (LOCAL_RANK only picks the GPU: on two nodes of one process
    each it is 0 on both); `init_process_group` with no address reads
    MASTER_ADDR and MASTER_PORT ("env://"); the group is destroyed before
    returning. See torch/distributed/run.py for what torchrun sets.
    """
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")  # env://: MASTER_ADDR, MASTER_PORT
    params = train(rank, world_size)
    dist.destroy_process_group()
    return params


def source(fn) -> str:
    """`fn`'s source with what it needs: imports, then definitions."""
    imports, definitions = [], []
    _collect(fn, getattr(fn, "__name__", "fn"), imports, definitions, set())
    imports = sorted(set(imports), key=lambda line: (line.startswith("from"),
                                                      line))
    return "\n".join(imports) + "\n\n\n" + "\n\n\n".join(definitions) + "\n"


def export(fn, path, *, args=(), kwargs=None, backend="auto",
           setup=True) -> Path:
    """Write `fn` as a standalone script that runs under torchrun.

    setup=True (a `dt.run` function): the entry point creates the process
    group from torchrun's environment, calls `fn(rank, world_size, *args,
    **kwargs)` and destroys the group. setup=False: it calls `fn(*args,
    **kwargs)`, and `fn` does all of that itself. Either way `--out DIR`
    saves each rank's return value as DIR/rank{RANK}.pt. `args` and
    `kwargs` must be plain values: they are written into the script.
    """
    kwargs = {} if kwargs is None else dict(kwargs)
    for label, value in (("args", tuple(args)), ("kwargs", kwargs)):
        if not _is_literal(value):
            raise TypeError(f"{label} must be plain values (numbers, strings, "
                            f"lists, dicts...) to be written into the script; "
                            f"got {value!r:.80}")
    if backend not in ("auto", "gloo", "nccl"):
        raise ValueError(f"backend must be auto, gloo or nccl; got {backend!r}")
    call = PLAIN_CALL.format(name=fn.__name__)
    if setup:
        call = (AUTO_BACKEND if backend == "auto" else
                f'    backend = "{backend}"\n') + SETUP_CALL.format(
                    name=fn.__name__)
    text = (f"# Exported from a notebook by ddp_teach.scripts.export. Run:\n"
            f"#   torchrun --standalone --nproc-per-node 2 {Path(path).name}"
            f" [--out DIR]\n" + source(fn) +
            f"\n\nARGS = {tuple(args)!r}\nKWARGS = {kwargs!r}\n"
            + ENTRY_POINT.format(call=call))
    compile(text, str(path), "exec")  # a bug of ours, not the learner's
    Path(path).write_text(text)
    return Path(path)


def _is_literal(value) -> bool:
    try:
        return ast.literal_eval(repr(value)) == value
    except (ValueError, SyntaxError, TypeError, RecursionError):
        return False


def _collect(obj, name, imports, definitions, seen) -> None:
    """Add what defines `name` (= obj) to imports or definitions."""
    if (id(obj), name) in seen:
        return
    seen.add((id(obj), name))
    if isinstance(obj, types.ModuleType):
        module = obj.__name__
        imports.append(f"import {module}" if module == name
                       else f"import {module} as {name}")
    elif not (callable(obj) and hasattr(obj, "__qualname__")):
        if not _is_literal(obj):
            raise TypeError(
                f"the notebook variable {name!r} (a {type(obj).__name__}) "
                "cannot be written into a script: create it inside the "
                "function, or in a function that it calls")
        definitions.append(f"{name} = {obj!r}")
    elif getattr(obj, "__name__", "") == "<lambda>":
        raise TypeError(f"{name} is a lambda: a script needs a named "
                        "function; write it with def")
    elif _importable(obj):
        as_name = "" if name == obj.__qualname__ else f" as {name}"
        imports.append(f"from {obj.__module__} import {obj.__qualname__}"
                       f"{as_name}")
    elif getattr(obj, "__closure__", None):
        raise TypeError(
            f"{obj.__name__} uses variables of the function it was defined "
            f"in ({', '.join(obj.__code__.co_freevars)}); a script has no "
            "such function around it. Define it at the top level of a cell "
            "and pass those values in args=")
    elif getattr(obj, "__module__", None) != "__main__":
        raise TypeError(f"{name} ({obj.__qualname__}) cannot be imported by "
                        "name in a script; define it at the top level")
    else:
        text = textwrap.dedent(_source_of(obj)).strip()
        for used_name, used in _globals_used(obj, ast.parse(text).body[0]):
            _collect(used, used_name, imports, definitions, seen)
        definitions.append(text)


def _importable(obj) -> bool:
    """Defined at the top level of a module other than the notebook's."""
    module = getattr(obj, "__module__", None)
    return module not in (None, "__main__") and obj.__qualname__.isidentifier()


def _source_of(obj) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        if not inspect.isclass(obj):
            raise
    # before Python 3.13 inspect cannot find a class defined in a notebook
    # cell; the cells' sources are in linecache, newest last
    for filename in reversed(list(linecache.cache)):
        lines = linecache.getlines(filename)
        try:
            tree = ast.parse("".join(lines))
        except (SyntaxError, ValueError):
            continue
        for node in reversed(tree.body):
            if isinstance(node, ast.ClassDef) and node.name == obj.__name__:
                first = min([node.lineno] +
                            [d.lineno for d in node.decorator_list])
                return "".join(lines[first - 1:node.end_lineno])
    raise TypeError(f"cannot find the source of the class {obj.__name__}")


def _globals_used(obj, node):
    """(name, value) of each notebook global that obj uses: read by its
    code when it runs (bytecode), or by its def or class statement
    (defaults, decorators, annotations, base classes)."""
    if inspect.isclass(obj):
        methods = [v for v in vars(obj).values() if inspect.isfunction(v)]
        namespace = (methods[0].__globals__ if methods
                     else vars(sys.modules[obj.__module__]))
    else:
        methods, namespace = [obj], obj.__globals__
    codes, names = [m.__code__ for m in methods], {}
    while codes:
        code = codes.pop()
        codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
        previous = None
        for ins in dis.get_instructions(code):
            if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                names.setdefault(ins.argval, set())
            elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and previous:
                names[previous].add(ins.argval)  # name.attribute
            previous = ins.argval if ins.opname in ("LOAD_GLOBAL",
                                                    "LOAD_NAME") else None
    for name in _statement_names(node):
        names.setdefault(name, set())
    for name, attributes in names.items():
        if name not in namespace:
            continue  # a builtin, or a class attribute
        value = namespace[name]
        yield name, value
        if isinstance(value, types.ModuleType):  # `dt.checkpoint.load`
            for attr in sorted(attributes):       # needs its submodule
                sub = sys.modules.get(f"{value.__name__}.{attr}")
                if isinstance(sub, types.ModuleType):
                    yield sub.__name__, sub


def _statement_names(node) -> set:
    """Names a def or class statement reads when it runs: everything but
    the bodies of the functions it defines."""
    names, stack = set(), [node]
    while stack:
        current = stack.pop()
        if isinstance(current, ast.Name) and isinstance(current.ctx, ast.Load):
            names.add(current.id)
        for child in ast.iter_child_nodes(current):
            if isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                    and child in current.body:
                continue
            if isinstance(current, ast.Lambda) and child is current.body:
                continue
            stack.append(child)
    return names
