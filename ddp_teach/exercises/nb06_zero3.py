"""Checker for notebook 06's ZeRO-3 exercise, on real ranks.

`zero3_gather_forward`: the gather-and-free around one unit's forward. The
module's parameters are on the meta device (names and shapes, no values, as
FSDP builds big models), so the output can only be right if the shards were
gathered; afterwards every tensor Python can still reach is inspected, so
full parameters kept on the module or in a global are caught.
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
from ddp_teach.zero import flat_slice, shard_size, unflatten


def _unit():
    torch.manual_seed(0)  # 59 parameters: padded to 60 on 2 and 3 ranks
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 4))


def _reachable_storages() -> dict:
    """{storage address: bytes} of every CPU tensor Python can reach.
    (`type()`, not isinstance: some objects' __class__ warns when read.)"""
    gc.collect()
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for t in gc.get_objects()
            if issubclass(type(t), torch.Tensor) and t.device.type == "cpu"}


def _gather_forward_on_ranks(rank, world_size, fn):
    unit = _unit()
    padded = shard_size(59, world_size) * world_size
    flat = flat_slice(list(unit.parameters()), 0, padded)
    shard = flat.chunk(world_size)[rank].clone()
    module = copy.deepcopy(unit).to("meta")  # names and shapes, no values
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(rank))
    gathers = []

    def counted(gather):
        def counting(*args, **kwargs):
            gathers.append(gather.__name__)
            return gather(*args, **kwargs)
        return counting

    for name in ("all_gather_single", "all_gather_into_tensor", "all_gather"):
        setattr(dist, name, counted(getattr(dist, name)))
    del unit, flat
    before = _reachable_storages()
    try:
        with torch.no_grad():
            output = fn(module, shard, x)
    except NotImplementedError:
        return NOT_ATTEMPTED
    except Exception as err:  # shown with a hint (a rank failing alone times out)
        return dict(error=f"{type(err).__name__}: {err}", gathered=bool(gathers))
    output_storage = torch.as_tensor(output).untyped_storage().data_ptr()
    for _ in range(20):  # gloo's thread may hold a finished call's output a moment
        kept = sum(nbytes for address, nbytes in _reachable_storages().items()
                   if address not in before and address != output_storage)
        if not kept:
            break
        time.sleep(0.05)
    return dict(output=torch.as_tensor(output).clone(), gathered=bool(gathers),
                kept_bytes=kept, module_changed=any(
                    p.device.type != "meta" for p in module.parameters()))


def _expected_outputs(world_size, rank_order):
    """Each rank's output when the full vector is assembled from the
    chunks in `rank_order(rank)`."""
    unit = _unit()
    padded = shard_size(59, world_size) * world_size
    chunks = flat_slice(list(unit.parameters()), 0, padded).chunk(world_size)
    outputs = []
    for rank in range(world_size):
        full = torch.cat([chunks[r] for r in rank_order(rank)])
        params = dict(zip([n for n, _ in unit.named_parameters()],
                          unflatten(full, [p.shape for p in unit.parameters()])))
        x = torch.randn(3, 6, generator=torch.Generator().manual_seed(rank))
        with torch.no_grad():
            outputs.append(torch.func.functional_call(unit, params, (x,)))
    return outputs


def check_gathered_forward(fn) -> Verdict:
    for world_size in (2, 3):
        results, problem = run_learner_code(_gather_forward_on_ranks,
                                            world_size, fn, timeout=60.0)
        if problem:
            return problem
        want = _expected_outputs(world_size, lambda rank: range(world_size))
        own_first = _expected_outputs(world_size, lambda rank: [rank] + [
            r for r in range(world_size) if r != rank])
        full_bytes = 4 * shard_size(59, world_size) * world_size
        for rank, got in enumerate(results):
            where = f"on {world_size} ranks, rank {rank}: "
            if "error" in got and not got["gathered"]:
                return Verdict(WRONG, where + f"your function raised "
                               f"{got['error']} before any all-gather.\nHint: "
                               "the shard holds only 1/N of the unit's flat "
                               "parameters: all-gather every rank's shard first.")
            if not got["gathered"]:
                return Verdict(WRONG, where + "no all-gather was called.\nHint: "
                               "the shard holds only 1/N of the unit's flat "
                               "parameters: all-gather every rank's shard first.")
            if "error" in got:
                return Verdict(WRONG, where + f"your function raised "
                               f"{got['error']}\nHint: the gathered vector is "
                               f"padded to a multiple of the world size: use "
                               f"its first sum(p.numel()) elements, cut in "
                               f"module.named_parameters() order.")
            if got["output"].shape != want[rank].shape or not torch.allclose(
                    got["output"], want[rank], atol=1e-6):
                shown = (where + f"expected output {want[rank].tolist()}, got "
                         f"{got['output'].tolist()}.\nHint: ")
                if torch.allclose(got["output"], own_first[rank], atol=1e-6):
                    return Verdict(WRONG, shown + "the chunks are out of order: "
                                   "rank r's shard is chunk r of the flat "
                                   "vector, whichever rank you are (all-gather "
                                   "puts them in rank order).")
                return Verdict(WRONG, shown + "cut the gathered vector into the "
                               "parameters in module.named_parameters() order, "
                               "view each to its shape, and run "
                               "torch.func.functional_call(module, params, (x,)).")
            if got["module_changed"] or got["kept_bytes"] >= full_bytes:
                return Verdict(WRONG, where + f"the output is right, but "
                               f"{got['kept_bytes']} bytes of gathered "
                               f"parameters were still held after it returned "
                               f"(the full unit is {full_bytes} bytes)."
                               f"\nHint: keep the full parameters in local "
                               f"variables only, not on the module or in a "
                               f"global: ZeRO-3 frees them after the forward, "
                               f"so only the shard stays.")
    return Verdict(CORRECT, "the unsharded module's output on 2 and 3 ranks, "
                            "and nothing gathered was kept afterwards.")


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
