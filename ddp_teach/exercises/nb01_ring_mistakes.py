"""What each typical mistake in notebook 01's ring collectives looks like,
so that the checker (nb01_collectives.py) names the one made, and how many
bytes each algorithm may move.

`diagnose_all_reduce` and `diagnose_all_gather` take one rank's outcome
(the value it produced, and for a list whether a slot carries autograd
history or shares memory with the input), every rank's input and the
rank; they return None when the outcome is right, else the hint.
"""
import math

import torch


def same(a, b) -> bool:
    if not isinstance(a, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.detach(), b.detach()
    return torch.allclose(a, b) if a.is_floating_point() else torch.equal(a, b)



def ring_traffic(numel: int, elem_bytes: int, p: int) -> int:
    """A ring all-reduce: 2(p-1) chunks of at most ceil(n/p) out, as many in."""
    return 4 * (p - 1) * math.ceil(numel / p) * elem_bytes


def all_gather_traffic(numel: int, elem_bytes: int, p: int) -> int:
    """An all-gather: every other rank's tensor in, this one out p-1 times."""
    return 2 * (p - 1) * numel * elem_bytes


def diagnose_all_reduce(outcome, inputs, rank) -> str | None:
    got = outcome["value"]
    expected, world_size = sum(inputs), len(inputs)
    if same(got, expected):
        return None
    if same(got, inputs[rank]) and not inputs[rank].is_contiguous():
        return ("the tensor did not change, and it is not contiguous (a "
                "view): tensor.contiguous() then returns a COPY, and so do "
                "reshape(-1) and .flatten() of a transposed matrix, so writes "
                "into it never reach the tensor. Work on that flat copy and "
                "copy the result back at the end: "
                "tensor.copy_(flat.view_as(tensor)).")
    if same(got, inputs[rank]):
        return ("the tensor did not change. Write the result into `tensor` "
                "itself (tensor[...] = ..., chunk.add_(...)): `tensor = ...` "
                "only rebinds a local name, and all_reduce works in place.")
    if got.is_floating_point() and same(got, expected / world_size):
        return ("you averaged; all_reduce's default op is a SUM (DDP divides "
                "by the world size itself, afterwards).")
    if same(got, expected - inputs[rank]):
        return "the sum is missing this rank's own data: add your own chunk too."
    wrong = [i for i, (g, e) in enumerate(zip(got.reshape(-1).tensor_split(world_size),
                                              expected.reshape(-1).tensor_split(world_size)))
             if not same(g, e)]
    if len(wrong) < world_size:
        return (f"chunks {wrong} are wrong while the others are right: check "
                "which chunk index each rank sends and receives at each step "
                "(an index off by one?).")
    return ("no chunk is right: check the chunk indices you send and receive "
            "at each step (an index off by one?) against the ring schedule: at "
            "reduce-scatter step s rank r sends chunk (r - s) mod p and adds "
            "the chunk (r - s - 1) mod p it receives; rank r then owns chunk "
            "(r + 1) mod p, and the all-gather passes the finished chunks on.")


def diagnose_all_gather(outcome, inputs, rank) -> str | None:
    got, world_size = outcome["value"], len(inputs)
    if not isinstance(got, (list, tuple)) or len(got) != world_size:
        return (f"return a list of {world_size} tensors, one per rank, the "
                "one from rank s at index s (like dist.all_gather).")
    if not all(same(g, e) for g, e in zip(got, inputs)) and all(
            isinstance(g, torch.Tensor) and g.shape != e.shape
            and same(g.flatten(), e.flatten()) for g, e in zip(got, inputs)):
        return (f"the right values, but each slot has shape "
                f"{tuple(got[0].shape)} where the input's is "
                f"{tuple(inputs[rank].shape)}: like dist.all_gather's, every "
                "slot has the input's shape. View each received buffer as "
                "the input (buffer.view(tensor.shape)).")
    if all(same(g, e) for g, e in zip(got, inputs)):
        if outcome["aliases_input"]:
            return ("a slot of the list is your input tensor itself (or a view "
                    "of it): change the input later and the gathered list "
                    "changes too. Put a copy in your own slot (tensor.clone()).")
        if outcome["grad"]:
            return ("a slot carries autograd history: dist.all_gather returns "
                    "data only. Copy your own tensor with "
                    "tensor.detach().clone().")
        return None
    if not same(got[rank], inputs[rank]) and all(
            same(got[s], inputs[s]) for s in range(world_size) if s != rank):
        return "every slot is right but your own: put your own tensor at index rank."
    for shift in range(1, world_size):
        if all(same(got[i], inputs[(i + shift) % world_size])
               for i in range(world_size)):
            return ("the right tensors in the wrong places: index the list by "
                    "the rank the tensor came FROM, not by the step.")
    return ("around the ring, at step s rank r receives the tensor that "
            "started on rank (r - s - 1) mod p from its left neighbour.")
