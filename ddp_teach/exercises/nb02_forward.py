"""Checker for notebook 02's last exercise: the forward of DataParallel,
made of scatter, replicate, parallel_apply and gather.

Its model computes in float64, so that the output and the gradients can be
compared with one device's to float64 rounding; `nb02_threads.Probe` shows
whether the replicas ran in threads of their own, all at once.
"""
import torch
from torch import nn

from ddp_teach.exercises.difference import first_difference
from ddp_teach.exercises.nb02_dataparallel import CUT_GRAPH, describe, run_here, values
from ddp_teach.exercises.nb02_threads import Meeting, Probe, probe_pieces
from ddp_teach.exercises.registry import CORRECT, WRONG, Exercise, Verdict, register


class _TwoInputs(nn.Module):
    """A model with two positional inputs: linear(x) * w."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(3, 1).double()

    def forward(self, x, w):
        return self.linear(x) * w


TOLERANCE = dict(rtol=1e-10, atol=1e-12)  # float64; sums of at most 13 terms
# (devices, rows), smallest batch first: one row alone, as many rows as
# devices, fewer rows than devices, then uneven splits (5, 7, 13: prime)
FORWARD_CASES = ((1, 1), (2, 2), (4, 3), (2, 5), (3, 7), (4, 10), (5, 13))


def check_data_parallel(fn) -> Verdict:
    """dt.dp.data_parallel_forward guarantees, for a module, inputs and devices:

    1. output: module(inputs), on `FORWARD_CASES`, smallest first: one
       row on one device, batches that split unevenly (5, 7, 10 and 13
       rows on 2 to 5 devices) and one smaller than the device count (3
       rows on 4: 3 pieces, so 3 replicas); a verdict shows the smallest
       case that fails and the first value that differs;
    2. gradient: backward from the output puts the full batch's gradient
       into the module's own parameters' .grad;
    3. parallel: one replica per piece (not the original module, not one
       replica twice), each in a thread of its own, all at once;
    4. fresh replicas: every call copies the module as it is at that call,
       so a change to its weights (an optimizer step) is seen next time;
    5. tuple inputs: a tuple of tensors is cut element by element and each
       replica gets its pieces as positional arguments.
    """
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 1)).double()
    batch = torch.randn(13, 3, dtype=torch.float64)
    for n, rows in FORWARD_CASES:
        verdict = _same_as_one_device(fn, module, batch[:rows], n)
        if verdict is not None:
            return verdict
    return (_runs_in_parallel(fn) or _fresh_replicas(fn, module, batch[:10])
            or _tuple_inputs(fn) or
            Verdict(CORRECT, "outputs and gradients equal a full-batch run on "
                    "1 to 5 devices (1 to 13 rows, uneven pieces, a batch "
                    "smaller than the device count), replicas in parallel "
                    "threads and made afresh at every call, tuple inputs."))


def _same_as_one_device(fn, module, x, n) -> Verdict | None:
    module.zero_grad()
    want_out = module(x)
    want = torch.autograd.grad(want_out.square().mean(), list(module.parameters()))
    small = (f"a batch of {len(x)} on {n} devices gives {len(x)} pieces: make "
             f"as many replicas as there are pieces." if len(x) < n else "")
    out, failed = run_here(lambda: fn(module, x, ["cpu"] * n))
    if failed:
        return _with_hint(failed, f"{len(x)} rows {_on(n)}", small)
    if not isinstance(out, torch.Tensor) or out.shape != want_out.shape:
        return Verdict(WRONG, f"a batch of {len(x)} rows {_on(n)}: the output is {describe(out)}, "
                       f"expected {describe(want_out)}.\nHint: gather the "
                       f"replicas' outputs back into one batch{'; ' if small else '.'}{small}")
    if not torch.allclose(out, want_out, **TOLERANCE):
        differ = first_difference([out.detach()], [want_out.detach()], ["output"],
                                  **TOLERANCE)
        return Verdict(WRONG, f"a batch of {len(x)} rows {_on(n)}: the output "
                       f"differs from module(batch): {differ}\n  expected "
                       f"{values(want_out)}\n  got      {values(out)}\nHint: "
                       f"every row of the batch must go through exactly one "
                       f"replica, in order.")
    if not out.requires_grad:
        return _no_gradient(n)
    _, failed = run_here(lambda: out.square().mean().backward(), [(
        "backward through the graph a second time", "replicate on every call: "
        "the replicas of an earlier call belong to that call's graph, which "
        "its backward freed.")])
    if failed:
        return _with_hint(failed, f"backward through the output {_on(n)}", "")
    got = [p.grad for p in module.parameters()]
    if all(g is None or not g.any() for g in got):
        return _no_gradient(n)
    if any(g is None or not torch.allclose(g, w, **TOLERANCE) for g, w in zip(got, want)):
        differ = first_difference(got, want, [f"{name}.grad" for name, _ in
                                              module.named_parameters()], **TOLERANCE)
        return Verdict(WRONG, f"a batch of {len(x)} rows {_on(n)}: the gradients "
                       f"differ from a single-device run of the whole batch: "
                       f"{differ}\nHint: make the "
                       "replicas with replicate (differentiable copies), so "
                       "that every replica's gradient flows back.")
    return None


def _on(n: int) -> str:
    return f"on {n} device{'s' if n > 1 else ''}"


def _with_hint(failed: Verdict, case: str, hint: str) -> Verdict:
    """The error verdict of one case, said for that case, with `hint` where
    it has none of its own."""
    if failed.status != WRONG:
        return failed
    extra = f"\nHint: {hint}" if hint and "Hint:" not in failed.message else ""
    return Verdict(WRONG, f"{case}: {failed.message}{extra}")


def _no_gradient(n) -> Verdict:
    return Verdict(WRONG, f"{_on(n)} no gradient reached the module's "
                   "parameters: DataParallel would not train.\nHint: the path "
                   "back was cut: copy.deepcopy in replicate, or one of " +
                   CUT_GRAPH + " in scatter or gather.")


def _runs_in_parallel(fn) -> Verdict | None:
    meeting = Meeting(3, stagger=False)
    probe, x = Probe(meeting), torch.cat(probe_pieces(3))
    out, failed = run_here(lambda: fn(probe, x, ["cpu"] * 3))
    if failed:
        return failed
    if len(meeting.modules) == 1 and meeting.threads[0] is meeting.caller:
        return Verdict(WRONG, "the module ran once, on the whole batch, in your "
                       "thread.\nHint: DataParallel scatters the batch and runs "
                       "a replica of the module on each piece, in parallel.")
    if any(m is probe for m in meeting.modules):
        return Verdict(WRONG, "the original module itself ran on the pieces, "
                       "not its replicas: on GPUs its parameters live on "
                       "devices[0] only.\nHint: run the replicas that "
                       "replicate made, one per piece.")
    if len({id(m) for m in meeting.modules}) < len(meeting.modules):
        return Verdict(WRONG, "one replica ran on several pieces.\nHint: "
                       "make one replica per piece and run each on its own.")
    return meeting.threads_verdict("run the replicas with parallel_apply: one "
                                   "thread each, all at once.")


def _fresh_replicas(fn, module, batch) -> Verdict | None:
    devices = ["cpu"] * 3
    first, failed = run_here(lambda: fn(module, batch, devices))
    if failed:
        return failed
    with torch.no_grad():
        module[0].weight.add_(0.5)  # what an optimizer step does
    again, failed = run_here(lambda: fn(module, batch, devices))
    if failed:
        return failed
    if not (isinstance(again, torch.Tensor)
            and torch.allclose(again, module(batch), **TOLERANCE)):
        return Verdict(WRONG, "after the module's weights changed (as an "
                       "optimizer step changes them), your function still "
                       "computed with the old ones.\nHint: replicate on every "
                       "call: replicas kept from an earlier call hold the "
                       "weights of that time.")
    return None


def _tuple_inputs(fn) -> Verdict | None:
    module = _TwoInputs()
    x = torch.randn(10, 3, dtype=torch.float64)
    w = torch.arange(1.0, 11.0, dtype=torch.float64).unsqueeze(1)
    hint = ("a tuple of inputs holds the module's positional arguments: "
            "scatter the whole tuple (each piece is a tuple) and let "
            "parallel_apply unpack each piece.")
    out, failed = run_here(lambda: fn(module, (x, w), ["cpu"] * 3))
    if failed:
        return _with_hint(failed, "inputs (x, w) for a forward(x, w)", hint)
    if not (isinstance(out, torch.Tensor) and out.shape == (10, 1)
            and torch.allclose(out, module(x, w), **TOLERANCE)):
        return Verdict(WRONG, f"inputs (x, w) for a forward(x, w): expected "
                       f"module(x, w), tensor(10, 1), got {describe(out)}.\n"
                       f"Hint: {hint}")
    return None

register(Exercise(
    "data_parallel", "DataParallel from the four primitives", "my_data_parallel",
    "ddp_teach.dp:data_parallel_forward", check_data_parallel,
    ["scatter the batch, replicate the module for as many pieces as you got, "
     "parallel_apply, gather."]))
