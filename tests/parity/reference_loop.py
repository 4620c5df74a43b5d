"""trainerd's epoch loop as a plain PyTorch loop, written from its documented rules
(docs/TRAINING.md): the same initial weights, split, permutation, batches, reductions, clipping,
validation and early stopping. ``train(spec, x, y)`` returns what a job reports."""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

import numpy as np
import torch

import reference_loss
import reference_model
import reference_optim
import reference_schedule


@dataclasses.dataclass
class Result:
    losses: list[float]  # per epoch: the mean training loss over the epoch's rows
    validation_losses: list[float]
    validation_accuracies: list[float]
    parameters: dict[str, np.ndarray]  # trained, by name ("0.weight")
    stopped_early: bool
    steps: int


def held_out_rows(fraction: float, rows: int) -> int:
    """round(fraction * rows), halves away from zero (C's llround), as trainerd counts them."""
    return int(math.floor(fraction * rows + 0.5)) if fraction > 0 else 0


def split(rows: int, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The held-out split: one permutation from a generator of its own seeded with the job's
    seed; the first rows - held_out train, the rest validate."""
    held = held_out_rows(fraction, rows)
    if held == 0:
        return None
    order = torch.randperm(rows, generator=torch.Generator().manual_seed(seed))
    return order[: rows - held], order[rows - held :]


def forward(model: torch.nn.Module, x: torch.Tensor, precision: str) -> torch.Tensor:
    """The forward pass, under autocast for bf16/fp16, its output cast to float32."""
    if precision in ("bf16", "fp16"):
        dtype = torch.bfloat16 if precision == "bf16" else torch.float16
        with torch.autocast("cpu", dtype=dtype):
            return model(x).float()
    return model(x)


def train(
    spec: dict[str, Any],
    x: np.ndarray,
    y: np.ndarray,
    validation: tuple[np.ndarray, np.ndarray] | None = None,
    module: torch.nn.Module | None = None,
) -> Result:
    seed = spec["seed"]
    features = torch.from_numpy(x)
    targets = torch.from_numpy(y)
    generator = torch.Generator().manual_seed(seed)  # the job's: shuffling, then dropout
    if module is not None:  # a submitted module trains from its own weights
        model = copy.deepcopy(module)
    else:
        model = reference_model.build(spec["model"], tuple(x.shape[1:]), seed, generator)
    model.train()
    optimizer = reference_optim.make_optimizer(spec, model)
    train_loss, validation_loss = reference_loss.make_loss(spec)
    classification = reference_loss.is_classification(spec)

    rows = features.shape[0]
    train_index: torch.Tensor | None = None
    val_x = val_y = None
    parts = split(rows, spec.get("validation_fraction") or 0.0, seed)
    if parts is not None:
        train_index, val_index = parts
        val_x, val_y = features[val_index], targets[val_index]
        rows = train_index.shape[0]
    elif validation is not None:
        val_x, val_y = torch.from_numpy(validation[0]), torch.from_numpy(validation[1])
    batch = min(spec.get("batch_size", 32), rows)
    epochs = spec.get("epochs", 10)
    shuffle = spec.get("shuffle", True)
    precision = spec.get("precision", "fp32")
    clip = spec.get("clip_grad_norm") or 0.0
    patience = spec.get("early_stop_patience") or 0

    # fp16: dynamic loss scaling as torch.amp.GradScaler with its defaults (a step whose
    # gradients overflowed skips optimizer.step() entirely).
    scaler = torch.amp.GradScaler("cpu") if precision == "fp16" else None

    result = Result([], [], [], {}, False, 0)
    best = math.inf
    without_improvement = 0
    for epoch in range(1, epochs + 1):
        lr = reference_schedule.lr_for_epoch(spec, epoch)
        for group in optimizer.param_groups:
            group["lr"] = lr
        if shuffle:
            order = torch.randperm(rows, generator=generator)
            if train_index is not None:
                order = train_index[order]
        elif train_index is not None:
            order = train_index
        else:
            order = torch.arange(rows)
        total = 0.0
        for begin in range(0, rows, batch):
            index = order[begin : begin + batch]
            xb, yb = features[index], targets[index]
            optimizer.zero_grad()
            loss = train_loss(forward(model, xb, precision), yb)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
            else:
                loss.backward()
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            result.steps += 1
            total += loss.item() * index.shape[0]
        result.losses.append(total / rows)
        if val_x is not None:
            model.eval()
            vtotal = 0.0
            correct = 0
            vbatch = min(spec.get("batch_size", 32), val_x.shape[0])
            with torch.no_grad():
                for begin in range(0, val_x.shape[0], vbatch):
                    xb, yb = val_x[begin : begin + vbatch], val_y[begin : begin + vbatch]
                    out = forward(model, xb, precision)
                    vtotal += validation_loss(out, yb).item() * xb.shape[0]
                    if classification:
                        correct += int((out.argmax(dim=1) == yb.view(-1)).sum())
            model.train()
            vloss = vtotal / val_x.shape[0]
            result.validation_losses.append(vloss)
            if classification:
                result.validation_accuracies.append(correct / val_x.shape[0])
            if vloss < best:
                best = vloss
                without_improvement = 0
            else:
                without_improvement += 1
            if patience > 0 and without_improvement >= patience and epoch < epochs:
                result.stopped_early = True
                break
    result.parameters = {
        name: p.detach().numpy().copy() for name, p in model.named_parameters()
    }
    return result
