"""The parameters FSDP leaves whole: kept on every rank, gradients all-reduced.

Sharding a LayerNorm's 2 x 768 numbers saves almost nothing and costs two
collectives per step, so many FSDP setups shard only the big layers and keep
small parameters (norms, biases, a scale) replicated, as DDP does: every rank
holds them, their gradients are averaged with one all-reduce at the end of
backward, and the optimizer updates the same values on every rank. With
mixed precision they usually stay in fp32 too: normalisation in 16 bits is
where precision is lost first (Micikevicius et al., "Mixed Precision
Training", ICLR 2018, keep batch norm in fp32).
"""
import torch
import torch.distributed as dist

from ddp_teach.flat import unflatten
from ddp_teach.tracing import labelled


class ReplicatedParams:
    """Parameters that every rank keeps whole, starting from rank 0's values.
    `entries`: [(name, parameter, [(module, attribute), ...])]."""

    def __init__(self, entries: list):
        self.names = [name for name, _, _ in entries]
        self.params = [param for _, param, _ in entries]
        self.owners = list({id(module): module for _, _, slots in entries
                            for module, _ in slots}.values())
        with torch.no_grad():
            for param in self.params:
                dist.broadcast(param, src=0)

    @property
    def trainable(self) -> list:
        return [param for param in self.params if param.requires_grad]

    @torch.no_grad()
    def average_gradients(self) -> None:
        """All-reduce every trainable parameter's gradient, as one flat
        vector, divided by N first. A parameter that got no gradient on this
        rank counts as zeros, so every rank takes part and ends with the same
        gradient (afterwards no parameter is left without one)."""
        params = self.trainable
        if not params:
            return
        world_size = dist.get_world_size()
        flat = torch.cat([
            (param.grad if param.grad is not None
             else torch.zeros_like(param)).reshape(-1) for param in params])
        flat.div_(world_size)
        with labelled("replicated all-reduce"):
            dist.all_reduce(flat)
        for param, averaged in zip(params, unflatten(flat, [p.shape for p in params])):
            param.grad = averaged
