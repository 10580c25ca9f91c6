"""Notebook 06's planted mistakes for its ZeRO-3 exercise (PLANTED, run by
test_registry.py, which also checks every reference and stub): each must
get the hint that fits."""
import torch
import torch.distributed as dist


# ---- zero3_gather_forward: planted mistakes -----------------------------------

def run_with(module, flat, x):
    sizes = [p.numel() for p in module.parameters()]
    pieces = flat[:sum(sizes)].split(sizes)
    params = {n: piece.view(p.shape) for (n, p), piece
              in zip(module.named_parameters(), pieces)}
    return torch.func.functional_call(module, params, (x,))


def shard_only(module, shard, x):
    sizes = [p.numel() for p in module.parameters()]
    params = dict(zip([n for n, _ in module.named_parameters()],
                      shard.split(sizes)))  # too short: raises
    return torch.func.functional_call(module, params, (x,))


def keeps_the_full_params(module, shard, x):
    full = shard.new_empty(shard.numel() * dist.get_world_size())
    dist.all_gather_single(full, shard)
    module.gathered = full  # "cached" for next time: never freed
    return run_with(module, full, x)


def own_shard_first(module, shard, x):
    chunks = [torch.empty_like(shard) for _ in range(dist.get_world_size())]
    dist.all_gather(chunks, shard)
    rank = dist.get_rank()
    full = torch.cat([shard] + [c for r, c in enumerate(chunks) if r != rank])
    return run_with(module, full, x)


def padding_kept(module, shard, x):
    full = shard.new_empty(shard.numel() * dist.get_world_size())
    dist.all_gather_single(full, shard)
    sizes = [p.numel() for p in module.parameters()]
    params = dict(zip([n for n, _ in module.named_parameters()],
                      full.split(sizes)))  # 59 of 60 elements: raises
    return torch.func.functional_call(module, params, (x,))


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("zero3_gather_forward", shard_only, "all-gather every rank's shard first"),
    ("zero3_gather_forward", keeps_the_full_params, "still held after it returned"),
    ("zero3_gather_forward", own_shard_first, "the chunks are out of order"),
    ("zero3_gather_forward", padding_kept, "padded to a multiple of the world size"),
]
