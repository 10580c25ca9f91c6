"""One flat vector for many tensors: the bookkeeping behind ZeRO and FSDP.

Sharding lays every parameter end to end as one flat vector, pads it to a
multiple of the world size N and gives rank r the contiguous chunk
[r*S, (r+1)*S), S = ceil(numel / N). These helpers do that arithmetic; ZeRO
stages 1-2 (zero.py) and stage 3 (fsdp.py) both build on them, which is why
they live in a module of their own. The same layout is FSDP's FlatParameter
(Zhao et al., "PyTorch FSDP", VLDB 2023, arXiv:2304.11277).
"""
import math

import torch


def shard_size(numel: int, world_size: int) -> int:
    """Elements per rank when `numel` are padded to a multiple of world_size."""
    return math.ceil(numel / world_size)


def flat_slice(tensors, start: int, end: int) -> torch.Tensor:
    """Elements [start, end) of `tensors` laid end to end as one flat vector,
    zeros past their end (the padding), as a new tensor. Rank r's shard is
    flat_slice(tensors, r*S, (r+1)*S): built without the whole flat vector."""
    pieces, offset = [], 0
    for tensor in tensors:
        lo, hi = max(start, offset), min(end, offset + tensor.numel())
        if lo < hi:
            pieces.append(tensor.detach().reshape(-1)[lo - offset:hi - offset])
        offset += tensor.numel()
    padding = (end - start) - sum(piece.numel() for piece in pieces)
    return torch.cat(pieces + [tensors[0].new_zeros(padding)])


def unflatten(flat: torch.Tensor, shapes) -> list:
    """Views of `flat` with the given shapes, back to back; the padding at
    the end belongs to no one and is left out."""
    numels = [math.prod(shape) for shape in shapes]
    pieces = flat.split(numels + [flat.numel() - sum(numels)])
    return [piece.view(shape) for piece, shape in zip(pieces, shapes)]
