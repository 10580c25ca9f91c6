"""Checker for notebook 06's ZeRO-3 exercise, on real ranks.

`gathered_forward(module, shard, x)`: the gather-and-free around one unit's
forward. What the reference, `ddp_teach.zero.gathered_forward`, guarantees,
and how each property is checked (on 1, 2, 3 and 5 ranks, each rank with an
input of its own):

- values: the output is the unsharded module's on this rank's input. The
  module's parameters are on the meta device (names and shapes, no values,
  as FSDP builds big models), so it can only be right if the shards were
  gathered, in rank order, cut in `named_parameters()` order with the
  padding at the end dropped, and viewed to each parameter's shape;
- gradient flow: the output is differentiable with respect to `x`, and
  backward gives `x` the unsharded module's input gradient (the next
  unit's backward needs it);
- nothing kept: after the call (under `torch.no_grad()`, as the memory
  check needs) every tensor Python can still reach is inspected, so full
  parameters kept on the module or in a global are caught, and the module
  must still have its meta parameters;
- one full copy at a time (peak memory): when the forward starts
  (`torch.func.functional_call` is called) the tensors made by the call
  that are larger than one shard hold at most the full unit's bytes
  (N x shard), as the reference's one gathered vector, cut by views,
  does; copies of the parameters beside it are caught (measured by
  scanning the tensors Python can reach, as for "nothing kept");
- any collective that assembles the shards will do: an all-reduce of a
  zero-padded buffer is right, and the verdict says what it costs (twice
  an all-gather's bytes); on one rank no collective is needed at all;
- sizes not divisible by the world size: the unit has 59 parameters,
  padded to 60 on 2 to 5 ranks; on 1 rank the shard is everything.
  Shards are equal by construction (the flat layout pads), so no rank's is
  empty.

A wrong answer is compared with the likely mistakes (the shard used as if
it were everything, the chunks in the wrong order, the padding kept, the
pieces not viewed to their shapes, parameters assigned to the meta module,
the output computed on the meta module, the forward run under no_grad, the
gathered parameters kept), so that the hint names it.
"""
import copy
import gc
import time

import torch
import torch.distributed as dist
from torch import nn

from ddp_teach.exercises.harness import run_learner_code
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, WRONG, Exercise,
                                         Verdict, register)
from ddp_teach.flat import flat_slice, shard_size, unflatten

WORLD_SIZES = (1, 2, 3, 5)  # 4 too: over 10 s (each rank scans its heap twice)
NUMEL = 59
META_HINT = ("the module's own parameters are on the meta device, shapes "
             "without values, and loading values into them changes nothing: "
             "run it with the gathered tensors instead, "
             "torch.func.functional_call(module, params, (x,)).")
GATHER_FIRST_HINT = ("the shard holds only 1/N of the unit's flat parameters: "
                     "all-gather every rank's shard first.")


def _unit():
    torch.manual_seed(0)  # 59 parameters: padded to 60 on 2 to 5 ranks
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 4))


def _input(rank):
    return torch.randn(3, 6, generator=torch.Generator().manual_seed(rank))


def _reachable_storages() -> dict:
    """{storage address: bytes} of every CPU tensor Python can reach.
    (`type()`, not isinstance: some objects' __class__ warns when read.)"""
    gc.collect()
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for t in gc.get_objects()
            if issubclass(type(t), torch.Tensor) and t.device.type == "cpu"}


def _gathered_bytes_alive(before: dict, shard_bytes: int) -> int:
    """Bytes of the CPU tensors made since `before` that are larger than
    one shard: the full parameters, and copies of them, alive now. A list
    all-gather's slots, one shard each, are left out: that style (right,
    issue 34) holds them beside their torch.cat until it returns, and the
    cat is counted."""
    return sum(nbytes for address, nbytes in _reachable_storages().items()
               if address not in before and nbytes > shard_bytes)


def _watch(record):
    """Count the all-gathers and note the shapes given to functional_call;
    returns a function that puts torch's own back."""
    real = {name: getattr(dist, name) for name in
            ("all_gather_single", "all_gather_into_tensor", "all_gather",
             "all_reduce")}
    real_call = torch.func.functional_call

    def counted(name, gather):
        def counting(*args, **kwargs):
            record["gathered"] = True
            record["all_reduced"] = record.get("all_reduced") or name == "all_reduce"
            return gather(*args, **kwargs)
        return counting

    def functional_call(module, params, *args, **kwargs):
        if isinstance(params, dict):
            record["shapes"] = {n: tuple(getattr(t, "shape", ()))
                                for n, t in params.items()}
        if "before" in record and "held_at_forward" not in record:
            record["held_at_forward"] = _gathered_bytes_alive(
                record["before"], record["shard_bytes"])
        return real_call(module, params, *args, **kwargs)

    for name, gather in real.items():
        setattr(dist, name, counted(name, gather))
    torch.func.functional_call = functional_call

    def restore():
        for name, gather in real.items():
            setattr(dist, name, gather)
        torch.func.functional_call = real_call
    return restore


def _describe_output(output):
    """What the checker can use of the output: a CPU tensor, or why not."""
    if not isinstance(output, torch.Tensor):
        return None, f"a {type(output).__name__}"
    if output.device.type != "cpu":
        return None, f"a tensor on the {output.device.type} device"
    return output, None


def _gather_forward_on_ranks(rank, world_size, fn):
    unit = _unit()
    padded = shard_size(NUMEL, world_size) * world_size
    shard = flat_slice(list(unit.parameters()), 0, padded).chunk(world_size)[rank].clone()
    module = copy.deepcopy(unit).to("meta")  # names and shapes, no values
    del unit
    record = {"gathered": False, "shapes": None,
              "shard_bytes": shard.untyped_storage().nbytes()}
    restore = _watch(record)
    try:
        x = _input(rank)
        before = _reachable_storages()
        if world_size > 1:  # on one rank the shard is the whole unit
            record["before"] = before
        with torch.no_grad():
            output = fn(module, shard, x)
        record.pop("before", None)  # measured in this first call only
        output, unusable = _describe_output(output)
        if unusable:
            return dict(record, unusable=unusable)
        kept = 0
        for _ in range(20):  # gloo's thread may hold a finished call's output a moment
            kept = sum(nbytes for address, nbytes in _reachable_storages().items()
                       if address not in before
                       and address != output.untyped_storage().data_ptr())
            if not kept:
                break
            time.sleep(0.05)
        x = _input(rank).requires_grad_()
        with_grad = fn(module, shard, x)
        differentiable = isinstance(with_grad, torch.Tensor) and with_grad.requires_grad
        if differentiable:
            with_grad.sum().backward()
    except NotImplementedError:
        return NOT_ATTEMPTED
    except Exception as err:  # shown with a hint (a rank failing alone times out)
        return dict(record, error=f"{type(err).__name__}: {err}")
    finally:
        restore()
        record.pop("before", None)
    return dict(record, output=output.detach().clone(), kept_bytes=kept,
                module_changed=any(p.device.type != "meta" for p in module.parameters()),
                differentiable=differentiable, x_grad=x.grad)


def _expected(world_size, rank_order):
    """Each rank's (output, input gradient) when the full vector is
    assembled from the chunks in `rank_order(rank)`."""
    unit = _unit()
    padded = shard_size(NUMEL, world_size) * world_size
    chunks = flat_slice(list(unit.parameters()), 0, padded).chunk(world_size)
    expected = []
    for rank in range(world_size):
        full = torch.cat([chunks[r] for r in rank_order(rank)])
        params = dict(zip([n for n, _ in unit.named_parameters()],
                          unflatten(full, [p.shape for p in unit.parameters()])))
        x = _input(rank).requires_grad_()
        output = torch.func.functional_call(unit, params, (x,))
        output.sum().backward()
        expected.append((output.detach(), x.grad))
    return expected


def _error_hint(got) -> str:
    """Why the learner's function raised after gathering."""
    module_shapes = {n: tuple(p.shape) for n, p in _unit().named_parameters()}
    shapes = got["shapes"]
    if shapes is not None:
        wrong = {n: s for n, s in shapes.items()
                 if n in module_shapes and s != module_shapes[n]}
        if wrong:
            name, shape = next(iter(wrong.items()))
            return (f"the tensor given for {name!r} has shape {shape}, the "
                    f"module's is {module_shapes[name]}: view each piece to "
                    f"its parameter's shape (piece.view(p.shape)).")
    if "meta" in got["error"]:
        return META_HINT
    if "cannot assign" in got["error"]:
        return ("the module's parameters cannot be replaced by assigning "
                "tensors to them: pass the gathered ones to "
                "torch.func.functional_call(module, params, (x,)), which "
                "uses them for this call only.")
    if "split" in got["error"]:
        return ("the gathered vector is padded to a multiple of the world "
                "size: use its first sum(p.numel()) elements, cut in "
                "module.named_parameters() order.")
    return ("all-gather into one tensor of N * len(shard) elements, cut its "
            "first sum(p.numel()) elements into the parameters in "
            "module.named_parameters() order, view each to its shape, and "
            "run torch.func.functional_call(module, params, (x,)).")


def _first_problem(got, want, own_first, world_size) -> str | None:
    if "error" in got and not got["gathered"]:
        return (f"your function raised {got['error']} before any all-gather."
                f"\nHint: {GATHER_FIRST_HINT}")
    if not got["gathered"] and world_size > 1:
        return f"no all-gather was called.\nHint: {GATHER_FIRST_HINT}"
    if "error" in got:
        return f"your function raised {got['error']}\nHint: {_error_hint(got)}"
    if "unusable" in got:
        meta = "meta" in got["unusable"]
        return (f"the function returned {got['unusable']}, not the output."
                f"\nHint: " + (META_HINT if meta
                                else "return the module's output tensor."))
    output, x_grad = want
    if got["output"].shape != output.shape or not torch.allclose(
            got["output"], output, atol=1e-6):
        shown = (f"expected output {output.tolist()}, got "
                 f"{got['output'].tolist()}.\nHint: ")
        if torch.allclose(got["output"], own_first[0], atol=1e-6):
            return shown + ("the chunks are out of order: rank r's shard is "
                            "chunk r of the flat vector, whichever rank you are "
                            "(all-gather puts them in rank order).")
        return shown + ("cut the gathered vector into the parameters in "
                        "module.named_parameters() order, view each to its "
                        "shape, and run torch.func.functional_call(module, "
                        "params, (x,)).")
    full_bytes = 4 * shard_size(NUMEL, world_size) * world_size
    if got["module_changed"] or got["kept_bytes"] >= full_bytes:
        return (f"the output is right, but {got['kept_bytes']} bytes of "
                f"gathered parameters were still held after it returned (the "
                f"full unit is {full_bytes} bytes).\nHint: keep the full "
                f"parameters in local variables only, not on the module or "
                f"in a global: ZeRO-3 frees them after the forward, so only "
                f"the shard stays.")
    held = got.get("held_at_forward", 0)
    if held > full_bytes:
        return (f"the output is right, but while the forward ran {held} bytes "
                f"of gathered parameters were alive, {held / full_bytes:.2g} "
                f"times the full unit ({full_bytes} bytes).\nHint: ZeRO-3 "
                f"holds one full copy of a unit at a time: gather into one "
                f"flat tensor and cut the parameters from it as views "
                f"(full[a:b].view(shape)), with no .clone(), "
                f".contiguous() or torch.tensor(...) copies beside it.")
    if not got["differentiable"]:
        return ("the output is right, but it carries no gradient: backward "
                "could not reach x, nor the layers before this unit.\nHint: "
                "do not run the forward under torch.no_grad() (the caller "
                "decides that); only the all-gather itself needs none.")
    if got["x_grad"] is None or not torch.allclose(got["x_grad"], x_grad, atol=1e-6):
        return ("the output is right, but backward gives x another gradient "
                "than the unsharded module does.\nHint: compute the output "
                "from x itself, with the gathered parameters, and nothing "
                "detached in between.")
    return None


def check_gathered_forward(fn) -> Verdict:
    all_reduced = False
    for world_size in WORLD_SIZES:
        results, problem = run_learner_code(_gather_forward_on_ranks,
                                            world_size, fn, timeout=60.0)
        if problem:
            return problem
        want = _expected(world_size, lambda rank: range(world_size))
        own_first = _expected(world_size, lambda rank: [rank] + [
            r for r in range(world_size) if r != rank])
        for rank, got in enumerate(results):
            all_reduced = all_reduced or bool(got.get("all_reduced"))
            found = _first_problem(got, want[rank], own_first[rank], world_size)
            if found:
                return Verdict(WRONG, f"on {world_size} rank"
                               f"{'s' * (world_size > 1)}, rank {rank}: {found}")
    cost = (" You gathered with an all-reduce of a zero-padded buffer: right, "
            "at about twice an all-gather's traffic (each rank sends and "
            "receives about 2(N-1)/N of the whole unit instead of (N-1)/N), "
            "and a full-size buffer on every rank before the sum."
            if all_reduced else "")
    return Verdict(CORRECT, "the unsharded module's output and input gradient "
                            "on 1, 2, 3 and 5 ranks, one full copy of the unit "
                            "at most while the forward ran, and nothing "
                            "gathered was kept afterwards." + cost)


register(Exercise(
    "zero3_gather_forward", "The ZeRO-3 gather-and-free around forward",
    "gathered_forward", "ddp_teach.zero:gathered_forward",
    check_gathered_forward,
    ["The shard is 1/N of the unit's flat parameters: gather all N first, "
     "into one tensor of N * len(shard) elements.",
     "Cut the first sum(p.numel()) elements (the rest is padding) into the "
     "parameters, in module.named_parameters() order, and view each to its "
     "shape; torch.func.functional_call(module, params, (x,)) runs with them.",
     "full = shard.new_empty(shard.numel() * world_size); "
     "dist.all_gather_single(full, shard); build the {name: view} dict; "
     "return the output and keep nothing else: the full tensor is freed "
     "when the function returns."]))
