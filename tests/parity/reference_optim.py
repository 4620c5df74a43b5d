"""trainerd's optimizers in plain PyTorch: ``make_optimizer(spec, model)`` with the options of the
Python client's ``submit`` (unset ones take torch.optim's defaults; adamw's weight decay 0.01)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def _given(spec: dict[str, Any], name: str, default: Any) -> Any:
    value = spec.get(name)
    return default if value is None else value


def make_optimizer(spec: dict[str, Any], model: nn.Module) -> torch.optim.Optimizer:
    kind = spec.get("optimizer", "sgd")
    lr = spec.get("lr", 0.01)
    params = list(model.parameters())
    if kind == "sgd":
        return torch.optim.SGD(
            params,
            lr=lr,
            momentum=_given(spec, "momentum", 0.0),
            nesterov=bool(spec.get("nesterov", False)),
            weight_decay=_given(spec, "weight_decay", 0.0),
        )
    betas = (_given(spec, "beta1", 0.9), _given(spec, "beta2", 0.999))
    if kind == "adam":
        return torch.optim.Adam(
            params, lr=lr, betas=betas, eps=_given(spec, "eps", 1e-8),
            weight_decay=_given(spec, "weight_decay", 0.0),
        )
    if kind == "adamw":
        return torch.optim.AdamW(
            params, lr=lr, betas=betas, eps=_given(spec, "eps", 1e-8),
            weight_decay=_given(spec, "weight_decay", 0.01),
        )
    if kind == "rmsprop":
        return torch.optim.RMSprop(
            params, lr=lr, alpha=_given(spec, "alpha", 0.99), eps=_given(spec, "eps", 1e-8),
            weight_decay=_given(spec, "weight_decay", 0.0), momentum=_given(spec, "momentum", 0.0),
        )
    raise ValueError(f"no reference for optimizer {kind}")
