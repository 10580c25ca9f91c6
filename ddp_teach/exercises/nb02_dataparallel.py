"""Checkers for notebook 02's exercises: DataParallel's four primitives.

DataParallel is one process with a thread per device, so these checkers run
the learner's function right here (no worker processes), on CPU "virtual
devices", against `ddp_teach.dp`. As in `nb01_collectives`, a wrong answer is
compared with what each typical mistake would produce so that the hint names
it: tensor_split instead of chunk, a dict turned into a tuple, stack instead
of cat, deepcopy (which cuts the gradient's path back), replicas that are the
same object, tied weights untied, a loop instead of threads, an exception
lost inside a thread.
"""
import threading

import torch

from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, TODO_MESSAGE,
                                         WRONG, Exercise, Verdict, register)

DEVICE_COUNTS = (1, 2, 3, 4)


def _same(a, b) -> bool:
    """Equal values in the same structure (tuples, lists, dicts, tensors)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.shape == b.shape and torch.allclose(a, b))
    if isinstance(a, dict) or isinstance(b, dict):
        return (type(a) is type(b) and a.keys() == b.keys()
                and all(_same(a[k], b[k]) for k in a))
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (type(a) is type(b) and len(a) == len(b)
                and all(_same(x, y) for x, y in zip(a, b)))
    return a is b or a == b


def _attempt(call, error_hints=()):
    """(result, None), or (None, Verdict) when not attempted or when the
    learner's code raised; error_hints: (text in the error, hint) pairs."""
    try:
        return call(), None
    except NotImplementedError:
        return None, Verdict(NOT_ATTEMPTED, TODO_MESSAGE)
    except Exception as exc:  # the learner's bug, reported, not raised
        message = f"your function raised {type(exc).__name__}: {exc}"
        hint = next((h for text, h in error_hints if text in str(exc)), None)
        return None, Verdict(WRONG, message + (f"\nHint: {hint}" if hint else ""))


def _scatter_cases():
    batch = torch.arange(20.0).reshape(10, 2)
    mask = torch.arange(10) % 2 == 0
    return [(batch, 3), (batch, 4), (batch[:2], 3),
            ((batch, {"mask": mask, "scale": 2.0}, "tag"), 3),
            ([batch, mask], 2)]


def check_scatter(fn) -> Verdict:
    from ddp_teach import dp
    for inputs, n in _scatter_cases():
        devices = ["cpu"] * n
        got, not_yet = _attempt(lambda: fn(inputs, devices), [(
            "attribute 'chunk'", "inputs may be a tuple, list or dict: keep "
            "the container and split only the tensors inside it.")])
        if not_yet:
            return not_yet
        want = dp.scatter(inputs, devices)
        if _same(list(got) if isinstance(got, tuple) else got, want):
            continue
        shown = f"scattering {_describe(inputs)} over {n} devices"
        return Verdict(WRONG, f"{shown}: expected {len(want)} pieces "
                              f"{_describe(want)}, got {_describe(got)}.\n"
                              f"Hint: {_scatter_hint(got, want, inputs, n)}")
    return Verdict(CORRECT, "tensors, uneven batches, a batch smaller than the "
                            "device count, and nested tuples, lists and dicts.")


def _scatter_hint(got, want, inputs, n) -> str:
    if isinstance(inputs, torch.Tensor) and isinstance(got, (list, tuple)):
        sizes = [len(p) for p in got if isinstance(p, torch.Tensor)]
        if len(got) > len(want) and 0 in sizes:
            return ("a batch smaller than the number of devices gives fewer "
                    "pieces (tensor.chunk): do not make empty ones.")
        if sizes == [len(p) for p in inputs.tensor_split(n)]:
            return ("torch splits with tensor.chunk: ceil(batch / n) rows per "
                    "piece (10 on 3 devices is 4, 4, 2), not tensor_split.")
    if isinstance(inputs, (tuple, list)):
        return ("scatter each element and keep the container: piece i of a "
                "tuple is a tuple of the elements' pieces i, a dict stays a "
                "dict with the same keys, and non-tensors (like 2.0 or 'tag') "
                "go to every device unchanged.")
    return "split along dim 0 with tensor.chunk(len(devices)), then .to(device)."


def _describe(obj) -> str:
    if isinstance(obj, torch.Tensor):
        return f"tensor{tuple(obj.shape)}"
    if isinstance(obj, dict):
        return "{" + ", ".join(f"{k!r}: {_describe(v)}" for k, v in obj.items()) + "}"
    if isinstance(obj, (list, tuple)):
        inner = ", ".join(_describe(x) for x in obj)
        return f"({inner})" if isinstance(obj, tuple) else f"[{inner}]"
    return repr(obj)


def check_gather(fn) -> Verdict:
    from ddp_teach import dp
    batch = torch.arange(30.0).reshape(10, 3)
    for inputs, n in ((batch, 3), (batch, 1), ((batch, {"y": batch[:, 0]}), 4)):
        pieces = dp.scatter(inputs, ["cpu"] * n)
        got, not_yet = _attempt(lambda: fn(pieces, "cpu"), [(
            "stack expects", "torch.stack adds a dimension (and needs equal "
            "sizes); torch.cat(pieces, dim=0) joins the batch back.")])
        if not_yet:
            return not_yet
        if _same(got, inputs):
            continue
        shown = (f"gathering {_describe(pieces)}: expected {_describe(inputs)}, "
                 f"got {_describe(got)}.\nHint: ")
        if isinstance(got, torch.Tensor) and got.dim() == batch.dim() + 1:
            return Verdict(WRONG, shown + "torch.stack adds a dimension; "
                           "torch.cat(pieces, dim=0) joins the batch back.")
        reversed_order = (torch.cat(pieces[::-1]) if n > 1 and
                          isinstance(inputs, torch.Tensor) else None)
        if reversed_order is not None and _same(got, reversed_order):
            return Verdict(WRONG, shown + "keep the devices' order.")
        if isinstance(got, list) and n > 1 and not isinstance(inputs, list):
            return Verdict(WRONG, shown + "return one tensor (or one "
                           "structure), not a list of pieces.")
        return Verdict(WRONG, shown + "gather element by element: a tuple of "
                       "outputs gives a tuple of gathered tensors, a dict a dict.")
    return Verdict(CORRECT, "tensors from 1 and 3 devices and a tuple holding a dict.")


class _Tied(torch.nn.Module):
    """Two layers sharing one weight, and a buffer: replicate's traps."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.first = torch.nn.Linear(4, 4)
        self.second = torch.nn.Linear(4, 4)
        self.second.weight = self.first.weight
        self.register_buffer("offset", torch.full((4,), 0.5))

    def forward(self, x):
        return self.second(torch.relu(self.first(x))) + self.offset


def check_replicate(fn) -> Verdict:
    module, x = _Tied(), torch.randn(6, 4)
    replicas, not_yet = _attempt(lambda: fn(module, ["cpu"] * 3))
    if not_yet:
        return not_yet
    if not isinstance(replicas, (list, tuple)) or len(replicas) != 3:
        return Verdict(WRONG, "return a list with one replica per device.")
    if any(r is module for r in replicas) or replicas[0] is replicas[1]:
        return Verdict(WRONG, "the replicas are the original (or each other): "
                       "each device needs a copy of its own.\nHint: build a "
                       "new module object per device (dt.dp.replicate's idea).")
    expected = module(x).sum()
    expected.backward()
    want = module.first.weight.grad.clone()
    module.zero_grad()
    replicas[1](x).sum().backward()
    got = module.first.weight.grad
    if got is None or not torch.allclose(got, want):
        return Verdict(WRONG, "backward through a replica did not put the "
                       "right gradient into the ORIGINAL module's .grad.\n"
                       "Hint: copy.deepcopy makes new leaf parameters, so the "
                       "gradient stops at them. Give each replica param.clone()"
                       " (a differentiable copy) instead, as torch's Broadcast "
                       "does, so autograd sums every replica's gradient back.")
    if replicas[1].first.weight is not replicas[1].second.weight:
        return Verdict(WRONG, "the tied weight (first.weight is second.weight) "
                       "became two tensors in the replica.\nHint: copy each "
                       "parameter once, memoised by id(param), and reuse it.")
    replicas[2].offset.add_(1)
    if module.offset[0] != 0.5:
        return Verdict(WRONG, "changing a replica's buffer changed the "
                       "original's.\nHint: copy buffers too (detach().clone()).")
    return Verdict(CORRECT, "3 replicas; gradients reach the original; tied "
                            "weights stay tied; buffers are copies.")


class _Recorder(torch.nn.Module):
    """Doubles its input and notes which thread ran it; fails on `bad` rows."""

    # the threads that ran forward, kept alive so that none is mistaken for
    # another (a finished thread's ident may be reused by the next one)
    seen: list[threading.Thread] = []

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(2.0))

    def forward(self, x):
        _Recorder.seen.append(threading.current_thread())
        if (x == -1).any():
            raise ValueError("this replica got a bad row")
        return x * self.scale


def check_parallel_apply(fn) -> Verdict:
    from ddp_teach import dp
    devices = ["cpu"] * 3
    module, batch = _Recorder(), torch.arange(9.0).reshape(9, 1)
    replicas, pieces = dp.replicate(module, devices), dp.scatter(batch, devices)
    _Recorder.seen.clear()
    outputs, not_yet = _attempt(lambda: fn(replicas, pieces, devices))
    if not_yet:
        return not_yet
    want = [p * 2 for p in pieces]
    if not isinstance(outputs, (list, tuple)) or not _same(list(outputs), want):
        hint = ("store each output at its replica's index, not in the order "
                "threads finish." if isinstance(outputs, (list, tuple)) and
                len(outputs) == 3 else "return a list: replica i's output at i.")
        return Verdict(WRONG, f"expected {_describe(want)} in replica order, "
                       f"got {_describe(outputs)}.\nHint: {hint}")
    if len({id(thread) for thread in _Recorder.seen}) < len(devices):
        return Verdict(WRONG, "all replicas ran in one thread, one after the "
                       "other.\nHint: start a threading.Thread per replica, "
                       "then join() them all: that is the 'parallel'.")
    bad = [p.clone() for p in pieces]
    bad[1][0] = -1
    try:
        fn(replicas, bad, devices)
    except Exception as exc:  # the learner's own error type: any will do
        text = f"{exc} {exc.__cause__ or ''}"
        if "bad row" in text and ("replica 1" in text or "cpu:1" in text
                                  or "device 1" in text):
            return Verdict(CORRECT, "outputs in order, one thread per replica, "
                                    "and a failing replica is named.")
        return Verdict(WRONG, f"replica 1 failed and your function raised "
                       f"{type(exc).__name__}: {exc}\nHint: say which replica "
                       "(or device) failed and keep the original message.")
    return Verdict(WRONG, "replica 1 raised an error inside its thread, but "
                   "your function returned normally.\nHint: an exception in a "
                   "thread is lost unless you catch it there, keep it, and "
                   "raise it again in the caller after join().")


def check_data_parallel(fn) -> Verdict:
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(),
                                 torch.nn.Linear(5, 1))
    batch = torch.randn(10, 3)
    module(batch).square().mean().backward()
    want = [p.grad.clone() for p in module.parameters()]
    for n in DEVICE_COUNTS:
        module.zero_grad()
        out, not_yet = _attempt(lambda: fn(module, batch, ["cpu"] * n))
        if not_yet:
            return not_yet
        if not isinstance(out, torch.Tensor) or out.shape != (10, 1):
            return Verdict(WRONG, f"on {n} devices the output is "
                           f"{_describe(out)}, expected tensor(10, 1).\nHint: "
                           "gather the replicas' outputs back into one batch.")
        if not torch.allclose(out, module(batch)):
            return Verdict(WRONG, f"on {n} devices the output differs from "
                           "module(batch).\nHint: every row of the batch must "
                           "go through exactly one replica.")
        out.square().mean().backward()
        got = [p.grad for p in module.parameters()]
        if any(g is None or not torch.allclose(g, w) for g, w in zip(got, want)):
            return Verdict(WRONG, f"on {n} devices the gradients differ from a "
                           "single-device run of the whole batch.\nHint: make "
                           "the replicas with replicate (differentiable copies),"
                           " so that every replica's gradient flows back.")
    return Verdict(CORRECT, f"outputs and gradients equal a full-batch run on "
                            f"{DEVICE_COUNTS} devices, batch 10 (uneven pieces).")


register(Exercise(
    "dp_scatter", "scatter", "my_scatter", "ddp_teach.dp:scatter", check_scatter,
    ["Split with tensor.chunk(len(devices), dim=0).",
     "Recurse into tuples, lists and dicts; pass other objects to every "
     "device unchanged."]))
register(Exercise(
    "dp_gather", "gather", "my_gather", "ddp_teach.dp:gather", check_gather,
    ["torch.cat(pieces, dim=0) on the target device.",
     "Recurse: gather element i of every device's tuple together."]))
register(Exercise(
    "dp_replicate", "replicate", "my_replicate", "ddp_teach.dp:replicate",
    check_replicate,
    ["Copy the module object per device, but not its parameters with "
     "deepcopy: give it param.clone().",
     "Memoise the clones by id(param) so tied weights stay tied; clone "
     "buffers with detach().clone()."]))
register(Exercise(
    "dp_parallel_apply", "parallel_apply", "my_parallel_apply",
    "ddp_teach.dp:parallel_apply", check_parallel_apply,
    ["One threading.Thread per replica; each stores its output at its index.",
     "Catch exceptions inside the thread and raise them again, naming the "
     "replica, after join()."]))
register(Exercise(
    "data_parallel", "DataParallel from the four primitives", "my_data_parallel",
    "ddp_teach.dp:data_parallel_forward", check_data_parallel,
    ["scatter the batch, replicate the module for as many pieces as you got, "
     "parallel_apply, gather."]))
