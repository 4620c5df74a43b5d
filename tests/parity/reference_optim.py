"""trainerd's optimizers in plain PyTorch: ``make_optimizer(spec, model)`` with the options of the
Python client's ``submit`` (unset ones take torch.optim's defaults; adamw's weight decay 0.01)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def _given(spec: dict[str, Any], name: str, default: Any) -> Any:
    value = spec.get(name)
    return default if value is None else value


def _decay(spec: dict[str, Any]) -> float:
    return float(_given(spec, "weight_decay", 0.01 if spec.get("optimizer") == "adamw" else 0.0))


def _params(spec: dict[str, Any], model: nn.Module) -> list[Any]:
    """Every parameter in one group, or under weight_decay_exclude_bias_and_norm those of more
    than one dimension, then those of one or fewer at weight decay 0 (empty groups left out)."""
    params = list(model.parameters())
    if not spec.get("weight_decay_exclude_bias_and_norm"):
        return params
    decay = [p for p in params if p.dim() > 1]
    no_decay = [p for p in params if p.dim() <= 1]
    groups: list[dict[str, Any]] = []
    if decay:
        groups.append({"params": decay})
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def make_optimizer(spec: dict[str, Any], model: nn.Module) -> torch.optim.Optimizer:
    kind = spec.get("optimizer", "sgd")
    lr = spec.get("lr", 0.01)
    params = _params(spec, model)
    if kind == "sgd":
        return torch.optim.SGD(
            params,
            lr=lr,
            momentum=_given(spec, "momentum", 0.0),
            nesterov=bool(spec.get("nesterov", False)),
            weight_decay=_decay(spec),
        )
    betas = (_given(spec, "beta1", 0.9), _given(spec, "beta2", 0.999))
    if kind == "adam":
        return torch.optim.Adam(
            params, lr=lr, betas=betas, eps=_given(spec, "eps", 1e-8),
            weight_decay=_decay(spec), amsgrad=bool(spec.get("amsgrad", False)),
        )
    if kind == "adamw":
        return torch.optim.AdamW(
            params, lr=lr, betas=betas, eps=_given(spec, "eps", 1e-8),
            weight_decay=_decay(spec), amsgrad=bool(spec.get("amsgrad", False)),
        )
    if kind == "rmsprop":
        return torch.optim.RMSprop(
            params, lr=lr, alpha=_given(spec, "alpha", 0.99), eps=_given(spec, "eps", 1e-8),
            weight_decay=_decay(spec), momentum=_given(spec, "momentum", 0.0),
            centered=bool(spec.get("centered", False)),
        )
    if kind == "nadam":
        return torch.optim.NAdam(
            params, lr=lr, betas=betas, eps=_given(spec, "eps", 1e-8),
            weight_decay=_decay(spec), momentum_decay=_given(spec, "momentum_decay", 4e-3),
            decoupled_weight_decay=bool(spec.get("decoupled_weight_decay", False)),
        )
    if kind == "radam":
        return torch.optim.RAdam(
            params, lr=lr, betas=betas, eps=_given(spec, "eps", 1e-8),
            weight_decay=_decay(spec),
            decoupled_weight_decay=bool(spec.get("decoupled_weight_decay", False)),
        )
    if kind == "adagrad":
        return torch.optim.Adagrad(
            params, lr=lr, lr_decay=_given(spec, "lr_decay", 0.0),
            weight_decay=_decay(spec),
            initial_accumulator_value=_given(spec, "initial_accumulator_value", 0.0),
            eps=_given(spec, "eps", 1e-10),
        )
    raise ValueError(f"no reference for optimizer {kind}")
