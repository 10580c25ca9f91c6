"""The pieces of a production FSDP2 training job, on CPU ranks (notebook 08).

What a trainer such as TorchTitan (pytorch/torchtitan) does around the
model, written small enough to read: build the Llama-style model of
`ddp_teach.llama` on the meta device, shard it per block with
`fully_shard` (`shard_model`), materialise it per rank (`build_sharded`),
draw the global batch from the global RNG (`global_batch`), accumulate
gradients with one reduce-scatter per unit (`accumulate_gradients`), and
write and read a step checkpoint with torch.distributed.checkpoint
(`step_checkpoint_state`, `save_step_checkpoint`, `resume`). The
exercises' checkers (ddp_teach/exercises/nb08_*.py) train with
`train_step`.

Every rank draws the same global batch (same seed, same RNG stream) and
trains on its own rows of it, so the training does not depend on the
number of ranks, and a run resumed on another number of ranks can follow
the same loss curve: the RNG state is the same on every rank, and one
copy of it in the checkpoint serves any world size.

torch.distributed.checkpoint and torch.distributed.fsdp are imported inside
the functions that use them: importing either imports
torch.distributed.rpc, which some torch builds lack, and `import
ddp_teach` must work on those too (tests/test_compat.py).
"""
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from ddp_teach import compat

from ddp_teach.llama import Llama, LlamaConfig, next_token_loss

GLOBAL_BATCH = 12        # rows per step, split over 1, 2, 3, 4 or 6 ranks evenly
LEARNING_RATE, WARMUP = 3e-3, 6
CHECKPOINT_KEYS = ("model", "optimizer", "scheduler", "rng", "step")


def cpu_mesh():
    """All ranks as one DeviceMesh of CPU tensors (fully_shard's default
    mesh would be on the GPU wherever there is one)."""
    return init_device_mesh("cpu", (dist.get_world_size(),))


@contextmanager
def collectives_seen():
    """Inside the block, every all-gather and reduce-scatter FSDP2 calls is
    noted, in order, as ("all-gather" or "reduce-scatter", its input's dtype)
    in the list this yields.

    FSDP2 (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py) looks
    torch.distributed's single-tensor collectives up at each call, so
    replacing them there for a while sees every call. It calls them by the
    names its torch has: all_gather_single and reduce_scatter_single from
    torch 2.13, all_gather_into_tensor and reduce_scatter_tensor before."""
    seen, real = [], {}
    for label, name in (("all-gather", "all_gather_single"),
                        ("reduce-scatter", "reduce_scatter_single")):
        name = compat.called_name(name)
        real[name] = getattr(dist, name)
        setattr(dist, name, _noting(label, real[name], seen))
    try:
        yield seen
    finally:
        for name, function in real.items():
            setattr(dist, name, function)


def _noting(label, collective, seen):
    def call(*args, **kwargs):
        # (output, input, ...) by position, or output=/input= (input_tensor=)
        tensor = args[1] if len(args) > 1 else kwargs.get("input", kwargs.get("input_tensor"))
        seen.append((label, tensor.dtype))
        return collective(*args, **kwargs)
    return call


def shard_model(model: Llama, mesh) -> Llama:
    """fully_shard each block, then the root, as production trainers wrap.

    Each block becomes an FSDP unit: its parameters are all-gathered just
    before its forward (and again before its backward) and freed after,
    so a rank holds at most one block's full weights at a time. The root's
    call comes last and takes what no block holds: the embedding, the
    final norm and the output projection. Wrapping the root first would
    make it own every parameter (one gather of the whole model), and
    blocks wrapped afterwards find parameters already sharded."""
    from torch.distributed.fsdp import fully_shard
    for block in model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def build_sharded(config: LlamaConfig, seed: int = 0, mp_policy=None,
                  mesh=None) -> Llama:
    """The model as a production job builds it: on the meta device (no
    memory), sharded per block then the root, `to_empty` (each rank
    allocates its shards only), then `init_weights(seed)`."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = cpu_mesh() if mesh is None else mesh
    with torch.device("meta"):
        model = Llama(config)
    for block in model.layers:
        fully_shard(block, mesh=mesh, mp_policy=mp_policy or MixedPrecisionPolicy())
    fully_shard(model, mesh=mesh, mp_policy=mp_policy or MixedPrecisionPolicy())
    model.to_empty(device="cpu")
    model.init_weights(seed)
    return model


def accumulate_gradients(model, micro_batches) -> None:
    """Forward and backward of each (inputs, targets) micro-batch, the
    gradients reduce-scattered once, after the last: FSDP2's
    `set_requires_gradient_sync(False)` keeps each rank's unsharded
    gradients local (and accumulating, in reduce_dtype) until the call
    with True before the last backward. Each loss is divided by the number
    of micro-batches, so that the sum is the whole batch's mean (for
    micro-batches of equal size): the gradient one big batch would give."""
    count = len(micro_batches)
    for index, (inputs, targets) in enumerate(micro_batches):
        model.set_requires_gradient_sync(index == count - 1)
        (next_token_loss(model(inputs), targets) / count).backward()


def new_optimizer_and_scheduler(model):
    """AdamW, and a linear warm-up over WARMUP steps: a scheduler with
    state of its own (its step count), as every LLM recipe has."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE,
                                  weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / WARMUP))
    return optimizer, scheduler


def global_batch(tokens: torch.Tensor, context: int, rows: int = GLOBAL_BATCH):
    """(inputs, targets) of `rows` windows at offsets drawn from the global
    torch RNG: the random data order whose position is the RNG's state."""
    offsets = torch.randint(len(tokens) - context - 1, (rows,))
    windows = torch.stack([tokens[o:o + context + 1] for o in offsets.tolist()])
    return windows[:, :-1], windows[:, 1:]


def my_rows(batch: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This rank's contiguous share of the global batch's rows."""
    return batch.tensor_split(world_size)[rank]


def train_step(model, optimizer, scheduler, tokens, rank, world_size) -> float:
    """One step on this rank's rows; the loss averaged over the ranks."""
    x, y = global_batch(tokens, model.config.context)
    loss = next_token_loss(model(my_rows(x, rank, world_size)),
                           my_rows(y, rank, world_size))
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    return mean.item() / world_size


def step_checkpoint_state(model, optimizer, scheduler, step):
    """What a step checkpoint holds to continue the same training: the
    model's and the optimizer's sharded state (get_state_dict gives them
    keyed by parameter name, as DTensors, so another number of ranks can
    load them), the scheduler's step count, the RNG that draws the data,
    and the step to resume at (the data position)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optimizer_state,
            "scheduler": scheduler.state_dict(), "rng": torch.get_rng_state(),
            "step": step}


def save_step_checkpoint(state: dict, path, group):
    """dcp.async_save: returns once the state is copied into memory (the
    staging); every rank writes its shards in a background thread, which
    agrees on the save plan with the other ranks through collectives.
    Those run while training's own collectives do, so they go through a
    process group of their own, `group` (dist.new_group(backend="gloo"),
    made once by every rank): on the training's group the two streams of
    collectives would interleave and mismatch. async_save needs a group
    with a CPU backend (torch 2.13 raises "A CPU backend must be enabled
    for async save" otherwise). The caller waits on the returned future
    before the next save and before the job ends."""
    import torch.distributed.checkpoint as dcp
    return dcp.async_save(state, checkpoint_id=str(path), process_group=group)


def resume(path, model, optimizer, scheduler, state_fn=step_checkpoint_state) -> int:
    """Load the step checkpoint at `path` into the objects, on however many
    ranks run now; returns the step to resume at. `state_fn` gives the
    checkpoint's layout (the objects' current state is the template that
    dcp.load fills in place)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (set_model_state_dict,
                                                         set_optimizer_state_dict)
    state = state_fn(model, optimizer, scheduler, 0)
    missing = [key for key in CHECKPOINT_KEYS if key not in state]
    if missing:
        raise KeyError(f"the step checkpoint has no {', '.join(map(repr, missing))}: "
                       f"it holds {sorted(state)}")
    dcp.load(state, checkpoint_id=str(path))
    set_model_state_dict(model, state["model"])
    if all(isinstance(key, int) for key in state["optimizer"].get("state", {})):
        optimizer.load_state_dict(state["optimizer"])    # optimizer.state_dict()'s form
    else:
        set_optimizer_state_dict(model, optimizer, state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"])
    return int(state["step"])
