"""trainerd's epoch loop as a plain PyTorch loop, written from its documented rules
(docs/TRAINING.md): the same initial weights, split, permutation, batches, reductions, clipping,
validation, early stopping and the model handed back (the best validation epoch's weights, as
Keras' restore_best_weights keeps them, when ``model_from`` says so). ``train(spec, x, y)``
returns what a job reports."""

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
    # per epoch: the rate of its first step (what EpochResult.learning_rate reports)
    learning_rates: list[float] = dataclasses.field(default_factory=list)
    # the best validation epoch (0 without validation) and the epoch the parameters are from
    best_epoch: int = 0
    model_epoch: int = 0
    # the trained model's state_dict(), buffers included, in its order
    state: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


def held_out_rows(fraction: float, rows: int) -> int:
    """round(fraction * rows), halves away from zero (C's llround), as trainerd counts them: the
    float64 product's fraction compared with 0.5 exactly (floor(v + 0.5) would round
    0.49999999999999994 up)."""
    if not fraction > 0:
        return 0
    value = fraction * rows
    whole = math.floor(value)
    return int(whole) + (1 if value - whole >= 0.5 else 0)


def split(
    rows: int, fraction: float, seed: int, shuffle: bool = True
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The held-out split: one permutation from a generator of its own seeded with the job's
    seed; the first rows - held_out train, the rest validate. Without shuffling both parts are
    taken in ascending row index."""
    held = held_out_rows(fraction, rows)
    if held == 0:
        return None
    order = torch.randperm(rows, generator=torch.Generator().manual_seed(seed))
    train, val = order[: rows - held], order[rows - held :]
    if not shuffle:
        train, val = train.sort().values, val.sort().values
    return train, val


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
    seeded_dropout: bool = False,
) -> Result:
    """``seeded_dropout``: the module's nn.Dropout layers draw their masks from the job's
    generator, as an exported program's dropout does (docs/TRAINING.md)."""
    seed = spec["seed"]
    features = torch.from_numpy(x)
    targets = torch.from_numpy(y)
    generator = torch.Generator().manual_seed(seed)  # the job's: shuffling, then dropout
    if module is not None:  # a submitted module trains from its own weights
        model = copy.deepcopy(module)
        if seeded_dropout:
            for parent in list(model.modules()):
                for name, child in list(parent.named_children()):
                    if type(child) is torch.nn.Dropout:
                        setattr(parent, name, reference_model.SeededDropout(child.p, generator))
    else:
        model = reference_model.build(spec["model"], tuple(x.shape[1:]), seed, generator)
    model.train()
    optimizer = reference_optim.make_optimizer(spec, model)
    train_loss, _ = reference_loss.make_loss(spec)
    classification = reference_loss.is_classification(spec)

    rows = features.shape[0]
    train_index: torch.Tensor | None = None
    val_x = val_y = None
    parts = split(rows, spec.get("validation_fraction") or 0.0, seed, spec.get("shuffle", True))
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
    min_delta = spec.get("early_stop_min_delta") or 0.0
    on_accuracy = spec.get("early_stop_metric") == "accuracy"
    accumulate = spec.get("gradient_accumulation_steps") or 1
    # drop_last: DataLoader(drop_last=True) drops the epoch's short last batch.
    used = rows // batch * batch if spec.get("drop_last") else rows

    # The optimizer steps of an epoch: one per `accumulate` batches (the last group may be short).
    steps_per_epoch = -(-(-(-used // batch)) // accumulate)
    schedule = reference_schedule.Schedule(spec, optimizer, steps_per_epoch)
    # fp16: dynamic loss scaling as torch.amp.GradScaler with its defaults (a step whose
    # gradients overflowed skips optimizer.step() entirely).
    scaler = torch.amp.GradScaler("cpu") if precision == "fp16" else None
    result = Result([], [], [], {}, False, 0)
    best = -math.inf if on_accuracy else math.inf
    without_improvement = 0
    # model_from: the best validation epoch's weights (a copy at each improvement), by default
    # when the job has early stopping; else the last epoch's.
    model_from = spec.get("model_from") or "auto"
    keep_best = model_from == "best" or (model_from == "auto" and patience > 0)
    best_state: dict[str, torch.Tensor] | None = None
    last_epoch = 0
    for epoch in range(1, epochs + 1):
        last_epoch = epoch
        result.learning_rates.append(optimizer.param_groups[0]["lr"])
        if shuffle:
            order = torch.randperm(rows, generator=generator)
            if train_index is not None:
                order = train_index[order]
        elif train_index is not None:
            order = train_index
        else:
            order = torch.arange(rows)
        total = 0.0
        # Gradient accumulation, the usual loop: (loss / N).backward() per batch, a step after
        # every N-th batch and after the epoch's last (a short last group still divides by N).
        for i, begin in enumerate(range(0, used, batch)):
            index = order[begin : min(begin + batch, used)]
            xb, yb = features[index], targets[index]
            if i % accumulate == 0:
                optimizer.zero_grad()
            loss = train_loss(forward(model, xb, precision), yb)
            if scaler is not None:
                scaler.scale(loss / accumulate).backward()
            else:
                (loss / accumulate).backward()
            if (i + 1) % accumulate == 0 or begin + batch >= used:
                if scaler is not None:
                    scaler.unscale_(optimizer)
                if clip > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
                if scaler is not None:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                # A skipped fp16 step still advances the schedule, as the usual loop's
                # scheduler.step() after each batch does.
                schedule.after_step()
                result.steps += 1
            total += loss.item() * index.shape[0]
        result.losses.append(total / used)
        vloss = None
        if val_x is not None:
            model.eval()
            # The plain loss (no training-only terms), over the rows it counts: all of them, or
            # those whose target is not the ignore_index.
            vtotal = 0.0
            vrows = 0
            correct = 0
            vbatch = min(spec.get("batch_size", 32), val_x.shape[0])
            with torch.no_grad():
                for begin in range(0, val_x.shape[0], vbatch):
                    xb, yb = val_x[begin : begin + vbatch], val_y[begin : begin + vbatch]
                    out = forward(model, xb, precision)
                    batch_sum, batch_rows = reference_loss.validation_sum(spec, out, yb)
                    vtotal += batch_sum
                    vrows += batch_rows
                    if classification:
                        correct += reference_loss.counted_correct(spec, out, yb)
            model.train()
            vloss = vtotal / vrows
            result.validation_losses.append(vloss)
            if classification:
                result.validation_accuracies.append(correct / vrows)
            # Keras' EarlyStopping: an improvement beats the best by more than min_delta, and
            # only an improvement moves the best.
            if on_accuracy:
                accuracy = result.validation_accuracies[-1]
                improved = accuracy - min_delta > best
                value = accuracy
            else:
                improved = vloss + min_delta < best
                value = vloss
            if improved:
                best = value
                without_improvement = 0
                result.best_epoch = epoch
                if keep_best:
                    best_state = copy.deepcopy(model.state_dict())
            else:
                without_improvement += 1
        schedule.after_epoch(vloss)
        if val_x is not None:
            if patience > 0 and without_improvement >= patience and epoch < epochs:
                result.stopped_early = True
                break
    result.model_epoch = last_epoch
    if best_state is not None:
        model.load_state_dict(best_state)
        result.model_epoch = result.best_epoch
    result.parameters = {
        name: p.detach().numpy().copy() for name, p in model.named_parameters()
    }
    result.state = {name: t.detach().numpy().copy() for name, t in model.state_dict().items()}
    return result
