"""Tensor parallelism: split each weight matrix across ranks.

Pipeline parallelism cuts the model between layers; tensor parallelism cuts
*inside* a layer, so that no rank ever holds a whole weight matrix
(Shoeybi et al., "Megatron-LM: Training Multi-Billion Parameter Language
Models Using Model Parallelism", 2019, arXiv:1909.08053). A linear layer
y = x W^T + b with W of shape (out, in) splits two ways:

- **column-parallel**: rank r holds rows r of W (a slice of the *outputs*,
  "columns" of W^T) and the matching slice of b. Every rank has the whole
  input x, computes its slice of y with no communication, and an
  all-gather along the feature dimension assembles y.
- **row-parallel**: rank r holds columns r of W (a slice of the *inputs*)
  and gets the matching slice of x. It computes a partial y over its inputs;
  an all-reduce sums the partials; the bias is added once, after the sum.

Megatron's MLP chains the two: column-parallel first (its output stays split,
which is exactly the input a row-parallel layer wants, and an element-wise
activation such as GeLU works on slices), row-parallel second. One
all-reduce in forward and one in backward per MLP, of batch x hidden
values each, whatever the number of ranks. In autograd those are the
paper's two conjugate operators: f (identity forward, all-reduce backward)
and g (all-reduce forward, identity backward).
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def shard(tensor, dim: int, rank: int, world_size: int):
    """Rank `rank`'s equal slice of `tensor` along `dim` (a copy)."""
    if tensor.shape[dim] % world_size:
        raise ValueError(f"dimension {dim} of size {tensor.shape[dim]} does "
                         f"not split into {world_size} equal parts")
    return tensor.chunk(world_size, dim=dim)[rank].clone()


def column_parallel_forward(x, weight_shard, bias_shard):
    """y = x W^T + b with W split by rows (output features) across ranks:
    this rank's slice of the outputs, then an all-gather, the slices placed
    in rank order along the last (feature) dimension (notebook 10's
    exercise). `dist.all_gather` fills its list outside autograd, so this
    rank's own slot gets `local` itself: backward through the output then
    gives `weight_shard` and `bias_shard` the gradient of their own output
    features, Megatron's gather whose backward keeps this rank's part (the
    ranks compute one loss from one output; x's gradient would need the f
    operator below)."""
    local = F.linear(x, weight_shard, bias_shard)
    slices = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(slices, local.detach().contiguous())
    slices[dist.get_rank()] = local  # this rank's slice stays in the graph
    return torch.cat(slices, dim=-1)


def row_parallel_forward(x_shard, weight_shard, bias):
    """y = x W^T + b with W split by columns (input features) and x split to
    match: a partial sum per rank, all-reduced, and the bias added once."""
    partial = F.linear(x_shard, weight_shard)
    dist.all_reduce(partial)
    return partial + bias


class _CopyToParallel(torch.autograd.Function):
    """Megatron's f: identity in forward; backward all-reduces the gradient,
    because every rank used the same input for a different slice."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad


class _ReduceFromParallel(torch.autograd.Function):
    """Megatron's g: all-reduce the partial sums in forward; identity in
    backward (each rank's partial had the same weight in the sum)."""

    @staticmethod
    def forward(ctx, partial):
        partial = partial.clone()
        dist.all_reduce(partial)
        return partial

    @staticmethod
    def backward(ctx, grad):
        return grad


class ColumnParallelLinear(nn.Module):
    """This rank's rows of `linear`; with `gather_output=False` the output
    stays split (the input of a RowParallelLinear)."""

    def __init__(self, linear: nn.Linear, gather_output: bool = True):
        super().__init__()
        rank, world = dist.get_rank(), dist.get_world_size()
        self.weight = nn.Parameter(shard(linear.weight.detach(), 0, rank, world))
        self.bias = nn.Parameter(shard(linear.bias.detach(), 0, rank, world))
        self.gather_output = gather_output

    def forward(self, x):
        local = F.linear(_CopyToParallel.apply(x), self.weight, self.bias)
        if not self.gather_output:
            return local
        slices = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(slices, local.detach().contiguous())
        slices[dist.get_rank()] = local  # keep this rank's slice in the graph
        return torch.cat(slices, dim=-1)


class RowParallelLinear(nn.Module):
    """This rank's columns of `linear`; takes the split input, sums the
    partial outputs with one all-reduce, adds the (whole) bias once."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        rank, world = dist.get_rank(), dist.get_world_size()
        self.weight = nn.Parameter(shard(linear.weight.detach(), 1, rank, world))
        self.bias = nn.Parameter(linear.bias.detach().clone())

    def forward(self, x_shard):
        return _ReduceFromParallel.apply(F.linear(x_shard, self.weight)) + self.bias


class ParallelMLP(nn.Module):
    """Megatron's MLP from a whole `nn.Sequential(Linear, GELU, Linear)`:
    column-parallel, GeLU on the slices, row-parallel."""

    def __init__(self, mlp: nn.Sequential):
        super().__init__()
        up, activation, down = mlp
        self.up = ColumnParallelLinear(up, gather_output=False)
        self.activation = activation
        self.down = RowParallelLinear(down)

    def forward(self, x):
        return self.down(self.activation(self.up(x)))


def megatron_mlp_bytes(batch_rows: int, hidden: int, element_size: int = 4) -> int:
    """Bytes each rank all-reduces per step for one parallel MLP: one
    batch x hidden tensor in forward (g) and one in backward (f)."""
    return 2 * batch_rows * hidden * element_size
