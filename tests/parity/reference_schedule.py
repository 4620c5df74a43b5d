"""trainerd's learning-rate schedules in plain PyTorch terms: each kind is its
torch.optim.lr_scheduler class, stepped as a PyTorch loop steps it (docs/TRAINING.md).

A schedule advances once per epoch (``scheduler.step()`` after the epoch; plateau's
``scheduler.step(validation_loss)``) or, with ``schedule_per_step`` (always for onecycle), once
per optimizer step (``scheduler.step()`` after each batch). Its units are epochs or steps; a
warm-up of w units is ``LinearLR(start_factor=1 / (w + 1), total_iters=w)`` followed by the
schedule (``SequentialLR(milestones=[w])``), which then runs over the remaining units."""

from __future__ import annotations

from typing import Any

import torch
from torch.optim import lr_scheduler


def _main(kind: str, spec: dict[str, Any], optimizer: torch.optim.Optimizer, units: int) -> Any:
    """The schedule after the warm-up, over `units` units; None for constant."""
    gamma = spec.get("gamma") or 0.1
    min_lr = spec.get("min_lr") or 0.0
    if kind == "constant":
        return None
    if kind == "step":
        return lr_scheduler.StepLR(optimizer, step_size=spec["step_epochs"], gamma=gamma)
    if kind == "multistep":
        return lr_scheduler.MultiStepLR(optimizer, milestones=list(spec["milestones"]), gamma=gamma)
    if kind == "exponential":
        return lr_scheduler.ExponentialLR(optimizer, gamma=gamma)
    if kind == "cosine":
        return lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(units, 1), eta_min=min_lr)
    if kind == "cosine_restarts":
        return lr_scheduler.CosineAnnealingWarmRestarts(
            optimizer, T_0=spec["t_0"], T_mult=spec.get("t_mult") or 1, eta_min=min_lr
        )
    if kind == "onecycle":
        # trainerd keeps the optimizer's momentum and beta1: cycle_momentum=False.
        return lr_scheduler.OneCycleLR(
            optimizer,
            max_lr=spec.get("lr", 0.01),
            total_steps=units,
            pct_start=spec.get("pct_start", 0.3),
            anneal_strategy=spec.get("anneal_strategy", "cos"),
            div_factor=spec.get("div_factor", 25.0),
            final_div_factor=spec.get("final_div_factor", 1e4),
            three_phase=spec.get("three_phase", False),
            cycle_momentum=False,
        )
    if kind == "plateau":
        return lr_scheduler.ReduceLROnPlateau(
            optimizer,
            mode="min",
            factor=spec.get("plateau_factor", 0.1),
            patience=spec.get("plateau_patience", 10),
            threshold=spec.get("plateau_threshold", 1e-4),
            threshold_mode="rel",
            cooldown=spec.get("plateau_cooldown", 0),
            min_lr=min_lr,
        )
    raise ValueError(f"no reference for schedule {kind}")


class Schedule:
    """The job's schedule on `optimizer`, whose lr is the spec's; the loop calls after_step()
    after each optimizer step and after_epoch(validation_loss) after each epoch."""

    def __init__(
        self, spec: dict[str, Any], optimizer: torch.optim.Optimizer, steps_per_epoch: int
    ) -> None:
        kind = spec.get("schedule", "constant")
        self.per_step = bool(spec.get("schedule_per_step")) or kind == "onecycle"
        self.plateau = kind == "plateau"
        epochs = spec.get("epochs", 10)
        units = epochs * steps_per_epoch if self.per_step else epochs
        warmup = (spec.get("warmup_steps") if self.per_step else spec.get("warmup_epochs")) or 0
        main = _main(kind, spec, optimizer, units - warmup)
        self.scheduler = main
        if warmup > 0:
            linear = lr_scheduler.LinearLR(
                optimizer, start_factor=1 / (warmup + 1), end_factor=1.0, total_iters=warmup
            )
            self.scheduler = (
                linear
                if main is None
                else lr_scheduler.SequentialLR(optimizer, [linear, main], milestones=[warmup])
            )

    def after_step(self) -> None:
        if self.per_step and self.scheduler is not None:
            self.scheduler.step()

    def after_epoch(self, validation_loss: float | None) -> None:
        if self.plateau:
            assert validation_loss is not None, "plateau needs validation"
            self.scheduler.step(validation_loss)
        elif not self.per_step and self.scheduler is not None:
            self.scheduler.step()
