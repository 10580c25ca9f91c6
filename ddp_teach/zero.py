"""ZeRO stages 1 and 2 from scratch: shard what plain data parallelism repeats.

Plain data parallelism keeps the whole optimizer state, the whole gradient and
the whole set of parameters on every rank. ZeRO (Rajbhandari et al., "ZeRO:
Memory Optimizations Toward Training Trillion Parameter Models", SC'20,
arXiv:1910.02054) notices that each rank only needs to *update* 1/N of them:

* Stage 1 (P_os), `ShardedOptimizer`: lay all parameters end to end as one flat
  vector, pad it to a multiple of the world size N, and let rank r own the
  contiguous chunk [r*S, (r+1)*S), S = ceil(numel / N). The optimizer runs
  on that chunk only, so its state (Adam's two moments) is 1/N per rank;
  after the update an all-gather hands every rank everyone's new chunk.
* Stage 2 (P_os+g), `Zero2DataParallel`: gradients are reduce-scattered instead
  of all-reduced, so each rank ends backward holding only the averaged
  gradient of its own chunk; the full gradients are freed.
* Stage 3 (P_os+g+p) shards the parameters too: `FullyShardedDataParallel`,
  in fsdp.py, re-exported here.

Clipping the gradient by its norm needs the norm of the whole gradient,
which no rank holds once it is sharded: `clip_sharded_grad_norm_`.

Parameters become views into one flat buffer (like FSDP's FlatParameter, Zhao
et al., "PyTorch FSDP", VLDB 2023, arXiv:2304.11277), and the shard the
optimizer steps is a slice of that same buffer: the update lands directly in
the model's memory, and sharding costs no extra copy of the parameters.
"""
import torch
import torch.distributed as dist
from torch import nn

from ddp_teach.flat import flat_slice, shard_size, unflatten
from ddp_teach.fsdp import FullyShardedDataParallel
from ddp_teach.memory import measure_model_bytes
from ddp_teach.tracing import COMM, labelled


def _trainable_tensors(params) -> list:
    """`params` (a generator is fine) as a list of distinct tensors that
    require gradients, or a ValueError that says what was wrong."""
    if isinstance(params, torch.Tensor):
        raise ValueError("params must be an iterable of tensors, e.g. "
                         "model.parameters(), not a single tensor")
    params = list(params)  # a generator can be read only once
    if any(isinstance(p, dict) for p in params):
        raise ValueError("parameter groups (dicts) are not supported: pass the "
                         "tensors themselves, e.g. model.parameters(); every "
                         "parameter shares one set of optimizer settings")
    if not all(isinstance(p, torch.Tensor) for p in params):
        kinds = sorted({type(p).__name__ for p in params})
        raise ValueError(f"params must be tensors, got {', '.join(kinds)}")
    params = [p for p in dict.fromkeys(params) if p.requires_grad]
    if not params:
        raise ValueError("no parameters that require gradients were given")
    kinds = {(p.dtype, p.device) for p in params}
    if len(kinds) > 1:
        raise ValueError(f"every parameter must have one dtype and device to "
                         f"be flattened together, got {sorted(map(str, kinds))}; "
                         f"convert the model first, e.g. model.float()")
    return params


def zero1_step(flat_params, flat_grads, shard, optimizer) -> None:
    """ZeRO-1's step in one function (notebook 06's exercise): put this rank's
    chunk [r*S, (r+1)*S) of the averaged `flat_grads` in `shard.grad`, step
    `optimizer` (which holds state for the shard only: the 1/N of ZeRO-1),
    then all-gather every rank's updated shard into `flat_params`.
    `ShardedOptimizer` below is the same step for a real model, whose
    gradients it slices without building the flat vector (Rajbhandari et
    al. 2020, P_os).
    """
    rank, world_size = dist.get_rank(), dist.get_world_size()
    size = flat_params.numel() // world_size
    shard.grad = flat_grads[rank * size:(rank + 1) * size].clone()
    optimizer.step()
    with torch.no_grad():
        dist.all_gather_single(flat_params, shard.detach())


def gathered_forward(module: nn.Module, shard, x):
    """ZeRO-3 around one unit's forward (notebook 06's exercise): all-gather
    the unit's flat parameters from every rank's `shard`, cut them into the
    module's parameters (the padding at the end goes), run the module with
    them (`torch.func.functional_call`, so `module` may be on the meta
    device) and keep nothing but the output: the full parameters are freed
    on return. `FullyShardedDataParallel` (fsdp.py) does this per unit, and
    again in backward.
    """
    full = shard.new_empty(shard.numel() * dist.get_world_size())
    dist.all_gather_single(full, shard)  # every rank's shard, in rank order
    names = [name for name, _ in module.named_parameters()]
    views = unflatten(full, [p.shape for p in module.parameters()])
    output = torch.func.functional_call(module, dict(zip(names, views)), (x,))
    del full, views  # only the shard stays
    return output


class ShardedOptimizer:
    """ZeRO-1: `optimizer_cls` runs on this rank's 1/N of the parameters.

    Use it where the plain optimizer would go, with gradients already averaged
    over ranks (by DDP, ours or torch's): the result is identical to the
    unsharded optimizer for element-wise optimizers (SGD, Adam, AdamW...).
    Every rank must hold the same parameters (DDP broadcast them). Their
    storage moves into one flat buffer, `self.flat` (each `param.data`
    becomes a view of it), and `self.shard` is this rank's slice of that
    buffer. Parameters that do not require gradients are left out, as torch's
    optimizers never change them. Unlike torch's optimizers, which skip a
    parameter whose `.grad` is None, a shard cannot skip part of itself: such
    a parameter counts as having a zero gradient (weight decay and momentum
    still move it); the step is skipped only when no parameter has a
    gradient, which must then hold on every rank. Learning-rate schedulers
    go on `.optimizer`, the inner optimizer.

    Communication: after DDP's all-reduce (2 Psi in the paper's count) the
    all-gather adds Psi, 3 Psi per step, as with torch's
    ZeroRedundancyOptimizer. The paper's stage 1 reduce-scatters the
    gradients instead (Psi), since a rank only needs its own chunk of them:
    2 Psi, no more than plain DP. `Zero2DataParallel` does exactly that.
    """

    def __init__(self, params, optimizer_cls, **optimizer_kwargs):
        self.params = _trainable_tensors(params)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        numel = sum(p.numel() for p in self.params)
        size = shard_size(numel, self.world_size)
        self.shard_range = (self.rank * size, (self.rank + 1) * size)
        self.flat = flat_slice(self.params, 0, size * self.world_size)
        with torch.no_grad():
            for param, view in zip(self.params, unflatten(
                    self.flat, [p.shape for p in self.params])):
                param.data = view  # the model's parameters now live in self.flat
        self.shard = nn.Parameter(self.flat[self.shard_range[0]:self.shard_range[1]])
        self.optimizer = optimizer_cls([self.shard], **optimizer_kwargs)

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    @torch.no_grad()
    def step(self, closure=None):
        """Take this rank's slice of the gradients, update the shard, and
        all-gather every rank's updated shard into the parameters. Under
        ZeRO-2 the params have no gradients left, only the shard has."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grads = [p.grad for p in self.params]
        if all(grad is None for grad in grads):
            if self.shard.grad is not None:  # ZeRO-2 left it on the shard
                self.step_shard()
            return loss
        grads = [torch.zeros_like(p) if g is None else g
                 for p, g in zip(self.params, grads)]
        self.shard.grad = flat_slice(grads, *self.shard_range)
        self.step_shard()
        self.shard.grad = None  # a copy: the gradients stay in the params' .grad
        return loss

    @torch.no_grad()
    def step_shard(self) -> None:
        """Update the shard from `shard.grad`, then all-gather the shards into
        the flat buffer that the parameters are views of (gloo wants the input
        apart from the output, hence the clone of the shard)."""
        self.optimizer.step()
        with labelled("zero all-gather parameters"):
            dist.all_gather_single(self.flat, self.shard.detach().clone())

    def zero_grad(self, set_to_none: bool = True) -> None:
        for param in self.params:
            if set_to_none:
                param.grad = None
            elif param.grad is not None:
                param.grad.zero_()
        self.shard.grad = None


class Zero2DataParallel(nn.Module):
    """ZeRO-2: a module wrapper whose ranks keep only their gradient shard.

    Construction broadcasts rank 0's parameters and buffers (as DDP does) and
    builds a `ShardedOptimizer(module.parameters(), optimizer_cls, ...)`.
    When backward ends (an autograd engine callback queued by the first
    gradient hook), the full gradients are flattened and reduce-scattered:
    each rank receives the sum of its own chunk, divides by N, keeps it as
    the shard's gradient, and frees the full gradients (`param.grad = None`).
    So gradient memory after backward is 1/N per rank. The paper reduces
    bucket by bucket while backward runs, so that at most one bucket of full
    gradients exists at once; here, for readability, they all exist until
    backward ends. Several backward passes before `step()` accumulate.
    """

    def __init__(self, module: nn.Module, optimizer_cls, **optimizer_kwargs):
        super().__init__()
        self.module = module
        with torch.no_grad():
            for tensor in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(tensor.data, src=0)
        self.optimizer = ShardedOptimizer(module.parameters(), optimizer_cls,
                                          **optimizer_kwargs)
        self._reduce_queued = False
        for handle in getattr(module, "_zero2_hook_handles", []):
            handle.remove()  # wrapped again (a re-run cell): the old hooks go
        module._zero2_hook_handles = [
            param.register_post_accumulate_grad_hook(self._on_gradient_ready)
            for param in self.optimizer.params]

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _on_gradient_ready(self, _param) -> None:
        if not self._reduce_queued:
            self._reduce_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(
                self._reduce_scatter_gradients)

    @torch.no_grad()
    def _reduce_scatter_gradients(self) -> None:
        optimizer = self.optimizer
        grads = [torch.zeros_like(p) if p.grad is None else p.grad
                 for p in optimizer.params]
        flat_grads = flat_slice(grads, 0, optimizer.flat.numel())
        for param in optimizer.params:
            param.grad = None  # the full gradients go; only the shard stays
        grad_shard = torch.empty_like(optimizer.shard)
        with labelled("zero2 reduce-scatter gradients"):
            dist.reduce_scatter_single(grad_shard, flat_grads)
        grad_shard.div_(optimizer.world_size)
        if optimizer.shard.grad is None:
            optimizer.shard.grad = grad_shard
        else:
            optimizer.shard.grad += grad_shard
        self._reduce_queued = False

    def step(self) -> None:
        """Update this rank's shard, all-gather the parameters."""
        self.optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none)


@torch.no_grad()
def clip_sharded_grad_norm_(shard_grad: torch.Tensor, max_norm: float,
                            group=None) -> torch.Tensor:
    """`torch.nn.utils.clip_grad_norm_` when each rank holds only its shard
    of the gradient (ZeRO-2, ZeRO-3; notebook 06's exercise). The norm is
    the whole gradient's: the square root of the SUM over ranks of each
    shard's sum of squares (the padding's zeros add nothing); a shard's own
    norm would give every rank a different scale. Every shard is then
    multiplied in place by min(1, max_norm / (norm + 1e-6)), torch's rule.
    Returns the total norm, the same on every rank."""
    total = shard_grad.float().square().sum()
    dist.all_reduce(total, group=group)  # SUM: squares add, norms do not
    total = total.sqrt()
    shard_grad.mul_((max_norm / (total + 1e-6)).clamp(max=1.0))
    return total


def model_state_bytes(model: nn.Module, optimizer=None) -> dict:
    """`dt.memory.measure_model_bytes` for every stage: bytes of parameters,
    gradients and optimizer state this rank holds. `optimizer` is a torch
    optimizer, a `ShardedOptimizer`, or None for a `Zero2DataParallel` (which
    owns one). The optimizer's own parameters count too: under ZeRO-1 and 2
    that is the shard (a slice of the parameters' buffer, so counted once) and
    under ZeRO-2 its gradient is the only gradient left."""
    if optimizer is None:
        optimizer = model.optimizer
    if isinstance(optimizer, ShardedOptimizer):
        optimizer = optimizer.optimizer
    owned = [p for group in optimizer.param_groups for p in group["params"]]
    return measure_model_bytes(model, optimizer, extra_params=owned)


def paper_comm_volume(events, world_size: int) -> float:
    """Bytes a rank communicated, in the paper's convention (section 7): an
    all-reduce of Psi counts 2 Psi (a reduce-scatter plus an all-gather), an
    all-gather or reduce-scatter counts the full array, Psi.

    An event's `nbytes` is its collective's whole array, Psi, in a traced
    and in a simulated run alike (`ddp_teach.tracing.operations`), and its
    `op` says which collective it was, whatever its name ("ddp bucket 0",
    "unit 0 all-gather"); anything else (the broadcast at construction) is
    left out. `world_size` is checked, as the count this volume is per rank of.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1; got {world_size!r}")
    arrays = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}
    return float(sum(arrays.get(e.op, 0) * e.nbytes for e in events if e.kind == COMM))



__all__ = ["ShardedOptimizer", "Zero2DataParallel", "FullyShardedDataParallel",
           "shard_size", "flat_slice", "unflatten", "model_state_bytes",
           "paper_comm_volume", "zero1_step", "gathered_forward"]
