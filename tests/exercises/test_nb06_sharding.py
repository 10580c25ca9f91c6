"""Notebook 06's planted mistakes for the ZeRO-1 step (PLANTED, run by
test_registry.py, which also checks every reference and stub): each must
get the hint that fits. The last four are the second attempt's mistakes,
one per property that the first list left unguarded."""
import torch
import torch.distributed as dist


def _my_slice(flat_grads, shard):
    rank, size = dist.get_rank(), shard.numel()
    return flat_grads[rank * size:(rank + 1) * size]


def every_rank_takes_chunk_0(flat_params, flat_grads, shard, optimizer):
    shard.grad = flat_grads[:shard.numel()].clone()
    optimizer.step()
    with torch.no_grad():
        dist.all_gather_single(flat_params, shard.detach())


def no_all_gather(flat_params, flat_grads, shard, optimizer):
    rank, size = dist.get_rank(), shard.numel()
    shard.grad = _my_slice(flat_grads, shard).clone()
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
    shard.grad = _my_slice(flat_grads, shard) / dist.get_world_size()  # twice
    optimizer.step()
    with torch.no_grad():
        dist.all_gather_single(flat_params, shard.detach())


def fresh_optimizer_each_step(flat_params, flat_grads, shard, optimizer):
    shard.grad = _my_slice(flat_grads, shard).clone()
    type(optimizer)([shard], lr=0.1).step()  # its state is lost every step
    with torch.no_grad():
        dist.all_gather_single(flat_params, shard.detach())


# ---- the second attempt ---------------------------------------------------------

def divides_flat_grads_in_place(flat_params, flat_grads, shard, optimizer):
    flat_grads /= dist.get_world_size()  # "averages" the caller's tensor again
    shard.grad = _my_slice(flat_grads, shard).clone()
    optimizer.step()
    with torch.no_grad():
        dist.all_gather_single(flat_params, shard.detach())


def rebinds_flat_params(flat_params, flat_grads, shard, optimizer):
    shard.grad = _my_slice(flat_grads, shard).clone()
    optimizer.step()
    chunks = [torch.empty_like(shard) for _ in range(dist.get_world_size())]
    dist.all_gather(chunks, shard.detach())
    flat_params = torch.cat(chunks)  # a new tensor under the old name  # noqa: F841


def gathers_before_step(flat_params, flat_grads, shard, optimizer):
    shard.grad = _my_slice(flat_grads, shard).clone()
    with torch.no_grad():
        dist.all_gather_single(flat_params, shard.detach())  # the old shards
    optimizer.step()


def grad_is_a_view(flat_params, flat_grads, shard, optimizer):
    shard.grad = _my_slice(flat_grads, shard)  # no copy: shares flat_grads' memory
    optimizer.step()
    with torch.no_grad():
        dist.all_gather_single(flat_params, shard.detach())


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("zero1_step", every_rank_takes_chunk_0, "every rank stepped with chunk 0"),
    ("zero1_step", no_all_gather, "the other ranks' chunks never changed"),
    ("zero1_step", gradient_reduced_again, "world_size times too large"),
    ("zero1_step", whole_vector_optimizer, "holds no state for the shard"),
    ("zero1_step", divides_again, "world_size times too small"),
    ("zero1_step", fresh_optimizer_each_step, "step the optimizer you were given"),
    ("zero1_step", divides_flat_grads_in_place, "flat_grads was changed in place"),
    ("zero1_step", rebinds_flat_params, "`flat_params = ...` only rebinds"),
    ("zero1_step", gathers_before_step, "BEFORE optimizer.step()"),
    ("zero1_step", grad_is_a_view, "shard.grad is a view into flat_grads"),
]
