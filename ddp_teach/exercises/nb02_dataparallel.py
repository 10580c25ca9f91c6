"""Checker for notebook 02's scatter exercise, and the helpers the other
data-moving exercises' checkers share (gather, replicate).

DataParallel is one process with a thread per device, so these checkers run
the learner's function right here (no worker processes), on CPU "virtual
devices", against `ddp_teach.dp`. Each checker tests, in order, the
properties that the reference guarantees (listed in its docstring) and stops
at the first one that fails, with a hint that names the mistake which breaks
it, or, where it cannot tell which, the property and how to see it. Whatever
the learner's function returns, the checker itself never raises: an odd
return value is a wrong answer that says what came back.

`nb02_gather`, `nb02_replicate` and `nb02_threads` (parallel_apply and
the forward of DataParallel) check the other exercises with the helpers
below.
"""
import torch

from ddp_teach.exercises.cases import container_cases
from ddp_teach.exercises.difference import first_difference
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, TODO_MESSAGE,
                                         WRONG, Exercise, Verdict, register)

# the calls that cut a tensor off its autograd graph, for hints
CUT_GRAPH = ".detach(), .data, torch.tensor(...) or .clone().detach()"
NAMEDTUPLE_HINT = ("a namedtuple (a tuple with field names, as a batch often "
                   "is) is built from its fields one by one: "
                   "type(obj)(*items) (or type(obj)._make(items)), not "
                   "type(obj)(items); test for it "
                   "with hasattr(obj, '_fields').")


def run_here(call, error_hints=()):
    """(result, None), or (None, Verdict) when the learner's function is
    still a stub or raised; error_hints: (text in the error, hint) pairs."""
    try:
        return call(), None
    except NotImplementedError:
        return None, Verdict(NOT_ATTEMPTED, TODO_MESSAGE)
    except Exception as exc:  # the learner's bug: reported, not raised
        first_paragraph = str(exc).split("\n\n")[0]  # not a traceback it quotes
        message = f"your function raised {type(exc).__name__}: {first_paragraph}"
        said = f"{exc} {exc.__cause__ or ''} {exc.__context__ or ''}"
        hint = next((h for text, h in error_hints if text in said), None)
        return None, Verdict(WRONG, message + (f"\nHint: {hint}" if hint else ""))


def same(a, b) -> bool:
    """Equal values in the same structure: tensors exactly equal (scatter
    and gather copy, they do not compute), containers of the same type."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.shape == b.shape and a.dtype == b.dtype
                and torch.equal(a, b))
    if isinstance(a, dict) or isinstance(b, dict):
        return (type(a) is type(b) and a.keys() == b.keys()
                and all(same(a[k], b[k]) for k in a))
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (type(a) is type(b) and len(a) == len(b)
                and all(same(x, y) for x, y in zip(a, b)))
    try:
        return bool(a is b or a == b)
    except Exception:  # an object whose == does not give a truth value
        return False


def describe(obj) -> str:
    """Shapes and structure, for messages: "(tensor(4, 2), {'y': tensor(4)})"."""
    if isinstance(obj, torch.Tensor):
        return f"tensor{tuple(obj.shape)}"
    if isinstance(obj, dict):
        return "{" + ", ".join(f"{k!r}: {describe(v)}" for k, v in obj.items()) + "}"
    if isinstance(obj, (list, tuple)):
        inner = ", ".join(describe(x) for x in obj)
        return f"({inner})" if isinstance(obj, tuple) else f"[{inner}]"
    text = repr(obj)
    return text if len(text) <= 60 else text[:57] + "..."


def leaves(obj) -> list:
    """The tensors in a structure, in order (keys in their order)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in leaves(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in leaves(v)]
    return []


def first_value_off(got, want) -> str:
    """"\n  first difference: tensor 2 ... expected 4, got 5" when `got`
    holds as many tensors as `want` with the same shapes, so that only
    values can differ; "" otherwise (the shapes above say it)."""
    mine, theirs = leaves(got), leaves(want)
    if len(mine) != len(theirs) or any(
            a.shape != b.shape for a, b in zip(mine, theirs)) or any(
            a.device.type == "meta" for a in mine):
        return ""
    differ = first_difference([t.detach() for t in mine],
                              [t.detach() for t in theirs], atol=0, rtol=0)
    return f"\n  first difference: {differ}" if differ else ""


def values(obj, most: int = 8) -> str:
    """A tensor's first values, for messages where shapes alone look alike."""
    if not isinstance(obj, torch.Tensor):
        return describe(obj)
    flat = obj.detach().flatten()
    shown = ", ".join(f"{v:g}" for v in flat[:most].tolist())
    return f"[{shown}{', ...' if flat.numel() > most else ''}]"


def rows(tensor) -> int | None:
    """Length of dim 0, or None for what has none (a 0-dim tensor, no tensor)."""
    return len(tensor) if isinstance(tensor, torch.Tensor) and tensor.dim() else None


# ---------------------------------------------------------------- scatter

def check_scatter(fn) -> Verdict:
    """dt.dp.scatter guarantees, for a tensor or any nesting of tuples,
    lists and dicts over n devices:

    1. pieces: a list of tensor.chunk(n, dim=0)'s pieces, in order, so
       ceil(rows / n) rows each (10 on 3: 4, 4, 2; 9 on 4: 3, 3, 3), for
       1-D and 2-D batches, contiguous or not;
    2. no empty piece: fewer rows than devices give fewer pieces, and one
       device gives the whole batch as one piece;
    3. structure: a tuple (namedtuples too), list or dict comes back as
       one of the same type (same keys) per piece, and non-tensors go to
       every piece unchanged;
    4. gradient flow: the pieces stay in the input's autograd graph, so a
       DataParallel wrapping a layer inside a model passes the gradient on;
    5. devices: piece d is on devices[d], checked with ["cpu", "meta"]
       (meta: shapes without values), nested containers included.

    Properties 1 to 3 are tried on `cases.container_cases()`, smallest
    first, so a verdict shows the smallest input that fails, with the
    first value that differs when the shapes agree.
    """
    from ddp_teach import dp
    for case in container_cases():
        inputs, n = case.build(), case.devices
        devices = ["cpu"] * n
        got, failed = run_here(lambda: fn(inputs, devices), [
            ("attribute 'chunk'", "inputs may be a tuple, list or dict: keep "
             "the container and split only the tensors inside it."),
            ("attribute 'split'", "inputs may be a tuple, list or dict: keep "
             "the container and split only the tensors inside it."),
            ("required positional argument", NAMEDTUPLE_HINT)])
        if failed:
            return Verdict(failed.status, f"scattering {case.describe()}: "
                           f"{failed.message}") if failed.status == WRONG else failed
        want = dp.scatter(inputs, devices)
        if isinstance(got, (list, tuple)) and same(list(got), want):
            continue
        shown = (f"scattering {case.describe()}:\n  expected {len(want)} "
                 f"pieces {describe(want)}\n  got {describe(got)}"
                 f"{first_value_off(got, want)}")
        return Verdict(WRONG, f"{shown}\nHint: {_scatter_hint(got, want, inputs, n)}")
    return _scatter_on_the_devices(fn) or _scatter_keeps_the_graph(fn)


def _scatter_on_the_devices(fn) -> Verdict | None:
    """Property 5: each piece on its own device (cpu, then meta)."""
    batch = torch.arange(20.0).reshape(10, 2)
    inputs = (batch, {"mask": batch[:, 0] > 4})
    got, failed = run_here(lambda: fn(inputs, ["cpu", "meta"]))
    if failed:
        return failed
    try:
        where = [[piece[0].device.type, piece[1]["mask"].device.type]
                 for piece in got]
    except (TypeError, KeyError, IndexError, AttributeError):
        where = None
    if where == [["cpu", "cpu"], ["meta", "meta"]]:
        return None
    return Verdict(WRONG, f"scattering {describe(inputs)} over devices [\"cpu\", "
                   f"\"meta\"]: piece d must be on devices[d], got {describe(got)}"
                   f" on {where}.\nHint: move each piece to its device, "
                   "piece.to(device), at every level of the structure.")


def _scatter_hint(got, want, inputs, n) -> str:
    if same(got, _split_in_place(inputs, n)):
        return ("regroup the pieces: you returned one container holding each "
                "element's pieces; scatter returns a list with one entry per "
                "device, and entry d holds the d-th piece of every element.")
    if not isinstance(got, (list, tuple)):
        return "return a list with one entry per piece."
    if isinstance(inputs, torch.Tensor):
        sizes = [rows(p) for p in got]
        if None in sizes:
            return "each piece of a tensor is a tensor: the rows for that device."
        if same(list(got), [p for p in (inputs[i::n] for i in range(n)) if len(p)]):
            return ("piece i holds consecutive rows, a slice of the batch as "
                    "tensor.chunk cuts it, not every n-th row (x[i::n]).")
        empty = ("a batch that chunk cuts into fewer pieces than devices "
                 "gives fewer pieces: do not make empty ones.")
        if sizes == [len(p) for p in inputs.tensor_split(n)] != [len(p) for p in want]:
            # on a batch with fewer rows than devices, tensor_split's pieces
            # are chunk's plus empty ones: both mistakes look alike there
            return (empty + " " if 0 in sizes else "") + (
                "torch splits with tensor.chunk: ceil(rows / n) rows per "
                "piece (10 on 3 devices is 4, 4, 2; 9 on 4 is 3, 3, 3), "
                "not tensor_split, which always makes n pieces.")
        if sizes == [len(p) for p in inputs.split(n)]:
            return ("torch.split(x, k) cuts pieces of k rows each; "
                    "tensor.chunk(k) cuts k pieces. Use chunk(len(devices)).")
        if 0 in sizes or len(got) > len(want):
            return empty
        if len(got) == len(want) and all(
                isinstance(p, torch.Tensor) and p.shape == w.shape
                for p, w in zip(got, want)):
            return "keep the rows in order: piece i holds chunk i of the batch."
        if any(isinstance(p, torch.Tensor) and p.dim() > 1 and rows(p) == len(inputs)
               for p in got):
            return ("split along dimension 0 (the batch), not along the "
                    "features: chunk(len(devices), dim=0).")
        return "split along dim 0 with tensor.chunk(len(devices)), then .to(device)."
    if got and want and hasattr(want[0], "_fields") and \
            type(got[0]) is not type(want[0]):
        return (f"each piece of a namedtuple {type(want[0]).__name__} must be "
                f"one again (got a {type(got[0]).__name__}): {NAMEDTUPLE_HINT}")
    if got and want and type(got[0]) is not type(want[0]):
        return (f"each piece of a {type(inputs).__name__} must be a "
                f"{type(want[0]).__name__} again (got a "
                f"{type(got[0]).__name__}): build it with type(obj)(...).")
    return ("scatter each element and keep the container: piece i of a "
            "tuple is a tuple of the elements' pieces i, a dict stays a "
            "dict with the same keys, and non-tensors (like 2.0 or 'tag') "
            "go to every device unchanged.")


def _split_in_place(obj, n):
    """Each tensor in obj replaced by the list of its chunks, containers
    kept: a scatter that forgot to regroup the pieces by device."""
    if isinstance(obj, torch.Tensor):
        return list(obj.chunk(n))
    if isinstance(obj, dict):
        return type(obj)((k, _split_in_place(v, n)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_split_in_place(v, n) for v in obj)
    return obj


def _scatter_keeps_the_graph(fn) -> Verdict:
    """Property 4: the input's gradient is the pieces' gradients, joined."""
    batch = torch.arange(20.0).reshape(10, 2).requires_grad_()
    pieces, failed = run_here(lambda: fn(batch, ["cpu"] * 3))
    if failed:
        return failed
    if not (isinstance(pieces, (list, tuple)) and [rows(p) for p in pieces] == [4, 4, 2]):
        return Verdict(WRONG, f"scattering a tensor(10, 2) that requires grad "
                       f"over 3 devices gave {describe(pieces)}, not 3 pieces "
                       f"of 4, 4 and 2 rows.\nHint: treat it as any other tensor.")
    if not all(p.requires_grad for p in pieces):
        return Verdict(WRONG, "the pieces of an input that requires grad do "
                       "not (requires_grad is False): they are cut off from "
                       "its autograd graph, so no gradient reaches the input."
                       f"\nHint: any of {CUT_GRAPH} cuts the graph. DataParallel may "
                       "wrap a layer in the middle of a model, whose input "
                       "needs its gradient: chunk and .to(device) keep it.")
    weights = [float(i + 1) for i in range(len(pieces))]
    _, failed = run_here(lambda: torch.autograd.backward(
        [p * w for p, w in zip(pieces, weights)], [torch.ones_like(p) for p in pieces]))
    if failed:
        return Verdict(WRONG, f"backward through the pieces failed: {failed.message}")
    want = torch.cat([torch.full_like(p, w) for p, w in zip(pieces, weights)])
    if not same(batch.grad, want):
        return Verdict(WRONG, "the gradients of the pieces did not come back "
                       "to the rows they were cut from.\nHint: cut with "
                       "chunk (views of the batch), not with a copy.")
    return Verdict(CORRECT, "1-D, 2-D and non-contiguous batches of 1 to 13 "
                   "rows on 1 to 5 devices (7 and 13 rows: not divisible), "
                   "fewer rows than devices, nested tuples, lists, dicts and "
                   "namedtuples, pieces on their devices, and the gradient "
                   "flows back to the input.")


register(Exercise(
    "dp_scatter", "scatter", "my_scatter", "ddp_teach.dp:scatter", check_scatter,
    ["Split with tensor.chunk(len(devices), dim=0).",
     "Recurse into tuples, lists and dicts; pass other objects to every "
     "device unchanged."]))
