"""SyncBatchNorm from scratch: batch norm over the GLOBAL batch, on CPU too.

Under data parallelism each rank sees only its share of the batch, so plain
BatchNorm normalises with statistics of a few samples. SyncBatchNorm (Peng
et al., "MegDet", CVPR 2018; torch's `nn.SyncBatchNorm`, which refuses CPU
tensors) makes every rank normalise with the mean and variance of the whole
batch, as one process holding all of it would:

Forward: each rank sums count, sum(x) and sum(x^2) per channel; ONE
all-reduce of those three concatenated gives the global sums, hence the mean
and the biased variance E[x^2] - E[x]^2. Counts are summed too, so ranks
may hold different numbers of samples (even none).

Backward: with x_hat = (x - mean) * invstd and g the gradient at x_hat,
    dL/dx = invstd * (g - mean(g) - x_hat * mean(g * x_hat))
where both means run over the global batch; so backward needs ONE more
all-reduce, of sum(g) and sum(g * x_hat) per channel. That is the hand-written
autograd Function below (not torch.distributed.nn's differentiable
all-reduce). Weight and bias gradients stay local, like every other
parameter's: DDP averages them.

Running statistics follow BatchNorm: running_var is updated with the
UNBIASED global variance (times count / (count - 1)). In eval mode, or with
no process group or a world of one, this is plain batch norm. Only the
default process group is used. E[x^2] - E[x]^2 loses precision when the mean
is large against the spread; torch combines per-rank Welford statistics
instead.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def global_batch_stats(x: torch.Tensor):
    """Per-channel (mean, biased variance, count) of `x` (shape (N, C) or
    (N, C, *)) over the batch of ALL ranks, with one all-reduce (none
    without a process group). `count` is an int: samples times positions."""
    channels = x.shape[1]
    dims = [d for d in range(x.dim()) if d != 1]
    count = torch.full((1,), x.numel() // channels, dtype=x.dtype, device=x.device)
    sums = torch.cat([count, x.sum(dims), (x * x).sum(dims)])
    if _distributed():
        dist.all_reduce(sums)
    count = int(round(sums[0].item()))
    if count == 0:
        raise ValueError("batch norm got an empty batch on every rank")
    mean = sums[1:1 + channels] / count
    var = (sums[1 + channels:] / count - mean * mean).clamp_(min=0)
    return mean, var, count


class _NormalizeWithGlobalStats(torch.autograd.Function):
    """x -> (x - mean) * invstd, where mean and invstd are the global batch's;
    the backward accounts for their dependence on every rank's x."""

    @staticmethod
    def forward(ctx, x, mean, invstd, count):
        x_hat = (x - _per_channel(mean, x)) * _per_channel(invstd, x)
        ctx.save_for_backward(x_hat, invstd)
        ctx.count = count
        return x_hat

    @staticmethod
    def backward(ctx, grad):
        x_hat, invstd = ctx.saved_tensors
        dims = [d for d in range(grad.dim()) if d != 1]
        sums = torch.cat([grad.sum(dims), (grad * x_hat).sum(dims)])
        dist.all_reduce(sums)  # so every rank must run backward (its x
        # requires grad, or on no rank does it)
        mean_grad, mean_grad_x_hat = (sums / ctx.count).chunk(2)
        grad_x = _per_channel(invstd, grad) * (
            grad - _per_channel(mean_grad, grad)
            - x_hat * _per_channel(mean_grad_x_hat, grad))
        return grad_x, None, None, None


class SyncBatchNorm(nn.Module):
    """Batch norm whose training statistics are the global batch's, on any
    device; same arguments, parameters and buffers as nn.BatchNorm*d."""

    def __init__(self, num_features: int, eps: float = 1e-5,
                 momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        if affine:
            self.weight = nn.Parameter(torch.ones(num_features))
            self.bias = nn.Parameter(torch.zeros(num_features))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", torch.zeros(num_features))
            self.register_buffer("running_var", torch.ones(num_features))
            self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))
        else:
            self.running_mean = self.running_var = self.num_batches_tracked = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 2 or x.shape[1] != self.num_features:
            raise ValueError(f"expected input of shape (N, {self.num_features}) "
                             f"or (N, {self.num_features}, ...); got {tuple(x.shape)}")
        use_batch_stats = self.training or not self.track_running_stats
        update_running = self.training and self.track_running_stats
        factor = 0.0
        if update_running:
            self.num_batches_tracked += 1
            factor = (1.0 / self.num_batches_tracked.item() if self.momentum is None
                      else self.momentum)  # None: a cumulative average, as torch
        if not (use_batch_stats and _distributed()):
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight,
                                self.bias, use_batch_stats, factor, self.eps)
        with torch.no_grad():
            mean, var, count = global_batch_stats(x.detach())
            if count < 2:  # the same on every rank, so all of them raise
                raise ValueError("expected more than 1 value per channel in "
                                 f"the global batch when training; got {count}")
            if update_running:
                unbiased = var * count / (count - 1)
                self.running_mean.lerp_(mean.to(self.running_mean.dtype), factor)
                self.running_var.lerp_(unbiased.to(self.running_var.dtype), factor)
            invstd = torch.rsqrt(var + self.eps)
        out = _NormalizeWithGlobalStats.apply(x, mean, invstd, count)
        if self.affine:
            out = out * _per_channel(self.weight, out) + _per_channel(self.bias, out)
        return out

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, track_running_stats={self.track_running_stats}")

    @classmethod
    def convert(cls, module: nn.Module) -> nn.Module:
        """Replace every nn.BatchNorm1d/2d/3d (and nn.SyncBatchNorm) in
        `module` by a SyncBatchNorm that keeps its Parameter objects (an
        optimiser built earlier still updates them) and its buffers, as
        torch's convert_sync_batchnorm does. Returns the converted module
        (a new one only when `module` itself is a batch norm)."""
        if isinstance(module, BATCH_NORMS):
            converted = cls(module.num_features, module.eps, module.momentum,
                            module.affine, module.track_running_stats)
            if module.affine:
                converted.weight, converted.bias = module.weight, module.bias
            if module.track_running_stats:
                converted.running_mean = module.running_mean
                converted.running_var = module.running_var
                converted.num_batches_tracked = module.num_batches_tracked
            converted.train(module.training)
            return converted
        for name, child in module.named_children():
            setattr(module, name, cls.convert(child))
        return module


BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _per_channel(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Shape a per-channel vector to broadcast against `like` (N, C, *)."""
    return values.view(1, -1, *([1] * (like.dim() - 2)))
