"""What a recorded torch.distributed call is, and how many bytes it counts.

Both recorders, the traced run's (`ddp_teach.tracing.recorder`) and the
simulated run's (`ddp_teach.sim.runtime.recorder`), give a COMM event these two
fields from here, so that an event means the same in both:

- `op`: the operation, whatever the event's name says (a label such as
  "ddp bucket 0" or "unit 0 all-gather", or the call's own name):
  "all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
  "all_to_all", "barrier", "send", "recv"; a call not in `OPERATIONS` is
  its own name ("gather", "all_gather_object", ...).
- `nbytes`: the collective's whole buffer, as nccl-tests sizes a
  collective (NVIDIA/nccl-tests, doc/PERFORMANCE.md) and as the alpha-beta
  costs of `ddp_teach.cost` take it: the tensor of an all-reduce, a
  broadcast or a reduce; the gathered output of an all-gather; the whole
  input of a reduce-scatter or an all-to-all; the message of a send or a
  recv; 0 for a barrier. A call not in `OPERATIONS` counts every tensor
  handed to it. So an all-gather of a Psi-byte array counts Psi on every
  rank, not its 1/N input plus its output.

The argument names are torch's (torch/distributed/distributed_c10d.py, as
`inspect.signature` gives them); ddp_teach.compat's all_gather_single shim
on an older torch takes the same names.
"""
import functools
import inspect

# torch.distributed call -> (operation, the argument that holds the whole buffer;
# None: no data)
OPERATIONS = {
    "all_reduce": ("all_reduce", "tensor"),
    "all_reduce_coalesced": ("all_reduce", "tensors"),
    "broadcast": ("broadcast", "tensor"),
    "reduce": ("reduce", "tensor"),
    "all_gather": ("all_gather", "tensor_list"),
    "all_gather_coalesced": ("all_gather", "output_tensor_lists"),
    "all_gather_into_tensor": ("all_gather", "output_tensor"),
    "all_gather_single": ("all_gather", "output_tensor"),
    "reduce_scatter": ("reduce_scatter", "input_list"),
    "reduce_scatter_tensor": ("reduce_scatter", "input"),
    "reduce_scatter_single": ("reduce_scatter", "input"),
    "all_to_all": ("all_to_all", "input_tensor_list"),
    "all_to_all_single": ("all_to_all", "input"),
    "barrier": ("barrier", None),
    "monitored_barrier": ("barrier", None),
    "send": ("send", "tensor"),
    "recv": ("recv", "tensor"),
    "isend": ("send", "tensor"),
    "irecv": ("recv", "tensor"),
}


def operation(name: str) -> str:
    """The operation of the torch.distributed call `name`."""
    return OPERATIONS.get(name, (name, None))[0]


def call_bytes(name: str, call, args, kwargs) -> int:
    """The bytes an event of the call `name` (the function `call`, with
    `args` and `kwargs`) counts: its buffer (see the module's doc)."""
    if name not in OPERATIONS:
        return tensor_bytes(args) + tensor_bytes(kwargs.values())
    buffer = OPERATIONS[name][1]
    if buffer is None:
        return 0
    try:
        bound = _signature(call).bind(*args, **kwargs)
    except TypeError:  # the call itself will say what is wrong with its arguments
        return tensor_bytes(args) + tensor_bytes(kwargs.values())
    return tensor_bytes([bound.arguments.get(buffer)])


def tensor_bytes(values) -> int:
    """Bytes of the tensors in `values`, inside lists and P2POps too."""
    import torch
    total = 0
    for value in values:
        if isinstance(value, torch.Tensor):
            total += value.numel() * value.element_size()
        elif isinstance(value, (list, tuple)):
            total += tensor_bytes(value)
        elif isinstance(getattr(value, "tensor", None), torch.Tensor):
            total += tensor_bytes([value.tensor])  # a P2POp
    return total


@functools.cache
def _signature(call):
    return inspect.signature(call)
