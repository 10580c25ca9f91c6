"""Notebook 08's planted mistakes for the column-parallel layer (PLANTED,
run by test_registry.py, which also checks every reference and stub): each
must get the hint that fits. The last three are the second attempt's
mistakes: the gathered list used as it comes (no gradient reaches the
shards), torch.distributed.nn.functional.all_gather (whose backward adds
every rank's copy), and the weights gathered instead of the outputs."""
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
import torch.nn.functional as F


def local_slice_only(x, weight_shard, bias_shard):
    return F.linear(x, weight_shard, bias_shard)


def _gathered(local):
    slices = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(slices, local.detach())
    slices[dist.get_rank()] = local
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


# ---- the second attempt ---------------------------------------------------------

def gathered_list_as_it_comes(x, weight_shard, bias_shard):
    local = F.linear(x, weight_shard, bias_shard)
    slices = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(slices, local.detach())  # outside autograd, own slot too
    return torch.cat(slices, dim=-1)


def differentiable_all_gather(x, weight_shard, bias_shard):
    local = F.linear(x, weight_shard, bias_shard)
    return torch.cat(dist_nn.all_gather(local), dim=-1)  # backward: a SUM over ranks


def gathers_the_weights(x, weight_shard, bias_shard):
    weights = [torch.empty_like(weight_shard) for _ in range(dist.get_world_size())]
    biases = [torch.empty_like(bias_shard) for _ in range(dist.get_world_size())]
    dist.all_gather(weights, weight_shard.detach())
    dist.all_gather(biases, bias_shard.detach())
    return F.linear(x, torch.cat(weights), torch.cat(biases))


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("column_parallel_linear", wrong_dim, "along dim 0"),
    ("column_parallel_linear", no_bias, "bias is missing"),
    ("column_parallel_linear", all_reduce_instead, "all_reduce ADDED"),
    ("column_parallel_linear", local_slice_only, "only this rank's slice"),
    ("column_parallel_linear", reversed_order, "wrong order"),
    ("column_parallel_linear", gathered_list_as_it_comes, "never reaches weight_shard"),
    ("column_parallel_linear", differentiable_all_gather, "world_size times too large"),
    ("column_parallel_linear", gathers_the_weights, "the weights were gathered"),
]
