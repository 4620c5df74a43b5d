"""The model of a text spec as trainerd builds it, in plain PyTorch.

trainerd seeds LibTorch's global CPU generator with the job's seed and builds the layers in order
(torch.nn's own initialisers), so ``torch.manual_seed(seed)`` then :func:`build` gives the same
initial weights. Dropout draws its masks from the job's generator (``generator``): in training
mode ``x * bernoulli(1 - p) / (1 - p)`` with the mask drawn by ``torch.empty_like(x).bernoulli_(
1 - p, generator=generator)``, one draw per dropout layer per forward, in layer order.
"""

from __future__ import annotations

import torch
from torch import nn


class SeededDropout(nn.Module):
    def __init__(self, rate: float, generator: torch.Generator) -> None:
        super().__init__()
        self.rate = rate
        self.generator = generator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.rate == 0.0:
            return x
        keep = 1.0 - self.rate
        mask = torch.empty_like(x).bernoulli_(keep, generator=self.generator)
        return x * mask.div_(keep)


def build(spec: str, feature_shape: tuple[int, ...], seed: int, generator: torch.Generator) -> nn.Sequential:
    torch.manual_seed(seed)
    shape = tuple(feature_shape)  # one row's shape at this layer's input
    layers: list[nn.Module] = []
    for text in spec.split(","):
        name, *raw = text.strip().split(":")
        if name == "linear":
            layers.append(nn.Linear(shape[-1], int(raw[0])))
            shape = (*shape[:-1], int(raw[0]))
        elif name == "conv2d":
            out, k = int(raw[0]), int(raw[1])
            stride = int(raw[2]) if len(raw) > 2 else 1
            pad = int(raw[3]) if len(raw) > 3 else 0
            layers.append(nn.Conv2d(shape[0], out, k, stride=stride, padding=pad))
            h = (shape[1] + 2 * pad - k) // stride + 1
            w = (shape[2] + 2 * pad - k) // stride + 1
            shape = (out, h, w)
        elif name in ("maxpool2d", "avgpool2d"):
            k = int(raw[0])
            layers.append(nn.MaxPool2d(k) if name == "maxpool2d" else nn.AvgPool2d(k))
            shape = (shape[0], shape[1] // k, shape[2] // k)
        elif name == "flatten":
            layers.append(nn.Flatten(start_dim=1))
            size = 1
            for d in shape:
                size *= d
            shape = (size,)
        elif name == "dropout":
            layers.append(SeededDropout(float(raw[0]), generator))
        elif name == "batchnorm":
            layers.append(nn.BatchNorm1d(shape[0]) if len(shape) == 1 else nn.BatchNorm2d(shape[0]))
        elif name == "layernorm":
            layers.append(nn.LayerNorm(list(shape)))
        else:
            layers.append(
                {
                    "relu": nn.ReLU,
                    "gelu": nn.GELU,
                    "tanh": nn.Tanh,
                    "sigmoid": nn.Sigmoid,
                    "softmax": lambda: nn.Softmax(dim=1),
                    "logsoftmax": lambda: nn.LogSoftmax(dim=1),
                }[name]()
            )
    return nn.Sequential(*layers)
