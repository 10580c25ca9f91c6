"""FSDP's units: which parameters are sharded together, and one unit's shard.

A unit is FSDP's FlatParameter (Zhao et al., "PyTorch FSDP", VLDB 2023,
arXiv:2304.11277): some modules' parameters laid end to end, padded to a
multiple of the world size N, of which rank r keeps [r*S, (r+1)*S). One
all-gather per unit rebuilds the whole vector, one reduce-scatter per unit
hands each rank its chunk of the gradient: few, large collectives.
"""
import torch
import torch.distributed as dist
from torch import nn

from ddp_teach.flat import flat_slice, shard_size
from ddp_teach.tracing import labelled

SHARD_NAME = "flat_param_shard"


class FlatParamUnit:
    """Some modules' parameters as one flat vector, of which this rank keeps
    the shard [r*S, (r+1)*S); the full vector exists only while needed.

    The shard keeps the parameters' own dtype (the master weights). The
    full vector is gathered in `compute_dtype` (default: the shard's), and
    gradients are reduced in `reduce_dtype` (default: the compute dtype, as
    FSDP2's MixedPrecisionPolicy does) and handed back in the shard's dtype,
    so they accumulate at full precision."""

    def __init__(self, name: str, entries: list, *, compute_dtype=None,
                 reduce_dtype=None):
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
        self.compute_dtype = compute_dtype or self.shard.dtype
        self.reduce_dtype = reduce_dtype or self.compute_dtype
        self.full = None        # the gathered flat parameters, while needed
        self.prefetched = None  # (buffer, work) of an all-gather in flight

    def all_gather(self, async_op: bool = False, dtype=None):
        """(full flat parameters in `dtype`, default the compute dtype, work):
        the shard is cast before it is sent, so 16 bits travel, not 32. The
        work is None unless async."""
        shard = self.shard.detach().to(dtype or self.compute_dtype)
        full = shard.new_empty(shard.numel() * self.world_size)
        with labelled(f"unit {self.name} all-gather"):
            work = dist.all_gather_single(full, shard, async_op=async_op)
        return full, work

    def reduce_scatter(self, grad_full: torch.Tensor) -> torch.Tensor:
        """This rank's chunk of the gradient averaged over ranks, in the
        shard's dtype. Each rank divides by N before the sum, as torch DDP's
        default hook does: in 16 bits, a sum of N gradients can overflow
        where their mean would not."""
        send = grad_full.to(self.reduce_dtype).div(self.world_size)
        grad_shard = send.new_empty(self.shard.numel())
        with labelled(f"unit {self.name} reduce-scatter"):
            dist.reduce_scatter_single(grad_shard, send.contiguous())
        return grad_shard.to(self.shard.dtype)

    def set_module_attributes(self, views) -> None:
        for view, slots in zip(views, self.slots):
            for module, attribute in slots:
                setattr(module, attribute, view)


def unit_names(module: nn.Module, units) -> list:
    """The submodule names that become units, checked. `units`: names, a
    policy `(name, module) -> bool` (the outermost match wins), or None for
    each direct child that has parameters."""
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


def parameters_by_unit(module: nn.Module, names: list) -> dict:
    """{unit name ('' for the rest, outside every unit): [(parameter name,
    parameter, slots)]}: each parameter once, in `named_parameters()` order,
    with every (module, attribute) it sits in (a tied weight sits in
    several)."""
    def unit_of(module_name):
        owners = [u for u in names
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
    return by_unit


def check_one_kind_per_unit(by_unit: dict) -> None:
    """A shard is one Parameter: all frozen or all trainable, one dtype."""
    for unit, entries in by_unit.items():
        if len({param.requires_grad for _, param, _ in entries}) > 1:
            raise ValueError(f"unit {unit or '(root)'} mixes frozen and "
                             f"trainable parameters; give each its own unit")
        dtypes = {param.dtype for _, param, _ in entries}
        if len(dtypes) > 1:
            raise ValueError(f"unit {unit or '(root)'} mixes dtypes "
                             f"{sorted(map(str, dtypes))}; give each its own "
                             f"unit, or convert the module to one dtype")
