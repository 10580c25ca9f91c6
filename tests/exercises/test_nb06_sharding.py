"""Notebook 06's planted mistakes (PLANTED, run by test_registry.py, which
also checks every reference and stub): each must get the hint that fits."""
import torch
import torch.distributed as dist


# ---- zero1_step: planted mistakes ---------------------------------------------

def every_rank_takes_chunk_0(flat_params, flat_grads, shard, optimizer):
    shard.grad = flat_grads[:shard.numel()].clone()
    optimizer.step()
    with torch.no_grad():
        dist.all_gather_single(flat_params, shard.detach())


def no_all_gather(flat_params, flat_grads, shard, optimizer):
    rank, size = dist.get_rank(), shard.numel()
    shard.grad = flat_grads[rank * size:(rank + 1) * size].clone()
    optimizer.step()
    with torch.no_grad():  # only this rank's own chunk is written back
        flat_params[rank * size:(rank + 1) * size] = shard


def gradient_reduced_again(flat_params, flat_grads, shard, optimizer):
    shard.grad = torch.empty_like(shard)
    dist.reduce_scatter_single(shard.grad, flat_grads)  # sums, not averages
    optimizer.step()
    with torch.no_grad():
        dist.all_gather_single(flat_params, shard.detach())


def whole_vector_optimizer(flat_params, flat_grads, shard, optimizer, _made={}):
    """Right numbers, but the optimizer state covers every element."""
    if id(optimizer) not in _made:  # the same settings, over everything
        whole = type(optimizer)([flat_params])
        whole.param_groups[0].update({k: v for k, v in optimizer.param_groups[0]
                                      .items() if k != "params"})
        _made[id(optimizer)] = whole
    flat_params.grad = flat_grads
    _made[id(optimizer)].step()


def divides_again(flat_params, flat_grads, shard, optimizer):
    rank, world_size, size = dist.get_rank(), dist.get_world_size(), shard.numel()
    shard.grad = flat_grads[rank * size:(rank + 1) * size] / world_size  # twice
    optimizer.step()
    with torch.no_grad():
        dist.all_gather_single(flat_params, shard.detach())


def fresh_optimizer_each_step(flat_params, flat_grads, shard, optimizer):
    rank, size = dist.get_rank(), shard.numel()
    shard.grad = flat_grads[rank * size:(rank + 1) * size].clone()
    type(optimizer)([shard], lr=0.1).step()  # its state is lost every step
    with torch.no_grad():
        dist.all_gather_single(flat_params, shard.detach())


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
    ("zero1_step", every_rank_takes_chunk_0, "every rank stepped with chunk 0"),
    ("zero1_step", no_all_gather, "the other ranks' chunks never changed"),
    ("zero1_step", gradient_reduced_again, "world_size times too large"),
    ("zero1_step", whole_vector_optimizer, "holds no state for the shard"),
    ("zero1_step", divides_again, "world_size times too small"),
    ("zero1_step", fresh_optimizer_each_step, "step the optimizer you were given"),
    ("zero3_gather_forward", shard_only, "no all-gather was called"),
    ("zero3_gather_forward", keeps_the_full_params, "still held after it returned"),
    ("zero3_gather_forward", own_shard_first, "the chunks are out of order"),
    ("zero3_gather_forward", padding_kept, "padded to a multiple of the world size"),
]

