"""trainerd's losses in plain PyTorch: ``make_loss(spec)`` gives the training loss and the
validation loss of a batch, each the mean over the batch's rows (torch.nn.functional's
'mean' reduction).

The training loss carries the job's loss terms (``label_smoothing``, ``class_weights``,
``pos_weight``); the validation loss is the plain loss without them, as an eval loop computes it.
``ignore_index`` applies to both: training takes the mean over the rows not ignored (a batch of
only ignored rows is 0, with zero gradients, where PyTorch gives NaN); validation leaves ignored
rows out of the validation loss and accuracy (``validation_sum``)."""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def ignore_index(spec: dict[str, Any]) -> int | None:
    return spec.get("ignore_index")


def _class_loss(kind: str, smoothing: float, weight: torch.Tensor | None,
                ignore: int | None) -> LossFn:
    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        target = y.view(-1)
        options: dict[str, Any] = {"weight": weight}
        if ignore is not None:
            options["ignore_index"] = ignore
        if kind == "cross_entropy":
            options["label_smoothing"] = smoothing
            value = F.cross_entropy(out, target, **options)
        else:
            value = F.nll_loss(out, target, **options)
        if ignore is not None and not bool((target != ignore).any()):
            # Every row ignored: 0 with zero gradients (PyTorch's mean is 0/0 here).
            return (out * 0.0).sum()
        return value

    return loss


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
        pos_weight = spec.get("pos_weight") if training else None
        pw = torch.tensor(pos_weight, dtype=torch.float32) if pos_weight is not None else None
        return lambda out, y: F.binary_cross_entropy_with_logits(
            out, y.view(out.shape), pos_weight=pw
        )
    if kind in ("cross_entropy", "nll"):
        smoothing = (spec.get("label_smoothing") or 0.0) if training else 0.0
        weights = spec.get("class_weights") if training else None
        weight = torch.tensor(weights, dtype=torch.float32) if weights is not None else None
        return _class_loss(kind, smoothing, weight, ignore_index(spec))
    raise ValueError(f"no reference for loss {kind}")


def make_loss(spec: dict[str, Any]) -> tuple[LossFn, LossFn]:
    """(training loss, validation loss)."""
    return _loss(spec, training=True), _loss(spec, training=False)


def validation_sum(spec: dict[str, Any], out: torch.Tensor, y: torch.Tensor) -> tuple[float, int]:
    """A validation batch's plain loss summed over its rows, and the rows it counts: all of them,
    or with ignore_index those not ignored (the epoch's validation loss is the sums' ratio)."""
    ignore = ignore_index(spec)
    if ignore is None:
        return make_loss(spec)[1](out, y).item() * out.shape[0], out.shape[0]
    target = y.view(-1)
    loss = F.cross_entropy if spec.get("loss") == "cross_entropy" else F.nll_loss
    total = loss(out, target, ignore_index=ignore, reduction="sum").item()
    return total, int((target != ignore).sum())


def counted_correct(spec: dict[str, Any], out: torch.Tensor, y: torch.Tensor) -> int:
    """The validation rows whose largest output is their target (never an ignored row)."""
    target = y.view(-1)
    right = out.argmax(dim=1) == target
    ignore = ignore_index(spec)
    if ignore is not None:
        right &= target != ignore
    return int(right.sum())


def is_classification(spec: dict[str, Any]) -> bool:
    return spec.get("loss") in ("cross_entropy", "nll")
