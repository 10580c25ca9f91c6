"""Pipeline parallelism: split the layers across ranks, pass activations on.

When a model's layers do not fit on one device, data parallelism cannot
help (every rank needs every layer). Pipeline parallelism gives each rank a
contiguous *stage* of layers: rank 0 runs the first layers and sends its
output activations to rank 1, which runs the next layers, and so on; in
backward the gradients of those activations travel the other way. Only
activations cross the cut, never parameters.

Run naively, only one stage works at a time. GPipe (Huang et al., "GPipe:
Efficient Training of Giant Neural Networks using Pipeline Parallelism",
NeurIPS 2019, arXiv:1811.06965) splits the batch into m *micro-batches*:
stage s can run micro-batch i while stage s+1 runs micro-batch i-1. All
forwards, then all backwards, then one optimizer step, so the result is
exactly that of the whole batch. With p equal stages the step takes
(m + p - 1) micro-batch slots, of which each stage is busy for m: the idle
"bubble" is (p - 1) / (m + p - 1) of the step. More micro-batches, smaller
bubble; the price is that every stage keeps the activations of all m
micro-batches until their backward (1F1B schedules, PipeDream-Flush,
Narayanan et al. 2021, reorder the passes to cap that at p).

Here a stage is any module; blocking `dist.send` / `dist.recv` move the
activations (simple to read; real pipelines post `isend` / `irecv` early so
that transfers overlap compute), and each micro-batch's forward and backward
are marked `F{i}` and `B{i}` on a traced run's timeline, where the bubble is
the white space.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddp_teach.tracing import span


def split_layers(layers, num_stages: int) -> list[list]:
    """Contiguous groups of `layers`, as equal in number as possible:
    stage s gets the s-th group."""
    layers = list(layers)
    if not 1 <= num_stages <= len(layers):
        raise ValueError(f"cannot split {len(layers)} layers into "
                         f"{num_stages} stages")
    size, extra = divmod(len(layers), num_stages)
    stages, start = [], 0
    for s in range(num_stages):
        end = start + size + (1 if s < extra else 0)
        stages.append(layers[start:end])
        start = end
    return stages


def bubble_fraction(num_stages: int, micro_batches: int) -> float:
    """GPipe's idle share of a step with equal stages: (p-1) / (m+p-1)."""
    return (num_stages - 1) / (micro_batches + num_stages - 1)


def gpipe_step(stage, inputs, targets, micro_batches: int, boundary_shape,
               loss_fn=F.mse_loss):
    """One training step's forward and backward on this rank's `stage`,
    GPipe's schedule: every micro-batch forward, then every one backward
    (last micro-batch first). Gradients accumulate in the stage's `.grad`
    as for the whole batch; the caller steps the optimizer afterwards.

    `inputs` is the whole batch on the first rank (None elsewhere),
    `targets` on the last rank (None elsewhere); `boundary_shape` is the
    shape of one micro-batch's activation between two stages (what `recv`
    must allocate). Returns the batch's loss on the last rank, else None.
    """
    rank, world_size = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world_size - 1
    chunks = inputs.chunk(micro_batches) if first else [None] * micro_batches
    labels = targets.chunk(micro_batches) if last else [None] * micro_batches
    kept = []  # (stage input, stage output or loss) per micro-batch
    for i in range(micro_batches):
        if first:
            x = chunks[i]
        else:
            x = torch.empty(boundary_shape)
            dist.recv(x, src=rank - 1)
            x.requires_grad_()
        with span(f"F{i}"):
            out = stage(x)
            if last:  # each micro-batch's share of the batch's mean loss
                out = loss_fn(out, labels[i]) / micro_batches
        if not last:
            dist.send(out.detach(), dst=rank + 1)
        kept.append((x, out))
    for i in reversed(range(micro_batches)):
        x, out = kept[i]
        grad = None
        if not last:
            grad = torch.empty(boundary_shape)
            dist.recv(grad, src=rank + 1)
        with span(f"B{i}"):
            out.backward(grad)
        if not first:
            dist.send(x.grad, dst=rank - 1)
    return sum(out.item() for _, out in kept) if last else None


def measured_bubble(timeline, rank: int) -> float:
    """The share of the step during which `rank` did not compute: 1 -
    (its compute time) / (from the first event of any rank to the last)."""
    events = list(timeline)
    window = max(e.end for e in events) - min(e.start for e in events)
    busy = timeline.summary()[rank]["compute_s"]
    return 1.0 - busy / window


def pipeline_bytes(batch_rows: int, width: int, element_size: int = 4) -> int:
    """Bytes that cross one stage boundary per step: the batch's activations
    forward plus their gradients backward, whatever the micro-batch count."""
    return 2 * batch_rows * width * element_size

