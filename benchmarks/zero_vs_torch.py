"""The course's ZeRO stages against torch's, step time and memory per rank.

Model: the MLP of the course's reference sheet (8 x Linear(1024, 1024) +
ReLU, 8.4M parameters), batch 256 per rank, AdamW, CPU gloo, world size 2.
A step is forward + backward + `optimizer.step()` + `zero_grad()`; the
forward + backward part is also timed on its own. Variants:

* stage 0: torch DDP + AdamW (the unsharded baseline);
* ZeRO-1: torch DDP + `dt.zero.ShardedOptimizer`, and torch's
  `ZeroRedundancyOptimizer`;
* ZeRO-2: `dt.zero.Zero2DataParallel`;
* ZeRO-3: `dt.zero.FullyShardedDataParallel` (prefetch on and off) and
  torch's FSDP2, `fully_shard` on each Linear and on the root (the same
  units as ours).

Memory: the bytes of parameters, gradients and optimizer state a rank
holds after the optimizer step (before zero_grad), storages counted once
(`dt.zero.model_state_bytes`; for FSDP2, the local shards of its DTensors),
against `dt.memory.zero_bytes_per_device` for fp32 AdamW. Transient buffers
(a unit's gathered parameters, ZeRO-2's flat gradient at the end of
backward) are not model states and are not counted. torch's DDP runs with
`gradient_as_bucket_view=True`, so its gradients are its bucket buffers.

Each variant is one `dt.run` per repetition, the variants interleaved over
the repetitions; figures are medians over every rank's measured steps.
Run from the repo root: `make bench` (or `.venv/bin/python
benchmarks/zero_vs_torch.py`). Writes benchmarks/zero_vs_torch.md.
"""
import datetime
import os
import statistics
import sys
import time

import torch
from torch.distributed.tensor import DTensor

import ddp_teach as dt
from ddp_teach.models import reference_mlp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_vs_torch import machine  # noqa: E402 (the same machine line)
from section import measure_and_publish  # noqa: E402

WIDTH, DEPTH, BATCH, WORLD_SIZE = 1024, 8, 256, 2
WARMUP_STEPS, STEPS, REPEATS = 1, 4, 3
VARIANTS = {  # name: (ZeRO stage, whose)
    "torch DDP + AdamW": (0, "torch"),
    "ours ZeRO-1": (1, "ours"),
    "torch ZeroRedundancyOptimizer": (1, "torch"),
    "ours ZeRO-2": (2, "ours"),
    "ours ZeRO-3": (3, "ours"),
    "ours ZeRO-3, no prefetch": (3, "ours"),
    "torch FSDP2 fully_shard": (3, "torch"),
}
TARGET = 1.5  # ours ZeRO-3 / torch FSDP2, step time
TIMEOUT = 300.0


def build(variant: str):
    """(model, optimizer) for one variant, on this rank."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    model = reference_mlp(WIDTH, DEPTH)
    ddp = torch.nn.parallel.DistributedDataParallel
    if variant == "torch DDP + AdamW":
        model = ddp(model, gradient_as_bucket_view=True)
        return model, torch.optim.AdamW(model.parameters())
    if variant == "ours ZeRO-1":
        model = ddp(model, gradient_as_bucket_view=True)
        return model, dt.zero.ShardedOptimizer(model.parameters(), torch.optim.AdamW)
    if variant == "torch ZeroRedundancyOptimizer":
        model = ddp(model, gradient_as_bucket_view=True)
        return model, ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW)
    if variant == "ours ZeRO-2":
        model = dt.zero.Zero2DataParallel(model, torch.optim.AdamW)
        return model, model.optimizer
    if variant.startswith("ours ZeRO-3"):
        model = dt.zero.FullyShardedDataParallel(
            model, prefetch="no prefetch" not in variant)
        return model, torch.optim.AdamW(model.parameters())
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters())


def state_bytes(variant: str, model, optimizer) -> int:
    """Model-state bytes this rank holds, each storage once."""
    if variant == "torch ZeroRedundancyOptimizer":
        optimizer = optimizer.optim  # the local optimizer, over this rank's params
    if variant != "torch FSDP2 fully_shard":
        return dt.zero.model_state_bytes(model, optimizer)["total"]

    def local(tensor):
        return tensor.to_local() if isinstance(tensor, DTensor) else tensor
    tensors = [local(p) for p in model.parameters()]
    tensors += [local(p.grad) for p in model.parameters() if p.grad is not None]
    tensors += [local(v) for state in optimizer.state.values()
                for v in state.values() if isinstance(v, torch.Tensor)]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in tensors}
    return sum(storages.values())


def steps(rank, world_size, variant: str) -> dict:
    """Seconds per step and per forward + backward; bytes after a step."""
    model, optimizer = build(variant)
    torch.manual_seed(rank)
    batch = torch.randn(BATCH, WIDTH)
    step_s, forward_backward_s = [], []
    for _ in range(WARMUP_STEPS + STEPS):
        started = time.perf_counter()
        model(batch).square().mean().backward()
        backward_done = time.perf_counter()
        optimizer.step()
        stepped = time.perf_counter()
        bytes_held = state_bytes(variant, model, optimizer)  # not timed
        zeroing = time.perf_counter()
        optimizer.zero_grad()
        step_s.append(stepped - started + time.perf_counter() - zeroing)
        forward_backward_s.append(backward_done - started)
    return dict(step=step_s[WARMUP_STEPS:],
                forward_backward=forward_backward_s[WARMUP_STEPS:],
                bytes=bytes_held)


def measure() -> dict:
    samples = {v: dict(step=[], forward_backward=[], bytes=set()) for v in VARIANTS}
    for _ in range(REPEATS):
        for variant in VARIANTS:
            for rank_result in dt.run(steps, WORLD_SIZE, args=(variant,),
                                      timeout=TIMEOUT):
                samples[variant]["step"] += rank_result["step"]
                samples[variant]["forward_backward"] += rank_result["forward_backward"]
                samples[variant]["bytes"].add(rank_result["bytes"])
        print("ms per step so far:", {v: round(1000 * statistics.median(
            s["step"])) for v, s in samples.items()}, file=sys.stderr)
    return samples


def report(samples: dict, took_s: float) -> str:
    num_params = sum(p.numel() for p in reference_mlp(WIDTH, DEPTH).parameters())
    ms = {v: 1000 * statistics.median(s["step"]) for v, s in samples.items()}
    ratio = ms["ours ZeRO-3"] / ms["torch FSDP2 fully_shard"]
    lines = [
        "# ZeRO stages: ours against torch's",
        "",
        f"Date: {datetime.date.today().isoformat()}. Machine: {machine()}.",
        "",
        f"MLP {DEPTH} x (Linear({WIDTH}, {WIDTH}) + ReLU), {num_params / 1e6:.1f}M "
        f"parameters, batch {BATCH} per rank, AdamW, CPU gloo, world size "
        f"{WORLD_SIZE}. Step = forward + backward + optimizer step + zero_grad. "
        f"Median over every rank's steps: {REPEATS} interleaved repetitions x "
        f"{STEPS} measured steps after {WARMUP_STEPS} warm-up, per variant. "
        f"Model states: bytes of parameters, gradients and optimizer state per "
        f"rank after the step; predicted: `zero_bytes_per_device(..., "
        f"param_bytes=4, grad_bytes=4, optimizer_bytes_per_param=8)`.",
        "",
        "| variant | stage | step ms | forward + backward ms | model states MB "
        "per rank | predicted MB |",
        "|---|---|---|---|---|---|",
    ]
    for variant, (stage, _) in VARIANTS.items():
        s = samples[variant]
        held = " / ".join(f"{b / 1e6:.1f}" for b in sorted(s["bytes"]))
        predicted = dt.memory.zero_bytes_per_device(
            num_params, WORLD_SIZE, stage, 8, param_bytes=4, grad_bytes=4)
        lines.append(
            f"| {variant} | {stage} | {ms[variant]:.0f} | "
            f"{1000 * statistics.median(s['forward_backward']):.0f} | {held} | "
            f"{predicted / 1e6:.1f} |")
    lines += [
        "",
        f"Ours ZeRO-3 / torch FSDP2 step time: **{ratio:.2f}** (target <= "
        f"{TARGET:.1f}: {'met' if ratio <= TARGET else 'NOT met'}).",
        "",
        "Spread (min - max ms per step, n steps): " + "; ".join(
            f"{v} {1000 * min(s['step']):.0f}-{1000 * max(s['step']):.0f} "
            f"(n={len(s['step'])})" for v, s in samples.items()) + ".",
        "",
        f"Benchmark wall time: {took_s:.0f} s.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    measure_and_publish("zero_vs_torch.md", measure, report)


if __name__ == "__main__":
    main()
