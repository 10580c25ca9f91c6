"""Checker for notebook 02's replicate exercise: one copy of a model per
device, whose gradients flow back to the original.

The test model (`_Tied`) holds replicate's traps: a weight shared by two
layers, a layer without bias (a parameter that is None), and a buffer. It
computes in float64, so that a replica's output and gradient can be compared
with the original's to float64 rounding.
"""
import torch
from torch import nn

from ddp_teach.exercises.cases import WORLD_SIZES
from ddp_teach.exercises.difference import first_difference
from ddp_teach.exercises.nb02_dataparallel import describe, run_here
from ddp_teach.exercises.registry import CORRECT, WRONG, Exercise, Verdict, register

TOLERANCE = dict(rtol=1e-12, atol=1e-12)  # float64, a few terms per sum


class _Tied(nn.Module):
    """Two layers sharing one weight, one without bias, and a buffer."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.first = nn.Linear(4, 4).double()
        self.second = nn.Linear(4, 4).double()
        self.second.weight = self.first.weight
        self.last = nn.Linear(4, 2, bias=False).double()
        self.register_buffer("offset", torch.full((2,), 0.5, dtype=torch.float64))

    def forward(self, x):
        return self.last(torch.tanh(self.second(torch.tanh(self.first(x))))) + self.offset


def _tensor_at(module, path: str):
    """module.<path> (e.g. "first.weight") if it is a tensor, else None."""
    obj = module
    for name in path.split("."):
        obj = getattr(obj, name, None)
    return obj if isinstance(obj, torch.Tensor) else None


def _storage(tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def check_replicate(fn) -> Verdict:
    """dt.dp.replicate guarantees, for a module and n devices:

    1. a list of n modules (one for one device), each computing what the
       original computes, on 1 to 5 devices, smallest first;
    2. the original untouched: the same Parameter objects, values and
       buffers after the call;
    3. new objects: no replica is the original or another replica, nor
       shares a submodule with them (copy.copy shares the children);
    4. copies, not aliases: each replica holds its own copy of every
       parameter, distinct from the original's and from the other
       replicas' (a memo of copies shared by all replicas aliases them);
    5. gradient flow: backward through all replicas sums their gradients
       into the ORIGINAL parameters' .grad (copy.deepcopy, .detach() and
       nn.Parameter(...) make new leaves and cut that path);
    6. tied weights stay tied inside a replica; None parameters stay None;
    7. buffers are copies: changing a replica's buffer leaves the
       original's alone.
    """
    module, x = _Tied(), torch.randn(6, 4, dtype=torch.float64)
    before = [(name, p, p.detach().clone()) for name, p in module.named_parameters()]
    replicas, failed = run_here(lambda: fn(module, ["cpu"] * 3), [(
        "object has no attribute 'clone'", "a module may hold None where a "
        "parameter could be (nn.Linear(..., bias=False) has bias None): keep "
        "None as it is.")])
    if failed:
        return failed
    for check in (_one_working_replica_per_device, _original_untouched,
                  _new_objects, _copies_not_aliases, _gradients_reach_the_original,
                  _tied_stays_tied, _buffers_are_copies):
        verdict = check(fn, module, replicas, x, before)
        if verdict is not None:
            return verdict
    return Verdict(CORRECT, "1 to 5 replicas; each computes what the original "
                   "does with copies of its own; gradients sum into the "
                   "original; tied weights stay tied; None stays None; "
                   "buffers are copies; the original is untouched.")


def _one_working_replica_per_device(fn, module, replicas, x, before):
    """Property 1 on 1 to 5 devices, smallest first (the 3 replicas made
    for the other properties are the 3-device case)."""
    for n in WORLD_SIZES:
        original = module if n == 3 else _Tied()
        made, failed = (replicas, None) if n == 3 else run_here(
            lambda: fn(original, ["cpu"] * n))
        if failed:
            return Verdict(failed.status, f"for {n} device{'s' * (n > 1)}: "
                           f"{failed.message}") if failed.status == WRONG else failed
        if not isinstance(made, (list, tuple)) or len(made) != n or not all(
                isinstance(r, nn.Module) for r in made):
            one = " a list of one." if n == 1 else ""
            return Verdict(WRONG, f"for {n} device{'s' * (n > 1)} your function "
                           f"returned {describe(made)}.\nHint: return a list "
                           f"with one replica (an nn.Module) per device.{one}")
        want = original(x)
        for i, replica in enumerate(made):
            got, failed = run_here(lambda: replica(x))
            if failed:
                return Verdict(WRONG, f"calling replica {i} of {n}: {failed.message}")
            if not (isinstance(got, torch.Tensor) and got.shape == want.shape
                    and torch.allclose(got, want, **TOLERANCE)):
                differ = (first_difference([got.detach()], [want.detach()],
                                           ["output"], **TOLERANCE)
                          if isinstance(got, torch.Tensor) else describe(got))
                return Verdict(WRONG, f"replica {i} of {n} computes another "
                               f"output than the original: {differ}.\nHint: "
                               f"a replica copies the values of every parameter "
                               f"and buffer, and keeps the module's code.")
    return None


def _original_untouched(fn, module, replicas, x, before):
    after = dict(module.named_parameters())
    for name, param, value in before:
        if after.get(name) is not param or not torch.equal(param, value):
            return Verdict(WRONG, f"after your function, the original module's "
                           f"{name} is no longer the Parameter it was (or "
                           f"changed its value).\nHint: change only the "
                           f"replicas: build each replica's attributes on the "
                           f"copy, never on the original's modules.")
    return None


def _new_objects(fn, module, replicas, x, before):
    if any(r is module for r in replicas) or len({id(r) for r in replicas}) < 3:
        return Verdict(WRONG, "the replicas are the original (or each other): "
                       "each device needs a copy of its own.\nHint: build a "
                       "new module object per device (dt.dp.replicate's idea).")
    originals = {id(m) for m in module.modules()}
    if any(id(child) in originals for r in replicas for child in r.children()):
        return Verdict(WRONG, "a replica shares submodules with the original "
                       "(replica.first is module.first): copy.copy copies only "
                       "the outer module.\nHint: copy every submodule too, so "
                       "that a replica's tensors are set on its own modules.")
    return None


def _copies_not_aliases(fn, module, replicas, x, before):
    seen = {_storage(module.first.weight): "the original"}
    for i, replica in enumerate(replicas):
        weight = _tensor_at(replica, "first.weight")
        if weight is None:
            return Verdict(WRONG, f"replica {i} has no tensor first.weight.\n"
                           f"Hint: keep the module's structure: the same "
                           f"submodules and parameter names.")
        owner = seen.setdefault(_storage(weight), f"replica {i}")
        if owner != f"replica {i}":
            why = ("p.to(device) returns p itself when it is already on that "
                   "device (on CPU, always): use p.clone() (or .to(device, "
                   "copy=True))" if owner == "the original" else
                   "keep the memo of copies per replica (create it inside the "
                   "loop over devices), or every device shares the first copy")
            return Verdict(WRONG, f"replica {i}'s first.weight is the same "
                           f"tensor (storage) as {owner}'s: an alias, not a "
                           f"copy. On GPUs each device needs a copy in its own "
                           f"memory.\nHint: {why}.")
    return None


def _gradients_reach_the_original(fn, module, replicas, x, before):
    module.zero_grad()
    want = torch.autograd.grad(3 * module(x).sum(), module.first.weight)[0]
    total, failed = run_here(lambda: sum(replica(x).sum() for replica in replicas))
    if failed:
        return failed
    if not total.requires_grad:
        return _cut(module.first.weight.grad, replicas)
    _, failed = run_here(total.backward)
    if failed:
        return Verdict(WRONG, f"backward through the replicas failed: {failed.message}")
    got = module.first.weight.grad
    if got is None or not got.any():
        return _cut(got, replicas)
    if not torch.allclose(got, want, **TOLERANCE):
        return Verdict(WRONG, "backward through the 3 replicas did not put "
                       "the sum of their 3 gradients into the original's "
                       ".grad.\nHint: every replica's parameters must be "
                       "differentiable copies (param.clone()) of the "
                       "original's, so that autograd sums them back.")
    return None


def _cut(grad, replicas) -> Verdict:
    weight = _tensor_at(replicas[0], "first.weight")
    why = ("replica 0's first.weight is still an nn.Parameter of its own, a "
           "leaf, as copy.deepcopy, load_state_dict and nn.Parameter(...) "
           "leave it: replace the parameters in every submodule (walk "
           "module.modules()), not only the top one" if isinstance(
               weight, nn.Parameter) else
           "replica 0's first.weight has no way back to the original: "
           ".detach() and .data cut it")
    return Verdict(WRONG, "backward through the replicas did not reach the "
                   f"ORIGINAL module's .grad (it is {describe(grad)}).\nHint: "
                   f"{why}. Give each replica param.clone() (a differentiable "
                   "copy), as torch's Broadcast does, so that autograd sums "
                   "every replica's gradient back into the original.")


def _tied_stays_tied(fn, module, replicas, x, before):
    replica = replicas[1]
    if _tensor_at(replica, "first.weight") is not _tensor_at(replica, "second.weight"):
        return Verdict(WRONG, "the tied weight (first.weight is second.weight) "
                       "became two tensors in the replica.\nHint: copy each "
                       "parameter once, memoised by id(param), and reuse it.")
    if getattr(replica.last, "bias", "missing") is not None:
        return Verdict(WRONG, "the original's last.bias is None (a Linear "
                       "without bias), the replica's is not.\nHint: keep "
                       "None as it is.")
    return None


def _buffers_are_copies(fn, module, replicas, x, before):
    offset = _tensor_at(replicas[2], "offset")
    if offset is None:
        return Verdict(WRONG, "replica 2 has no buffer 'offset'.\nHint: copy "
                       "the buffers too.")
    offset.add_(1)
    other = _tensor_at(replicas[1], "offset")
    if module.offset[0] != 0.5 or other is None or other[0] != 0.5:
        return Verdict(WRONG, "changing replica 2's buffer changed the "
                       "original's (or another replica's).\nHint: copy "
                       "buffers too (buffer.detach().clone()).")
    return None


register(Exercise(
    "dp_replicate", "replicate", "my_replicate", "ddp_teach.dp:replicate",
    check_replicate,
    ["Copy the module object per device, but not its parameters with "
     "deepcopy: give it param.clone().",
     "Memoise the clones by id(param) so tied weights stay tied; clone "
     "buffers with detach().clone()."]))
