"""trainerd's learning-rate schedules in plain PyTorch terms: the rate of each epoch."""

from __future__ import annotations

import math
from typing import Any


def lr_for_epoch(spec: dict[str, Any], epoch: int) -> float:
    """The rate of epoch ``epoch`` (1-based): a linear warm-up over the first ``warmup_epochs``
    (lr * e / (warmup + 1)), then the schedule over the remaining epochs, e = 1..n:
    constant; step: lr * gamma ** ((e - 1) // step_epochs); cosine: CosineAnnealingLR with
    T_max = n, eta_min = min_lr, stepped once per epoch (epoch e uses its (e - 1)-th value)."""
    lr = spec.get("lr", 0.01)
    warmup = spec.get("warmup_epochs") or 0
    if epoch <= warmup:
        return lr * epoch / (warmup + 1)
    e = epoch - warmup
    n = max(spec.get("epochs", 10) - warmup, 1)
    kind = spec.get("schedule", "constant")
    if kind == "constant":
        return lr
    if kind == "step":
        gamma = spec.get("gamma") or 0.1
        return lr * gamma ** ((e - 1) // spec["step_epochs"])
    if kind == "cosine":
        low = spec.get("min_lr") or 0.0
        return low + (lr - low) * (1 + math.cos(math.pi * (e - 1) / n)) / 2
    raise ValueError(f"no reference for schedule {kind}")


def lr_for_step(spec: dict[str, Any], epoch: int, step_in_epoch: int, steps_per_epoch: int) -> float:
    """The rate of one optimizer step; per-epoch schedules give every step of an epoch its
    epoch's rate."""
    return lr_for_epoch(spec, epoch)
