"""The README's picture: docs/timeline.png, a traced step of the course's
DDP on 2 CPU ranks with 2 MiB buckets (the last try of notebook 03), where
gradient buckets travel while backward still runs.

    .venv/bin/python tools/readme_timeline.py
"""
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

import ddp_teach as dt
import ddp_teach.ddp

OUT = Path(__file__).resolve().parents[1] / "docs" / "timeline.png"
WIDTH, DEPTH, BATCH, STEPS = 512, 6, 64, 3


def train(rank, world_size):
    torch.manual_seed(0)
    model = dt.trace_layers(nn.Sequential(
        *[nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH)]))
    net = dt.ddp.DistributedDataParallel(model, bucket_cap_mb=2)
    g = torch.Generator().manual_seed(100 + rank)
    x, y = (torch.randn(BATCH, WIDTH, generator=g) for _ in range(2))
    for _ in range(STEPS):
        net.zero_grad()
        F.mse_loss(net(x), y).backward()


if __name__ == "__main__":
    result = dt.run(train, 2, backend="gloo", trace=True)
    figure = result.timeline.plot(
        title=f"dt.ddp on 2 CPU ranks, {STEPS} steps, 2 MiB buckets: overlap "
              f"{result.timeline.mean_overlap():.0%}\ngradient all-reduces "
              "(orange) run while backward still computes (blue)")
    OUT.parent.mkdir(exist_ok=True)
    figure.savefig(OUT, dpi=90)
    print(OUT)
