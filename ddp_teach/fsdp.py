"""ZeRO stage 3: FullyShardedDataParallel from scratch.

Stage 3 of ZeRO (Rajbhandari et al., SC'20, arXiv:1910.02054) shards the
parameters themselves: each rank keeps 1/N of every parameter and gathers a
layer's full parameters only while that layer computes. PyTorch FSDP (Zhao et
al., "PyTorch FSDP", VLDB 2023, arXiv:2304.11277) organises this in *units*:

* Each unit (by default, each direct child module that has parameters; the
  root's leftover parameters form one more) flattens its parameters into one
  vector, pads it to a multiple of N, and keeps only its shard as a leaf
  `nn.Parameter`, registered on the unit's module as `flat_param_shard`. So
  `model.parameters()` yields the shards, and any optimizer built on them is
  sharded too: parameters, gradients and optimizer state are all 1/N.
* Forward: before a unit runs, all-gather its full flat vector and point the
  module's attributes (`weight`, `bias`, ...) at views of it; after it runs,
  drop them. The all-gather is an autograd Function (`_GatherParams`) whose
  backward reduce-scatters the full vector's gradient into the shard's
  gradient, averaged over ranks: the gradients arrive sharded, for free.
* Backward needs the full parameters again (e.g. a Linear's input gradient is
  grad_output @ weight). Autograd would keep the gathered tensors alive in
  its saved tensors until then, undoing the sharding, so a
  `saved_tensors_hooks` pack hook replaces every saved tensor that lives in a
  gathered unit by a note (which unit; offset, shape, strides), and the unpack
  hook re-gathers that unit when backward first needs it and rebuilds the
  view. The unit is freed again once its gradient is reduce-scattered
  (the root unit, gathered around the whole forward, is reduce-scattered
  last, so it stays gathered through backward; FSDP2 keeps its root whole).
* Prefetching (FSDP's backward prefetch): when a unit is re-gathered in
  backward, start the asynchronous all-gather of the unit that backward will
  need next (the reverse of the forward order), so communication overlaps
  computation.

Per step that is two all-gathers and one reduce-scatter of Psi: 3 Psi, 1.5x
plain DP's all-reduce (2 Psi). A unit whose saved tensors hold no parameter
(the first layer, whose input needs no gradient) is not re-gathered in
backward unless the prefetch of it already started. A unit's parameters
exist only during its own forward: code elsewhere that reads them (the root
using `self.embed.weight`) needs both in one unit. Not done here: nested
units, activation checkpointing, mixed precision.
"""
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ddp_teach.tracing import labelled
from ddp_teach.flat import flat_slice, shard_size, unflatten

SHARD_NAME = "flat_param_shard"


class FlatParamUnit:
    """Some modules' parameters as one flat vector, of which this rank keeps
    the shard [r*S, (r+1)*S); the full vector exists only while needed."""

    def __init__(self, name: str, entries: list):
        self.name = name or "(root)"
        self.param_names = [name for name, _, _ in entries]
        self.slots = [slots for _, _, slots in entries]  # [(module, attribute)]
        params = [param for _, param, _ in entries]
        self.shapes = [p.shape for p in params]
        self.world_size = dist.get_world_size()
        size = shard_size(sum(p.numel() for p in params), self.world_size)
        flat = flat_slice(params, 0, size * self.world_size)
        dist.broadcast(flat, src=0)  # every rank starts from rank 0's values
        rank = dist.get_rank()
        self.shard = nn.Parameter(flat[rank * size:(rank + 1) * size].clone(),
                                  requires_grad=params[0].requires_grad)
        self.full = None        # the gathered flat parameters, while needed
        self.prefetched = None  # (buffer, work) of an all-gather in flight

    def all_gather(self, async_op: bool = False):
        """(full flat parameters, work): the work is None unless async."""
        full = self.shard.new_empty(self.shard.numel() * self.world_size)
        with labelled(f"unit {self.name} all-gather"):
            work = dist.all_gather_single(full, self.shard.detach(),
                                          async_op=async_op)
        return full, work

    def reduce_scatter(self, grad_full: torch.Tensor) -> torch.Tensor:
        """This rank's chunk of the gradient summed over ranks, / N."""
        grad_shard = torch.empty_like(self.shard)
        with labelled(f"unit {self.name} reduce-scatter"):
            dist.reduce_scatter_single(grad_shard, grad_full.contiguous())
        return grad_shard.div_(self.world_size)

    def set_module_attributes(self, views) -> None:
        for view, slots in zip(views, self.slots):
            for module, attribute in slots:
                setattr(module, attribute, view)


class _GatherParams(torch.autograd.Function):
    """shard -> full flat parameters; backward: full gradient -> shard's."""

    @staticmethod
    def forward(ctx, shard, fsdp, unit):
        ctx.fsdp, ctx.unit = fsdp, unit
        full, _ = unit.all_gather()
        return full

    @staticmethod
    def backward(ctx, grad_full):
        ctx.fsdp._queue_free_all()
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


class FullyShardedDataParallel(nn.Module):
    """ZeRO-3 on the default process group: wrap, then build any optimizer
    over `.parameters()` (the shards). `units`: submodule names to make units
    of, or a policy `(name, module) -> bool` (the outermost match wins);
    default: each direct child that has parameters. `prefetch`: in backward,
    start gathering the next unit while the current one computes."""

    def __init__(self, module: nn.Module, *, units=None, prefetch: bool = True):
        super().__init__()
        if any(SHARD_NAME in m._parameters for m in module.modules()):
            raise ValueError("this module is already wrapped by "
                             "FullyShardedDataParallel; wrap a fresh one")
        self.module, self.prefetch = module, prefetch
        entries_by_unit = _parameters_by_unit(module, _unit_names(module, units))
        with torch.no_grad():
            for buffer in module.buffers():
                dist.broadcast(buffer, src=0)
        self.param_names = [name for name, _ in module.named_parameters()]
        self.units = []
        for unit_name, entries in entries_by_unit.items():
            unit = FlatParamUnit(unit_name, entries)
            for slots in unit.slots:
                for owner, attribute in slots:
                    del owner._parameters[attribute]
                    setattr(owner, attribute, None)  # no weights between uses
            unit_module = module.get_submodule(unit_name)
            unit_module.register_parameter(SHARD_NAME, unit.shard)
            if unit_name:  # the root unit is gathered around the whole forward
                unit_module.register_forward_pre_hook(
                    lambda _m, _args, unit=unit: self._gather_for_forward(unit))
                unit_module.register_forward_hook(
                    lambda _m, _args, _out, unit=unit: self._free(unit))
            self.units.append(unit)
        self._root_unit = next((u for u in self.units if u.name == "(root)"), None)
        self._forward_order = []
        self._cleanup_queued = False

    def forward(self, *args, **kwargs):
        self._forward_order = []
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            if self._root_unit is not None:
                self._gather_for_forward(self._root_unit)
            try:
                return self.module(*args, **kwargs)
            finally:
                if self._root_unit is not None:
                    self._free(self._root_unit)

    def _gather_for_forward(self, unit: FlatParamUnit) -> None:
        unit.full = _GatherParams.apply(unit.shard, self, unit)
        unit.set_module_attributes(unflatten(unit.full, unit.shapes))
        if unit is not self._root_unit:  # gathered first, but used anywhere
            self._forward_order.append(unit)

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
        self._queue_free_all()
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

    def _queue_free_all(self) -> None:
        """Make sure, once per backward, that no unit stays gathered after it
        (a frozen unit has no gradient to trigger its release)."""
        if not self._cleanup_queued:
            self._cleanup_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(
                self._free_all)

    def _free_all(self) -> None:
        for unit in self.units:
            self._free(unit)
        self._cleanup_queued = False

    def gathered_units(self) -> list:
        """Names of the units whose full parameters are held right now."""
        return [u.name for u in self.units
                if u.full is not None or u.prefetched is not None]

    @torch.no_grad()
    def gather_full_params(self) -> dict:
        """{name: full tensor}, names as in the unwrapped module's
        `named_parameters()`. A collective: every rank must call it."""
        gathered = {}
        for unit in self.units:
            full, _ = unit.all_gather()
            for name, view in zip(unit.param_names, unflatten(full, unit.shapes)):
                gathered[name] = view.clone()
        return {name: gathered[name] for name in self.param_names}


def _unit_names(module: nn.Module, units) -> list:
    """The submodule names that become units, checked."""
    if units is None:
        return [name for name, child in module.named_children()
                if next(child.parameters(), None) is not None]
    if callable(units):
        chosen = []
        for name, child in module.named_modules():
            if name and not any(name.startswith(c + ".") for c in chosen) \
                    and units(name, child):
                chosen.append(name)
        units = chosen
    known = dict(module.named_modules())
    for name in units:
        if name not in known or not name:
            raise ValueError(f"units: {name!r} is not a submodule name; "
                             f"choose from {sorted(n for n in known if n)}")
        if next(known[name].parameters(), None) is None:
            raise ValueError(f"units: {name!r} has no parameters to shard")
        nested = [other for other in units if other.startswith(name + ".")]
        if nested:
            raise ValueError(f"units: {nested} lie inside {name!r}; nested "
                             f"units are not supported")
    return list(units)


def _parameters_by_unit(module: nn.Module, unit_names: list) -> dict:
    """{unit name ('' for the root): [(parameter name, parameter, slots)]}:
    each parameter once, in `named_parameters()` order, with every (module,
    attribute) it sits in (a tied weight sits in several)."""
    def unit_of(module_name):
        owners = [u for u in unit_names
                  if module_name == u or module_name.startswith(u + ".")]
        return owners[0] if owners else ""

    slots = {}
    for module_name, owner in module.named_modules():
        for attribute, param in owner._parameters.items():
            if param is not None:
                slots.setdefault(param, []).append(
                    (unit_of(module_name), owner, attribute))
    by_unit = {}
    for name, param in module.named_parameters():
        owners = {unit for unit, _, _ in slots[param]}
        if len(owners) > 1:
            raise ValueError(f"parameter {name} is shared by units "
                             f"{sorted(owners)}; put its users in one unit")
        by_unit.setdefault(owners.pop(), []).append(
            (name, param, [(owner, attr) for _, owner, attr in slots[param]]))
    for unit, entries in by_unit.items():
        if len({param.requires_grad for _, param, _ in entries}) > 1:
            raise ValueError(f"unit {unit or '(root)'} mixes frozen and "
                             f"trainable parameters; give each its own unit")
    return by_unit
