"""Find what went wrong on which rank: replicas that drift, a NaN that spreads.

Data parallelism promises identical replicas: every rank holds the same
parameters and buffers after every step. When a bug breaks that promise
(no initial broadcast, BatchNorm statistics kept per rank, a random op
seeded by rank), training goes on without an error and the replicas drift
apart. `ReplicaWatch` catches it: after each step every rank fingerprints
every parameter and buffer, the fingerprints are all-gathered, and the
first step at which a tensor differs is kept, with which ranks agree.

A NaN or inf on one rank is the opposite: the all-reduce spreads it to every
rank within one step, so the loss is NaN everywhere and the rank where it
started is hidden. `nonfinite_ranks` asks every rank whether it holds one,
and `FirstNonFinite` names the first layer whose output (in forward) or
whose backward's result (in backward) is not finite. torch's own tool for the
second is `torch.autograd.detect_anomaly()`, which names the backward
operation; this one names the module, and costs one check per layer.

A hang is found with torch's flight recorder, which is on by default: every
process keeps a ring buffer of its last collectives (operation, sequence
number, sizes, state), 2000 of them unless TORCH_FR_BUFFER_SIZE, read when
the first process group starts, says otherwise (a smaller number keeps
fewer, 0 turns the recorder off): FlightRecorder.hpp in torch/csrc/
distributed/c10d. `flight_record` reads this rank's; side by side, the
first sequence number at which ranks disagree is the bug.
"""
import hashlib
import json
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ddp_teach.system import collective_device


def fingerprint(tensor: torch.Tensor) -> int:
    """A 63-bit hash of the tensor's bytes: equal tensors, equal prints; one
    bit changed, a different print (in all but 1 of 2**63 cases)."""
    data = tensor.detach().contiguous().cpu().view(-1).view(torch.uint8)
    digest = hashlib.blake2b(data.numpy().tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _all_gather_ints(values: list) -> torch.Tensor:
    """[world_size, len(values)]: every rank's values (int64)."""
    mine = torch.tensor(values, dtype=torch.int64, device=collective_device())
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    return torch.stack(everyone).cpu()


@dataclass
class Mismatch:
    """A tensor that is not the same on every rank: `groups` lists the
    ranks that agree with each other, largest group first."""
    name: str
    groups: list

    def __str__(self) -> str:
        return f"{self.name}: ranks " + " | ".join(
            str(group) for group in self.groups)


def compare_replicas(module: nn.Module) -> list:
    """The parameters and buffers of `module` that differ between ranks, as
    `Mismatch`es, in `named_parameters()` then `named_buffers()` order. A
    collective: every rank calls it, with the same module structure."""
    named = list(module.named_parameters()) + list(module.named_buffers())
    counts = _all_gather_ints([len(named)])[:, 0].tolist()
    if len(set(counts)) > 1:
        raise ValueError(f"the ranks hold different numbers of parameters "
                         f"and buffers ({counts}): they are not replicas of "
                         f"one model; build the same model on every rank")
    prints = _all_gather_ints([fingerprint(tensor) for _, tensor in named])
    mismatches = []
    for column, (name, _) in enumerate(named):
        groups = {}
        for rank, value in enumerate(prints[:, column].tolist()):
            groups.setdefault(value, []).append(rank)
        if len(groups) > 1:
            mismatches.append(Mismatch(name, sorted(groups.values(),
                                                    key=lambda g: (-len(g), g))))
    return mismatches


class ReplicaWatch:
    """Call `check(step)` on every rank after each step: it compares the
    replicas and keeps, for each tensor, the first step at which it differed.
    `first` is the earliest (step, Mismatch), or None while all agree."""

    def __init__(self, module: nn.Module):
        self.module = module
        self.first_seen = {}  # name -> (step, Mismatch)

    def check(self, step: int) -> list:
        mismatches = compare_replicas(self.module)
        for mismatch in mismatches:
            self.first_seen.setdefault(mismatch.name, (step, mismatch))
        return mismatches

    @property
    def first(self):
        if not self.first_seen:
            return None
        return min(self.first_seen.values(), key=lambda seen: seen[0])

    def report(self) -> str:
        if not self.first_seen:
            return "the replicas agree: every parameter and buffer is the same on every rank"
        lines = [f"step {step}: {mismatch}"
                 for step, mismatch in sorted(self.first_seen.values(),
                                              key=lambda seen: seen[0])]
        return "first step at which each tensor differed:\n  " + "\n  ".join(lines)


def differing_tensors(model: nn.Module) -> list:
    """The names of the parameters and buffers of `model` that are not
    the same on every rank (a collective): `compare_replicas`, names only."""
    return [mismatch.name for mismatch in compare_replicas(model)]


def dataset_mean(local_losses: torch.Tensor) -> torch.Tensor:
    """The mean of every value on every rank, when ranks hold different
    numbers of them (the last batch of an epoch, a sampler with
    drop_last=False): all-reduce the sum and the count, then divide. The
    mean of the ranks' means weighs a rank of 1 sample like a rank of 100."""
    sum_and_count = torch.stack([local_losses.sum().double(),
                                 torch.tensor(local_losses.numel(), dtype=torch.float64)])
    dist.all_reduce(sum_and_count)
    return sum_and_count[0] / sum_and_count[1]


def strip_ddp_prefix(state_dict: dict) -> dict:
    """The state dict of `DistributedDataParallel(model)`, keyed as
    `model`'s: DDP keeps the model as its attribute `module`, so every key
    starts "module.". Only that leading prefix goes ("submodule.weight" or
    "encoder.module.bias" keep theirs); a key without it is kept as it is.
    torch has the same in place:
    `torch.nn.modules.utils.consume_prefix_in_state_dict_if_present`."""
    return {key.removeprefix("module."): value for key, value in state_dict.items()}


def nonfinite_ranks(*tensors: torch.Tensor) -> list:
    """The ranks on which any of `tensors` holds a NaN or an inf (a
    collective). Call it on the loss, or the gradients, before the
    all-reduce spreads the NaN to every rank.

    The flags stay on the device until the gathered list is read, once: on a
    GPU that read is a device-to-host copy, which makes the CPU wait for
    every kernel queued so far (it stops running ahead). So check the loss,
    one number, rather than every gradient, and every N steps rather than
    every step when that wait shows."""
    device = collective_device()
    bad = torch.zeros(1, dtype=torch.int64, device=device)
    for tensor in tensors:
        bad |= (~torch.isfinite(tensor.detach())).any().to(device)
    everyone = [torch.empty_like(bad) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, bad)
    flags = torch.cat(everyone).tolist()  # the one read on the host
    return [rank for rank, flag in enumerate(flags) if flag]


class FirstNonFinite:
    """Inside `with FirstNonFinite(model) as probe:`, forward and backward
    note where a NaN or an inf first appeared, as module names (or None):
    `probe.forward`, the first module whose output held one; `probe.backward`,
    the first module whose backward produced one (the gradient of its
    input). On leaving, the hooks go."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.forward = None
        self.backward = None
        self._handles = []

    def __enter__(self):
        for name, module in self.model.named_modules():
            if name:
                self._handles.append(module.register_forward_hook(
                    lambda _m, args, out, name=name: self._look(name, args, out)))
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _look(self, name, args, out) -> None:
        if isinstance(out, torch.Tensor) and out.is_floating_point() \
                and self.forward is None and not torch.isfinite(out.detach()).all():
            self.forward = name
        for tensor in args:
            if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
                tensor.register_hook(lambda grad: self._look_at_gradient(name, grad))

    def _look_at_gradient(self, name, grad) -> None:
        if self.backward is None and not torch.isfinite(grad).all():
            self.backward = name


def flight_record() -> list:
    """This rank's flight recorder entries, oldest first, each a dict with
    `seq` (the collective's number in its group), `op` ("gloo:all_reduce"),
    `sizes` (the input tensors' shapes) and `state` ("scheduled",
    "started", "completed"; gloo records no start or end events, so its
    entries stay "scheduled"). The recorder is on by default and keeps the
    last 2000 entries; TORCH_FR_BUFFER_SIZE, set before the first process
    group is created, changes that number, and 0 turns it off (the list is
    then empty): FlightRecorder.hpp, `max_entries_`. torch writes the same
    record to files itself when an nccl collective times out
    (TORCH_NCCL_DUMP_ON_TIMEOUT=1); this reads it on demand, for gloo too,
    from torch's own dump (torch/csrc/distributed/c10d/FlightRecorder)."""
    from torch._C._distributed_c10d import _dump_fr_trace_json
    entries = json.loads(_dump_fr_trace_json()).get("entries", [])
    return [dict(seq=e["collective_seq_id"], op=e["profiling_name"],
                 sizes=e.get("input_sizes"), state=e.get("state"))
            for e in entries]
