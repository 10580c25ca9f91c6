"""Count the collectives DTensor issues, and the bytes they move.

DTensor (`parallelize_module`, `redistribute`, `full_tensor`) does not call
`torch.distributed.all_reduce` and kin, which the course's tracer wraps: it
calls the functional collectives (`torch.ops._c10d_functional`), C++
operators that return a new tensor and that `wait_tensor` later completes
(torch/distributed/_functional_collectives.py). A dispatch mode sees every
operator that runs, in forward and in backward, so `CollectiveCounter`
records those, with the size of the buffer each one works on. torch's own
`torch.distributed.tensor.debug.CommDebugMode` counts them the same way but
records no sizes.

The size recorded is the whole buffer, as the Megatron papers count it:
the tensor all-reduced, the tensor an all-gather assembles, the tensor a
reduce-scatter splits. A ring moves 2(p-1)/p of that per rank for an
all-reduce and (p-1)/p for the other two, which is why sequence
parallelism's all-gather plus reduce-scatter costs what tensor
parallelism's one all-reduce does (Korthikanti et al., "Reducing
Activation Recomputation in Large Transformer Models", 2022).
"""
from dataclasses import dataclass

from torch.utils._python_dispatch import TorchDispatchMode

# functional collective -> whether its whole buffer is its input (the
# tensor all-reduced, or split by a reduce-scatter) or its output (the
# tensor an all-gather assembles from every rank's shard)
_WHOLE_BUFFER = {"all_reduce": "input", "reduce_scatter_tensor": "input",
                 "all_gather_into_tensor": "output",
                 "all_to_all_single": "input", "broadcast": "input"}


@dataclass(frozen=True)
class Collective:
    """One functional collective: its name and the bytes of its whole buffer."""
    name: str
    nbytes: int


class CollectiveCounter(TorchDispatchMode):
    """`with CollectiveCounter() as counted:` records, in `counted.calls`,
    every functional collective issued inside, forward or backward."""

    def __init__(self):
        super().__init__()
        self.calls: list[Collective] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func._overloadpacket.__name__
        if func.namespace == "_c10d_functional" and name in _WHOLE_BUFFER:
            whole = args[0] if _WHOLE_BUFFER[name] == "input" else out
            self.calls.append(Collective(name, whole.numel() * whole.element_size()))
        return out

    def bytes_by_name(self) -> dict[str, int]:
        """The whole-buffer bytes of the calls, added up per collective."""
        totals: dict[str, int] = {}
        for call in self.calls:
            totals[call.name] = totals.get(call.name, 0) + call.nbytes
        return totals


def tensor_parallel_block_bytes(batch: int, seq: int, hidden: int,
                                element_size: int = 4) -> dict[str, int]:
    """A transformer block's forward under Megatron's tensor parallelism:
    two all-reduces (after attention, after the MLP) of batch x seq x hidden."""
    return {"all_reduce": 2 * batch * seq * hidden * element_size}


def sequence_parallel_block_bytes(batch: int, seq: int, hidden: int,
                                  element_size: int = 4) -> dict[str, int]:
    """The same block with sequence parallelism (the norms split along the
    sequence): each all-reduce becomes an all-gather before the sublayer and
    a reduce-scatter after it, of the same whole buffer."""
    whole = 2 * batch * seq * hidden * element_size
    return {"all_gather_into_tensor": whole, "reduce_scatter_tensor": whole}
