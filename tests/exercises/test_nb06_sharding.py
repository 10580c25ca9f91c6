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


# ---- sharded_clip: planted mistakes -------------------------------------------

def local_norm(shard_grad, max_norm):
    norm = shard_grad.norm()  # this rank's shard only
    shard_grad.mul_((max_norm / (norm + 1e-6)).clamp(max=1.0))
    return norm


def norms_added(shard_grad, max_norm):
    norm = shard_grad.norm()
    dist.all_reduce(norm)  # norms do not add
    shard_grad.mul_((max_norm / (norm + 1e-6)).clamp(max=1.0))
    return norm


def squares_averaged(shard_grad, max_norm):
    total = shard_grad.square().sum()
    dist.all_reduce(total, op=dist.ReduceOp.AVG)
    norm = total.sqrt()
    shard_grad.mul_((max_norm / (norm + 1e-6)).clamp(max=1.0))
    return norm


def scales_up_too(shard_grad, max_norm):
    total = shard_grad.square().sum()
    dist.all_reduce(total)
    norm = total.sqrt()
    shard_grad.mul_(max_norm / (norm + 1e-6))  # no clamp: small gradients grow
    return norm


def not_in_place(shard_grad, max_norm):
    total = shard_grad.square().sum()
    dist.all_reduce(total)
    norm = total.sqrt()
    shard_grad = shard_grad * (max_norm / (norm + 1e-6)).clamp(max=1.0)  # a copy
    return norm


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("zero1_step", every_rank_takes_chunk_0, "every rank stepped with chunk 0"),
    ("zero1_step", no_all_gather, "the other ranks' chunks never changed"),
    ("zero1_step", gradient_reduced_again, "world_size times too large"),
    ("zero1_step", whole_vector_optimizer, "holds no state for the shard"),
    ("zero1_step", divides_again, "world_size times too small"),
    ("zero1_step", fresh_optimizer_each_step, "step the optimizer you were given"),
    ("sharded_clip", local_norm, "this rank's shard's norm"),
    ("sharded_clip", norms_added, "norms do not add"),
    ("sharded_clip", squares_averaged, "were averaged"),
    ("sharded_clip", scales_up_too, "never above 1"),
    ("sharded_clip", not_in_place, "not changed"),
]

