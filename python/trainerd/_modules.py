"""A text model spec ("conv2d:8:3,relu,maxpool2d:2,flatten,linear:10") as the ``nn.Sequential``
PyTorch users know: the same layers trainerd builds, in order, so that the module's
``state_dict()`` has the names and shapes of a job's trained weights (``0.weight``, ``0.bias``,
``1.running_mean``, ...) and ``load_state_dict`` takes them. Needs torch.

Each layer maps to torch.nn as trainerd's grammar says (docs/TRAINING.md):
``linear:N`` ``nn.Linear(in, N)`` on the last dimension; ``conv2d:C:K[:S[:P]]``
``nn.Conv2d(in, C, K, stride=S, padding=P)``; ``maxpool2d:K``, ``avgpool2d:K`` ``nn.MaxPool2d(K)``,
``nn.AvgPool2d(K)``; ``flatten`` ``nn.Flatten()``; ``dropout:P`` ``nn.Dropout(P)``; ``batchnorm``
``nn.BatchNorm1d`` on a row of features, ``nn.BatchNorm2d`` on C x H x W; ``layernorm``
``nn.LayerNorm`` over the whole row; ``relu``, ``gelu``, ``tanh``, ``sigmoid``; ``softmax`` and
``logsoftmax`` over dimension 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainerd._optional import import_torch

__all__ = ["build_sequential"]


def _ints(name: str, raw: list[str], least: int, most: int) -> list[int]:
    if not least <= len(raw) <= most:
        raise ValueError(f"layer '{name}' takes {least} to {most} numbers, not {len(raw)}")
    try:
        return [int(v) for v in raw]
    except ValueError:
        raise ValueError(f"layer '{name}' takes whole numbers, not {':'.join(raw)!r}") from None


def build_sequential(spec: str, feature_shape: Sequence[int]) -> Any:
    """The ``nn.Sequential`` of ``spec`` for rows shaped ``feature_shape`` (the batch dimension
    left out), freshly initialised; ValueError naming the layer for a spec or a shape trainerd's
    grammar does not take."""
    torch = import_torch()
    nn = torch.nn
    shape = tuple(int(d) for d in feature_shape)
    layers: list[Any] = []
    for index, text in enumerate(spec.split(",")):
        name, *raw = (part.strip() for part in text.strip().split(":"))
        name = name.lower()
        where = f"layer {index + 1} ({text.strip()})"
        if name == "linear":
            (width,) = _ints(name, raw, 1, 1)
            if not shape:
                raise ValueError(f"{where} needs at least one feature dimension")
            layers.append(nn.Linear(shape[-1], width))
            shape = (*shape[:-1], width)
        elif name == "conv2d":
            out, kernel, *rest = _ints(name, raw, 2, 4)
            stride = rest[0] if rest else 1
            padding = rest[1] if len(rest) > 1 else 0
            if len(shape) != 3:
                raise ValueError(f"{where} needs rows shaped C x H x W, not {shape}")
            layers.append(nn.Conv2d(shape[0], out, kernel, stride=stride, padding=padding))
            shape = (
                out,
                (shape[1] + 2 * padding - kernel) // stride + 1,
                (shape[2] + 2 * padding - kernel) // stride + 1,
            )
        elif name in ("maxpool2d", "avgpool2d"):
            (kernel,) = _ints(name, raw, 1, 1)
            if len(shape) != 3:
                raise ValueError(f"{where} needs rows shaped C x H x W, not {shape}")
            layers.append(nn.MaxPool2d(kernel) if name == "maxpool2d" else nn.AvgPool2d(kernel))
            shape = (shape[0], shape[1] // kernel, shape[2] // kernel)
        elif name == "flatten":
            layers.append(nn.Flatten())
            size = 1
            for d in shape:
                size *= d
            shape = (size,)
        elif name == "dropout":
            if len(raw) != 1:
                raise ValueError(f"{where} takes its rate, as in dropout:0.5")
            layers.append(nn.Dropout(float(raw[0])))
        elif name == "batchnorm":
            if len(shape) not in (1, 3):
                raise ValueError(f"{where} needs rows of features or C x H x W, not {shape}")
            layers.append(nn.BatchNorm1d(shape[0]) if len(shape) == 1 else nn.BatchNorm2d(shape[0]))
        elif name == "layernorm":
            layers.append(nn.LayerNorm(list(shape)))
        elif name in ("relu", "gelu", "tanh", "sigmoid"):
            layers.append({"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh,
                           "sigmoid": nn.Sigmoid}[name]())
        elif name == "softmax":
            layers.append(nn.Softmax(dim=1))
        elif name == "logsoftmax":
            layers.append(nn.LogSoftmax(dim=1))
        else:
            raise ValueError(f"{where}: unknown layer '{name}'")
    return nn.Sequential(*layers)
