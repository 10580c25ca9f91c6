"""Checker for notebook 02's gather exercise (scatter is checked in
nb02_dataparallel.py, whose helpers it uses): the learner's
`my_gather(outputs, target)` runs here in the kernel, against
`ddp_teach.dp.gather`, property by property (see `check_gather`).
"""
import torch

from ddp_teach.exercises.cases import container_cases
from ddp_teach.exercises.nb02_dataparallel import (CUT_GRAPH, NAMEDTUPLE_HINT,
                                                   describe, first_value_off,
                                                   rows, run_here, same,
                                                   values)
from ddp_teach.exercises.registry import CORRECT, WRONG, Exercise, Verdict, register


def gather_cases():
    """The container cases whose every leaf is a tensor (or an empty
    container): what a gather's contract covers. torch's gather_map
    cannot gather a number or a string (torch/nn/parallel/scatter_gather.py
    rebuilds it with type(out)(map(...)))."""
    def tensors_only(obj):
        if isinstance(obj, dict):
            return all(tensors_only(v) for v in obj.values())
        if isinstance(obj, (list, tuple)):
            return all(tensors_only(v) for v in obj)
        return isinstance(obj, torch.Tensor)
    return [case for case in container_cases() if tensors_only(case.build())]


def check_gather(fn) -> Verdict:
    """dt.dp.gather guarantees, for one output per device:

    1. values: the tensors joined along dim 0 (torch.cat), in device order,
       for uneven pieces and for one device;
    2. structure: tuples (namedtuples too), lists and dicts are gathered
       element by element and keep their type and keys;
    3. gradient flow: the result's gradient is cut back into the pieces' (a
       gather that detaches lets DataParallel train with no gradient);
    4. the target device: the result is on `target`, checked with "meta"
       (shapes without values), where a gather that ignores it stays on
       the CPU.

    Properties 1 and 2 are tried on the pieces that dt.dp.scatter cuts
    from `gather_cases()`, smallest first, against dt.dp.gather: a
    verdict shows the smallest failing case, and the first value that
    differs when the shapes agree.
    """
    from ddp_teach import dp
    for case in gather_cases():
        inputs, n = case.build(), case.devices
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
             "reduce does): torch.cat(pieces, dim=0)."),
            ("required positional argument", NAMEDTUPLE_HINT)])
        if failed:
            return Verdict(failed.status, f"gathering the pieces of "
                           f"{case.describe()}: {failed.message}") \
                if failed.status == WRONG else failed
        want = dp.gather(pieces, "cpu")
        if same(got, want):
            continue
        shown = (f"gathering the pieces of {case.describe()}, "
                 f"{describe(pieces)}:\n  expected {describe(want)}\n  got "
                 f"{describe(got)}{first_value_off(got, want)}\nHint: ")
        return Verdict(WRONG, shown + _gather_hint(got, want, pieces, n))
    return _gather_on_the_target(fn) or _gather_keeps_the_graph(fn)


def _gather_on_the_target(fn) -> Verdict | None:
    """Property 4: the result is on the target device ("meta" here)."""
    from ddp_teach import dp
    batch = torch.arange(30.0).reshape(10, 3)
    pieces = dp.scatter((batch, {"y": batch[:, 0]}), ["cpu"] * 3)
    got, failed = run_here(lambda: fn(pieces, "meta"))
    if failed:
        return failed
    tensors = [got[0], got[1]["y"]] if isinstance(got, tuple) and len(got) == 2 \
        and isinstance(got[1], dict) and "y" in got[1] else [got]
    off = [t for t in tensors if not (isinstance(t, torch.Tensor)
                                      and t.device.type == "meta")]
    if not off and [tuple(t.shape) for t in tensors] == [(10, 3), (10,)]:
        return None
    where = ", ".join(str(getattr(t, "device", type(t).__name__)) for t in tensors)
    return Verdict(WRONG, f"gathering {describe(pieces)} onto target \"meta\": "
                   f"expected (tensor(10, 3), {{'y': tensor(10)}}) on the meta "
                   f"device, got {describe(got)} on {where}.\nHint: the result "
                   "goes to the target device (DataParallel's output_device): "
                   "move each piece with .to(target) before torch.cat, at every "
                   "level of the structure.")


def _gather_hint(got, inputs, pieces, n) -> str:
    if isinstance(got, torch.Tensor) and isinstance(inputs, torch.Tensor):
        if got.dim() == inputs.dim() + 1:
            return ("torch.stack adds a dimension; torch.cat(pieces, dim=0) "
                    "joins the batch back.")
        if n > 1 and same(got, torch.cat(pieces[::-1])):
            return "keep the devices' order."
        if n > 1 and len({p.shape for p in pieces}) == 1 and same(got, sum(pieces)):
            return ("gather joins the rows of the pieces, it does not add "
                    "them (adding is what the gradients' reduce does): "
                    "torch.cat(pieces, dim=0).")
        if got.shape != inputs.shape and got.dim() == inputs.dim() \
                and rows(got) == rows(pieces[0]):
            return "join along dimension 0 (the batch): torch.cat(pieces, dim=0)."
        return f"the values differ: expected {values(inputs)}, got {values(got)}."
    if isinstance(got, list) and len(got) == n > 1 and not isinstance(inputs, list):
        return "return one tensor (or one structure), not a list of pieces."
    if n > 1 and isinstance(inputs, (list, tuple)) and isinstance(got, (list, tuple)) \
            and len(got) == len(inputs) and any(
                isinstance(first, torch.Tensor) and same(mine, first)
                and not same(first, whole)
                for mine, first, whole in zip(got, pieces[0], inputs)):
        return ("gather element by element: some elements of the result are "
                "device 0's alone. A tuple of outputs gives a tuple of "
                "gathered tensors, a dict a dict with the same keys.")
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
    return Verdict(CORRECT, "1-D, 2-D and non-contiguous tensors from 1 to 5 "
                   "devices, uneven pieces, nested tuples, lists, dicts and "
                   "namedtuples, the result on the target device, and the "
                   "gradient flows back to every piece.")


register(Exercise(
    "dp_gather", "gather", "my_gather", "ddp_teach.dp:gather", check_gather,
    ["torch.cat(pieces, dim=0) on the target device.",
     "Recurse: gather element i of every device's tuple together."]))
