"""FullyShardedDataParallel: gather a unit for its forward, again for its
backward, reduce-scatter its gradient, free it.

The all-gather is an autograd Function (`_GatherParams`) whose backward
reduce-scatters, so the gradients arrive sharded. Backward needs the full
parameters again (a Linear's input gradient is grad_output @ weight);
autograd would keep the gathered tensors alive in its saved tensors until
then, undoing the sharding, so a `saved_tensors_hooks` pack hook replaces
every saved view of a gathered unit by a note (which unit; offset, shape,
strides), and the unpack hook re-gathers that unit when backward first needs
it. Prefetching (FSDP's backward prefetch): when a unit is re-gathered in
backward, start the asynchronous all-gather of the unit backward will need
next (the reverse of the forward order), so communication overlaps compute.

A unit whose saved tensors hold no parameter (the first layer, whose input
needs no gradient) is not re-gathered in backward unless the prefetch of it
already started. A unit's parameters exist only during its own forward: code
elsewhere that reads them (the root using `self.embed.weight`) needs both in
one unit. The root unit is gathered around the whole forward and
reduce-scattered last; FSDP2 also keeps its root whole.
"""
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ddp_teach.flat import unflatten
from ddp_teach.fsdp.replicated import ReplicatedParams
from ddp_teach.fsdp.units import (SHARD_NAME, FlatParamUnit,
                                  check_one_kind_per_unit, parameters_by_unit,
                                  unit_names)

REST = {"shard": "one more unit, the root's, sharded like the others",
        "replicate": "kept whole on every rank, gradients all-reduced"}


class _GatherParams(torch.autograd.Function):
    """shard -> full flat parameters; backward: full gradient -> shard's."""

    @staticmethod
    def forward(ctx, shard, fsdp, unit):
        ctx.fsdp, ctx.unit = fsdp, unit
        full, _ = unit.all_gather()
        return full

    @staticmethod
    def backward(ctx, grad_full):
        ctx.fsdp._queue_end_of_backward()
        grad_shard = ctx.unit.reduce_scatter(grad_full)
        ctx.fsdp._free(ctx.unit)  # backward is done with this unit
        return grad_shard, None, None


@dataclass
class _SavedParamView:
    """What the pack hook keeps instead of a view of a unit's full params."""
    unit: FlatParamUnit
    offset: int
    size: torch.Size
    stride: tuple


def cast_floats(value, dtype: torch.dtype):
    """`value` with every floating-point tensor in it (in tuples, lists and
    dicts) cast to `dtype`: a layer's inputs must match its weights' dtype."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(cast_floats(v, dtype) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(cast_floats(v, dtype) for v in value)
    if isinstance(value, dict):
        return {key: cast_floats(v, dtype) for key, v in value.items()}
    return value


def _check_dtype(argument: str, dtype) -> None:
    if dtype is not None and not (isinstance(dtype, torch.dtype)
                                  and dtype.is_floating_point):
        raise ValueError(f"{argument} must be a floating-point torch.dtype "
                         f"(e.g. torch.bfloat16) or None, not {dtype!r}")


class FullyShardedDataParallel(nn.Module):
    """ZeRO-3 on the default process group: wrap, then build any optimizer
    over `.parameters()` (the shards, and any replicated parameters).

    `units`: submodule names to make units of, or a policy
    `(name, module) -> bool` (the outermost match wins); default: each
    direct child that has parameters. `prefetch`: in backward, start
    gathering the next unit while the current one computes. `rest`: what
    happens to parameters outside every unit: "shard" (one more unit, the
    root's) or "replicate" (every rank keeps them whole; their gradients are
    all-reduced at the end of backward).
    `compute_dtype` (e.g. torch.bfloat16): units are gathered and compute in
    it, and their inputs are cast to it; the shards stay in their dtype.
    Replicated modules keep their parameters' dtype, inputs cast to it.
    `reduce_dtype`: the dtype gradients are reduce-scattered in (default:
    compute_dtype). These two are FSDP2's MixedPrecisionPolicy(param_dtype,
    reduce_dtype)."""

    def __init__(self, module: nn.Module, *, units=None, prefetch: bool = True,
                 rest: str = "shard", compute_dtype=None, reduce_dtype=None):
        super().__init__()
        if any(SHARD_NAME in m._parameters for m in module.modules()):
            raise ValueError("this module is already wrapped by "
                             "FullyShardedDataParallel; wrap a fresh one")
        if rest not in REST:
            raise ValueError(f"rest={rest!r}: the parameters outside every "
                             f"unit are either " + " or ".join(
                                 f"{key!r} ({what})" for key, what in REST.items()))
        _check_dtype("compute_dtype", compute_dtype)
        _check_dtype("reduce_dtype", reduce_dtype)
        self.module, self.prefetch = module, prefetch
        self.compute_dtype = compute_dtype
        entries_by_unit = parameters_by_unit(module, unit_names(module, units))
        outside = entries_by_unit.pop("", []) if rest == "replicate" else []
        check_one_kind_per_unit(entries_by_unit)
        with torch.no_grad():
            for buffer in module.buffers():
                dist.broadcast(buffer, src=0)
        self.param_names = [name for name, _ in module.named_parameters()]
        self.units = [self._make_unit(name, entries, compute_dtype, reduce_dtype)
                      for name, entries in entries_by_unit.items()]
        self.replicated = ReplicatedParams(outside)
        for param in self.replicated.trainable:
            param.register_post_accumulate_grad_hook(
                lambda _param: self._queue_end_of_backward())
        if compute_dtype is not None:
            for owner in self.replicated.owners:
                if owner is not module:
                    dtype = next(owner.parameters(recurse=False)).dtype
                    owner.register_forward_pre_hook(
                        lambda _m, args, dtype=dtype: cast_floats(args, dtype))
        self._root_unit = next((u for u in self.units if u.name == "(root)"), None)
        self._forward_order = []
        self._end_of_backward_queued = False

    def _make_unit(self, unit_name, entries, compute_dtype, reduce_dtype):
        unit = FlatParamUnit(unit_name, entries, compute_dtype=compute_dtype,
                             reduce_dtype=reduce_dtype)
        for slots in unit.slots:
            for owner, attribute in slots:
                del owner._parameters[attribute]
                setattr(owner, attribute, None)  # no weights between uses
        unit_module = self.module.get_submodule(unit_name)
        unit_module.register_parameter(SHARD_NAME, unit.shard)
        if unit_name:  # the root unit is gathered around the whole forward
            unit_module.register_forward_pre_hook(
                lambda _m, args: self._gather_for_forward(unit, args))
            unit_module.register_forward_hook(
                lambda _m, _args, _out: self._free(unit))
        return unit

    def forward(self, *args, **kwargs):
        self._forward_order = []
        if self.compute_dtype is not None:
            args, kwargs = cast_floats((args, kwargs), self.compute_dtype)
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            if self._root_unit is not None:
                self._gather_for_forward(self._root_unit)
            try:
                return self.module(*args, **kwargs)
            finally:
                if self._root_unit is not None:
                    self._free(self._root_unit)

    def _gather_for_forward(self, unit: FlatParamUnit, args=None):
        """Gather `unit` and point its modules at the views; returns the
        module's inputs cast to the compute dtype, if there is one (a
        forward pre-hook's return value replaces the inputs)."""
        unit.full = _GatherParams.apply(unit.shard, self, unit)
        unit.set_module_attributes(unflatten(unit.full, unit.shapes))
        if unit is not self._root_unit:  # gathered first, but used anywhere
            self._forward_order.append(unit)
        if args is not None and self.compute_dtype is not None:
            return cast_floats(args, self.compute_dtype)
        return None

    def _free(self, unit: FlatParamUnit) -> None:
        """Drop the unit's full parameters: the module's views, the buffer,
        and a prefetch of them that turned out not to be needed."""
        unit.set_module_attributes([None] * len(unit.slots))
        self._wait_for_prefetch(unit)
        unit.full = None

    def _pack(self, tensor):
        """Saved for backward: a view of gathered parameters becomes a note.
        (A view is known by its base, not by its memory address: that also
        holds on the meta device, where tensors have no memory.)"""
        base = tensor if tensor._base is None else tensor._base
        for unit in self.units:
            if unit.full is not None and base is unit.full:
                return _SavedParamView(unit, tensor.storage_offset(),
                                       tensor.size(), tensor.stride())
        return tensor

    def _unpack(self, saved):
        if not isinstance(saved, _SavedParamView):
            return saved
        full = self._gather_for_backward(saved.unit)
        return full.as_strided(saved.size, saved.stride, saved.offset)

    def _gather_for_backward(self, unit: FlatParamUnit) -> torch.Tensor:
        self._queue_end_of_backward()
        if unit.full is None:
            unit.full = self._wait_for_prefetch(unit)
            if unit.full is None:
                unit.full, _ = unit.all_gather()
            if self.prefetch:
                self._prefetch_after(unit)
        return unit.full

    def _prefetch_after(self, unit: FlatParamUnit) -> None:
        """Start gathering the unit after `unit` in backward order (after the
        root unit: the first)."""
        backward_order = list(reversed(dict.fromkeys(self._forward_order)))
        position = backward_order.index(unit) if unit in backward_order else -1
        if position + 1 < len(backward_order):
            upcoming = backward_order[position + 1]
            if upcoming.full is None and upcoming.prefetched is None:
                upcoming.prefetched = upcoming.all_gather(async_op=True)

    @staticmethod
    def _wait_for_prefetch(unit: FlatParamUnit):
        if unit.prefetched is None:
            return None
        full, work = unit.prefetched
        work.wait()
        unit.prefetched = None
        return full

    def _queue_end_of_backward(self) -> None:
        """Once per backward, queue `_end_of_backward` to run when autograd
        is done (a frozen unit has no gradient to trigger its release)."""
        if not self._end_of_backward_queued:
            self._end_of_backward_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(
                self._end_of_backward)

    def _end_of_backward(self) -> None:
        """No unit stays gathered; replicated gradients are averaged."""
        for unit in self.units:
            self._free(unit)
        self.replicated.average_gradients()
        self._end_of_backward_queued = False

    def gathered_units(self) -> list:
        """Names of the units whose full parameters are held right now."""
        return [u.name for u in self.units
                if u.full is not None or u.prefetched is not None]

    @torch.no_grad()
    def gather_full_params(self) -> dict:
        """{name: full tensor}, names as in the unwrapped module's
        `named_parameters()`, in the parameters' own dtype (the master
        weights). A collective: every rank must call it."""
        gathered = dict(zip(self.replicated.names,
                            (p.detach().clone() for p in self.replicated.params)))
        for unit in self.units:
            full, _ = unit.all_gather(dtype=unit.shard.dtype)
            for name, view in zip(unit.param_names, unflatten(full, unit.shapes)):
                gathered[name] = view.clone()
        return {name: gathered[name] for name in self.param_names}
