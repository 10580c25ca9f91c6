"""The course's reference model: the MLP whose step times the benchmarks
record on a 2-core CPU, so that benchmarks and notebooks measure the same
thing."""
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
