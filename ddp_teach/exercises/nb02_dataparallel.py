"""Checkers for notebook 02's data-moving exercises: scatter, gather, replicate.

DataParallel is one process with a thread per device, so these checkers run
the learner's function right here (no worker processes), on CPU "virtual
devices", against `ddp_teach.dp`. Each checker tests, in order, the
properties that the reference guarantees (listed in its docstring) and stops
at the first one that fails, with a hint that names the mistake which breaks
it, or, where it cannot tell which, the property and how to see it. Whatever
the learner's function returns, the checker itself never raises: an odd
return value is a wrong answer that says what came back.

`nb02_replicate` and `nb02_threads` (parallel_apply and the forward of
DataParallel) check the other exercises with the helpers below.
"""
import torch

from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, TODO_MESSAGE,
                                         WRONG, Exercise, Verdict, register)

# the calls that cut a tensor off its autograd graph, for hints
CUT_GRAPH = ".detach(), .data, torch.tensor(...) or .clone().detach()"


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

def _scatter_cases():
    """(inputs, device count): uneven, more devices than a chunk fills,
    fewer rows than devices, one device, nested containers."""
    batch = torch.arange(20.0).reshape(10, 2)
    mask = torch.arange(10) % 2 == 0
    return [(batch, 3), (batch, 4), (batch[:9], 4), (batch[:2], 3), (batch, 1),
            ((batch, {"mask": mask, "scale": 2.0}, "tag"), 3), ([batch, mask], 2)]


def check_scatter(fn) -> Verdict:
    """dt.dp.scatter guarantees, for a tensor or any nesting of tuples,
    lists and dicts over n devices:

    1. pieces: a list of tensor.chunk(n, dim=0)'s pieces, in order, so
       ceil(rows / n) rows each (10 on 3: 4, 4, 2; 9 on 4: 3, 3, 3);
    2. no empty piece: fewer rows than devices give fewer pieces, and one
       device gives the whole batch as one piece;
    3. structure: a tuple, list or dict comes back as one of the same type
       (same keys) per piece, and non-tensors go to every piece unchanged;
    4. gradient flow: the pieces stay in the input's autograd graph, so a
       DataParallel wrapping a layer inside a model passes the gradient on.
    """
    from ddp_teach import dp
    for inputs, n in _scatter_cases():
        devices = ["cpu"] * n
        got, failed = run_here(lambda: fn(inputs, devices), [
            ("attribute 'chunk'", "inputs may be a tuple, list or dict: keep "
             "the container and split only the tensors inside it."),
            ("attribute 'split'", "inputs may be a tuple, list or dict: keep "
             "the container and split only the tensors inside it.")])
        if failed:
            return failed
        want = dp.scatter(inputs, devices)
        if isinstance(got, (list, tuple)) and same(list(got), want):
            continue
        shown = (f"scattering {describe(inputs)} over {n} devices: expected "
                 f"{len(want)} pieces {describe(want)}, got {describe(got)}.")
        return Verdict(WRONG, f"{shown}\nHint: {_scatter_hint(got, want, inputs, n)}")
    return _scatter_keeps_the_graph(fn)


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
        if sizes == [len(p) for p in inputs.tensor_split(n)] != [len(p) for p in want]:
            return ("torch splits with tensor.chunk: ceil(rows / n) rows per "
                    "piece (10 on 3 devices is 4, 4, 2; 9 on 4 is 3, 3, 3), "
                    "not tensor_split.")
        if sizes == [len(p) for p in inputs.split(n)]:
            return ("torch.split(x, k) cuts pieces of k rows each; "
                    "tensor.chunk(k) cuts k pieces. Use chunk(len(devices)).")
        if 0 in sizes or len(got) > len(want):
            return ("a batch that chunk cuts into fewer pieces than devices "
                    "gives fewer pieces: do not make empty ones.")
        if len(got) == len(want) and all(
                isinstance(p, torch.Tensor) and p.shape == w.shape
                for p, w in zip(got, want)):
            return "keep the rows in order: piece i holds chunk i of the batch."
        if any(isinstance(p, torch.Tensor) and p.dim() > 1 and rows(p) == len(inputs)
               for p in got):
            return ("split along dimension 0 (the batch), not along the "
                    "features: chunk(len(devices), dim=0).")
        return "split along dim 0 with tensor.chunk(len(devices)), then .to(device)."
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
    return Verdict(CORRECT, "uneven batches, fewer rows than devices, one "
                   "device, nested tuples, lists and dicts, and the gradient "
                   "flows back to the input.")


# ----------------------------------------------------------------- gather

def check_gather(fn) -> Verdict:
    """dt.dp.gather guarantees, for one output per device:

    1. values: the tensors joined along dim 0 (torch.cat), in device order,
       for uneven pieces and for one device;
    2. structure: tuples, lists and dicts are gathered element by element
       and keep their type and keys;
    3. gradient flow: the result's gradient is cut back into the pieces' (a
       gather that detaches lets DataParallel train with no gradient).
    """
    from ddp_teach import dp
    batch = torch.arange(30.0).reshape(10, 3)
    for inputs, n in ((batch, 3), (batch, 1), ((batch, {"y": batch[:, 0]}), 4),
                      ([batch, batch[:, :1]], 2)):
        pieces = dp.scatter(inputs, ["cpu"] * n)
        got, failed = run_here(lambda: fn(pieces, "cpu"), [
            ("stack expects", "torch.stack adds a dimension (and needs equal "
             "sizes); torch.cat(pieces, dim=0) joins the batch back."),
            ("must match except in dimension 0", "torch.vstack (and "
             "row_stack) turn each 1-D tensor into a row, adding a dimension: "
             "join with torch.cat(pieces, dim=0)."),
            ("must match except in dimension", "join along dimension 0 (the "
             "batch): torch.cat(pieces, dim=0)."),
            ("only one element tensors can be converted", "torch.tensor(...) "
             "builds a new tensor from Python numbers: it cannot join "
             "tensors, and would cut the graph. Join them with "
             "torch.cat(pieces, dim=0)."),
            ("must match the size of tensor", "gather joins the rows of the "
             "pieces, it does not add them (adding is what the gradients' "
             "reduce does): torch.cat(pieces, dim=0).")])
        if failed:
            return failed
        if same(got, inputs):
            continue
        shown = (f"gathering {describe(pieces)}: expected {describe(inputs)}, "
                 f"got {describe(got)}.\nHint: ")
        return Verdict(WRONG, shown + _gather_hint(got, inputs, pieces, n))
    return _gather_keeps_the_graph(fn)


def _gather_hint(got, inputs, pieces, n) -> str:
    if isinstance(got, torch.Tensor) and isinstance(inputs, torch.Tensor):
        if got.dim() == inputs.dim() + 1:
            return ("torch.stack adds a dimension; torch.cat(pieces, dim=0) "
                    "joins the batch back.")
        if n > 1 and same(got, torch.cat(pieces[::-1])):
            return "keep the devices' order."
        if got.shape != inputs.shape and got.dim() == inputs.dim() \
                and rows(got) == rows(pieces[0]):
            return "join along dimension 0 (the batch): torch.cat(pieces, dim=0)."
        return f"the values differ: expected {values(inputs)}, got {values(got)}."
    if isinstance(got, list) and len(got) == n > 1 and not isinstance(inputs, list):
        return "return one tensor (or one structure), not a list of pieces."
    if type(got) is not type(inputs):
        return (f"each device's output is a {type(inputs).__name__}, so the "
                f"gathered one is a {type(inputs).__name__} too (got a "
                f"{type(got).__name__}): build it with type(first)(...).")
    return ("gather element by element: a tuple of outputs gives a tuple of "
            "gathered tensors, a dict a dict with the same keys.")


def _gather_keeps_the_graph(fn) -> Verdict:
    """Property 3: backward through the result reaches every piece."""
    pieces = [torch.full((rows_, 2), float(i)).requires_grad_()
              for i, rows_ in enumerate((4, 4, 2))]
    joined, failed = run_here(lambda: fn(pieces, "cpu"))
    if failed:
        return failed
    if not (isinstance(joined, torch.Tensor) and joined.shape == (10, 2)):
        return Verdict(WRONG, f"gathering 3 pieces that require grad gave "
                       f"{describe(joined)}, not tensor(10, 2).\nHint: treat "
                       f"them as any other tensors.")
    if not joined.requires_grad:
        return Verdict(WRONG, "the gathered output does not require grad "
                       "although its pieces do: it is cut off from them, so "
                       "DataParallel would train with no gradient at all.\n"
                       f"Hint: any of {CUT_GRAPH} cuts the graph; torch.cat and "
                       ".to(target) keep it.")
    _, failed = run_here(
        lambda: (joined * torch.arange(1.0, 11.0).unsqueeze(1)).sum().backward())
    if failed:
        return Verdict(WRONG, f"backward through the gathered output failed: "
                       f"{failed.message}")
    want = torch.arange(1.0, 11.0).unsqueeze(1).expand(10, 2).split([4, 4, 2])
    if not all(p.grad is not None and torch.equal(p.grad, w)
               for p, w in zip(pieces, want)):
        return Verdict(WRONG, "backward through the gathered output did not "
                       "give each piece the gradient of its own rows.\nHint: "
                       "join with torch.cat in device order.")
    return Verdict(CORRECT, "tensors from 1, 2, 3 and 4 devices, a tuple "
                   "holding a dict, a list, and the gradient flows back to "
                   "every piece.")


register(Exercise(
    "dp_scatter", "scatter", "my_scatter", "ddp_teach.dp:scatter", check_scatter,
    ["Split with tensor.chunk(len(devices), dim=0).",
     "Recurse into tuples, lists and dicts; pass other objects to every "
     "device unchanged."]))
register(Exercise(
    "dp_gather", "gather", "my_gather", "ddp_teach.dp:gather", check_gather,
    ["torch.cat(pieces, dim=0) on the target device.",
     "Recurse: gather element i of every device's tuple together."]))
