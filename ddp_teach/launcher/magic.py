"""`%%ddp -n N`: run a cell's body on N ranks, like `%%px` for torch.distributed.

The body runs on every rank with `rank`, `world_size`, `torch` and `dist`
defined and the notebook's variables that it mentions available; the value of
its last expression comes back as a list, one entry per rank. The cell is
compiled under IPython's own cell file name, so a traceback from a rank shows
the learner's lines.
"""
import argparse
import ast
import shlex

from ddp_teach.launcher.launch import run

USAGE = ("%%ddp [-n WORLD_SIZE] [--timeout SECONDS] [--backend auto|gloo|nccl] "
         "[--trace] [--debug]")


class _OptionsParser(argparse.ArgumentParser):
    """argparse that raises instead of printing: a bad option becomes one
    ValueError naming what was wrong, followed by the usage, instead of
    argparse's usage on stderr plus a second one from the magic."""

    def error(self, message):
        raise ValueError(f"%%ddp: {message}\nusage: {USAGE}")


_PARSER = _OptionsParser(prog="%%ddp", usage=USAGE, add_help=False)
_PARSER.add_argument("-n", "--world-size", type=int, default=2)
_PARSER.add_argument("--timeout", type=float, default=60.0)
_PARSER.add_argument("--backend", default="auto")
_PARSER.add_argument("--trace", action="store_true")
_PARSER.add_argument("--debug", action="store_true")


def split_last_expression(source: str):
    """(statements, last expression or None) of a cell, as code objects' AST."""
    tree = ast.parse(source)
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
        return tree, last
    return tree, None


def run_cell_on_ranks(rank, world_size, filename, source, names):
    """What each rank runs: the cell body in a namespace of its own."""
    import torch
    import torch.distributed as dist
    namespace = dict(names, rank=rank, world_size=world_size, torch=torch,
                     dist=dist, __name__="__ddp_cell__")
    body, last = split_last_expression(source)
    exec(compile(body, filename, "exec"), namespace)
    if last is not None:
        return eval(compile(last, filename, "eval"), namespace)
    return None


def _used_names(source: str, user_ns: dict) -> dict:
    """The notebook variables the cell mentions (only those are sent)."""
    mentioned = {node.id for node in ast.walk(ast.parse(source))
                 if isinstance(node, ast.Name)}
    return {name: user_ns[name] for name in mentioned
            if name in user_ns and not name.startswith("_")}


def register(ipython) -> None:
    def ddp(line, cell):
        options = _PARSER.parse_args(shlex.split(line))
        cell = "\n" + cell  # line numbers count the %%ddp line, as the learner sees
        ast.parse(cell)  # a syntax error is shown here, not from every rank
        filename = ipython.compile.cache(cell)  # makes tracebacks show the cell
        names = _used_names(cell, ipython.user_ns)
        return run(run_cell_on_ranks, options.world_size,
                   args=(filename, cell, names), timeout=options.timeout,
                   backend=options.backend, trace=options.trace,
                   debug=options.debug)

    ipython.register_magic_function(ddp, magic_kind="cell", magic_name="ddp")
