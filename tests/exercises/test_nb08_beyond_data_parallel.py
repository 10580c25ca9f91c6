"""Notebook 08's planted mistakes (PLANTED, run by test_registry.py, which
also checks every reference and stub): each must get the hint that fits."""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddp_teach.paramserver import sync_update


def _accumulate(server, grads):
    for total, grad in zip(server.pending, grads):
        total += grad
    server.pushes += 1


def _step(server, scale):
    for param, total in zip(server.params, server.pending):
        param.grad = total * scale
    server.optimizer.step()


def steps_every_push(server, grads):
    for param, grad in zip(server.params, grads):
        param.grad = grad
    server.optimizer.step()
    return True


def sums(server, grads):
    _accumulate(server, grads)
    if server.pushes < server.num_workers:
        return False
    _step(server, 1.0)
    for total in server.pending:
        total.zero_()
    server.pushes = 0
    return True


def keeps_accumulator(server, grads):
    _accumulate(server, grads)
    if server.pushes < server.num_workers:
        return False
    _step(server, 1 / server.num_workers)
    server.pushes = 0
    return True


def keeps_count(server, grads):
    _accumulate(server, grads)
    if server.pushes != server.num_workers:
        return False
    _step(server, 1 / server.num_workers)
    for total in server.pending:
        total.zero_()
    return True


def returns_nothing(server, grads):
    sync_update(server, grads)


def local_slice_only(x, weight_shard, bias_shard):
    return F.linear(x, weight_shard, bias_shard)


def _gathered(local):
    slices = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(slices, local)
    return slices


def wrong_dim(x, weight_shard, bias_shard):
    return torch.cat(_gathered(F.linear(x, weight_shard, bias_shard)), dim=0)


def no_bias(x, weight_shard, bias_shard):
    return torch.cat(_gathered(F.linear(x, weight_shard)), dim=-1)


def all_reduce_instead(x, weight_shard, bias_shard):
    local = F.linear(x, weight_shard, bias_shard)
    dist.all_reduce(local)
    return local


def reversed_order(x, weight_shard, bias_shard):
    slices = _gathered(F.linear(x, weight_shard, bias_shard))
    return torch.cat(slices[::-1], dim=-1)


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("param_server_update", steps_every_push, "waits until EVERY worker"),
    ("param_server_update", sums, "SUM of the workers' gradients"),
    ("param_server_update", keeps_accumulator, "zero server.pending"),
    ("param_server_update", keeps_count, "server.pushes back to 0"),
    ("param_server_update", returns_nothing, "did not return True"),
    ("column_parallel_linear", wrong_dim, "along dim 0"),
    ("column_parallel_linear", no_bias, "bias is missing"),
    ("column_parallel_linear", all_reduce_instead, "all_reduce ADDED"),
    ("column_parallel_linear", local_slice_only, "only this rank's slice"),
    ("column_parallel_linear", reversed_order, "wrong order"),
]

