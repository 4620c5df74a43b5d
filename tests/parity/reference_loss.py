"""trainerd's losses in plain PyTorch: ``make_loss(spec)`` gives the training loss and the
validation loss of a batch, each the mean over the batch's rows (torch.nn.functional's
'mean' reduction)."""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _loss(spec: dict[str, Any], training: bool) -> LossFn:
    kind = spec.get("loss") or "mse"
    if kind == "mse":
        return lambda out, y: F.mse_loss(out, y.view(out.shape))
    if kind == "l1":
        return lambda out, y: F.l1_loss(out, y.view(out.shape))
    if kind == "huber":
        delta = spec.get("huber_delta") or 1.0
        return lambda out, y: F.huber_loss(out, y.view(out.shape), delta=delta)
    if kind == "bce_with_logits":
        return lambda out, y: F.binary_cross_entropy_with_logits(out, y.view(out.shape))
    if kind == "cross_entropy":
        smoothing = spec.get("label_smoothing") or 0.0
        return lambda out, y: F.cross_entropy(out, y.view(-1), label_smoothing=smoothing)
    if kind == "nll":
        return lambda out, y: F.nll_loss(out, y.view(-1))
    raise ValueError(f"no reference for loss {kind}")


def make_loss(spec: dict[str, Any]) -> tuple[LossFn, LossFn]:
    """(training loss, validation loss)."""
    return _loss(spec, training=True), _loss(spec, training=False)


def is_classification(spec: dict[str, Any]) -> bool:
    return spec.get("loss") in ("cross_entropy", "nll")
