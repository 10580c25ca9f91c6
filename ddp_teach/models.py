"""The course's models: one reference MLP (8 x Linear(1024, 1024) + ReLU,
batch 256) that the benchmarks and the notebooks both time, so that their
step times can be compared with each other; and ResNet-50, the model of
published data-parallel figures (the PyTorch DDP paper among them), built
here because torchvision is not part of the course's environment. Build it
on the meta device to simulate it without its 100 MB of weights."""
import torch
from torch import nn

REFERENCE_WIDTH, REFERENCE_DEPTH, REFERENCE_BATCH = 1024, 8, 256


def reference_mlp(width: int = REFERENCE_WIDTH, depth: int = REFERENCE_DEPTH,
                  seed: int = 0) -> torch.nn.Sequential:
    """depth x (Linear(width, width) + ReLU), the same weights for a seed."""
    torch.manual_seed(seed)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


class Bottleneck(nn.Module):
    """ResNet's bottleneck block: 1x1 down to `width` channels, 3x3 (with
    the block's stride), 1x1 up to 4 x width, plus the shortcut, which is
    projected by a strided 1x1 when the shape changes (He et al., "Deep
    Residual Learning for Image Recognition", CVPR 2016, Table 1)."""

    def __init__(self, channels_in: int, width: int, stride: int):
        super().__init__()
        out = 4 * width
        self.body = nn.Sequential(
            nn.Conv2d(channels_in, width, 1, bias=False), nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride, 1, bias=False),
            nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, out, 1, bias=False), nn.BatchNorm2d(out))
        self.shortcut = nn.Identity() if stride == 1 and channels_in == out \
            else nn.Sequential(nn.Conv2d(channels_in, out, 1, stride, bias=False),
                               nn.BatchNorm2d(out))

    def forward(self, x):
        return torch.relu(self.body(x) + self.shortcut(x))


def resnet50(num_classes: int = 1000, device=None) -> nn.Sequential:
    """ResNet-50 (3, 4, 6, 3 bottleneck blocks; 25.6 M parameters), for
    224 x 224 images. device="meta" gives its shapes without memory."""
    with torch.device(device or "cpu"):
        layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                  nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
        channels = 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2),
                                      (512, 3, 2)):
            for b in range(blocks):
                layers.append(Bottleneck(channels, width, stride if b == 0 else 1))
                channels = 4 * width
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                   nn.Linear(channels, num_classes)]
        return nn.Sequential(*layers)
