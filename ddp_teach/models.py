"""The course's reference model: one MLP (8 x Linear(1024, 1024) + ReLU,
batch 256) that the benchmarks and the notebooks both time, so that their
step times can be compared with each other."""
import torch

REFERENCE_WIDTH, REFERENCE_DEPTH, REFERENCE_BATCH = 1024, 8, 256


def reference_mlp(width: int = REFERENCE_WIDTH, depth: int = REFERENCE_DEPTH,
                  seed: int = 0) -> torch.nn.Sequential:
    """depth x (Linear(width, width) + ReLU), the same weights for a seed."""
    torch.manual_seed(seed)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)
