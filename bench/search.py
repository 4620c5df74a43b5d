#!/usr/bin/env python3
"""A hyperparameter search on scikit-learn's digits (bench/README.md, "search"): 64 trials over
an MLP's width (32-256, log), depth (1-3 hidden layers), Adam's learning rate (1e-4 to 1e-1, log)
and the batch size (16, 32, 64, 128, 256), up to 100 epochs each, every trial validating on the
same 20% of the rows. Three runners on the same trials, interleaved by round:

- ``trainerd-full``: one sweep of the 64 trials, every one to 100 epochs (the full search);
- ``trainerd-asha-<metric>``: the same sweep with the daemon's successive halving (rungs at 3, 9,
  27 and 81 epochs, a reduction factor of 3) comparing the validation loss (``loss``) or the
  validation error, 1 - accuracy (``accuracy``);
- ``optuna-pytorch-<metric>``: Optuna (the same 64 trials enqueued, its SuccessiveHalvingPruner
  with the same rungs, told the same metric) driving plain single-threaded PyTorch loops, one trial
  after another.

For each: the wall seconds from the first submit to the last trial's end, the best held-out
accuracy any trial reached (its last epoch's), the accuracy of the trial each ranks best by its
validation loss, and the epochs trained. Writes search.json into --results-dir.

Run by bench/run.sh with the Python client's environment (python/venv.sh), which has Optuna.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from typing import Any

import numpy as np
import optuna
import torch
from torch import nn

import trainerd
from daemons import free_port, start
from trainerd._split import held_out_rows

TRIALS = 64
EPOCHS = 100
MIN_EPOCHS = 3
FACTOR = 3
FRACTION = 0.2
SEED = 0
BATCHES = (16, 32, 64, 128, 256)


def digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    data = load_digits()
    return (data.data / 16.0).astype(np.float32), data.target.astype(np.int64)


def draw_trials(count: int, seed: int) -> list[dict[str, Any]]:
    """The search's trials, drawn once: width log-uniform over 32-256, depth 1-3, lr log-uniform
    over 1e-4 to 1e-1, batch size one of BATCHES."""
    rng = np.random.default_rng(seed)
    trials = []
    for _ in range(count):
        width = int(round(math.exp(rng.uniform(math.log(32), math.log(256)))))
        depth = int(rng.integers(1, 4))
        lr = float(math.exp(rng.uniform(math.log(1e-4), math.log(1e-1))))
        batch = int(rng.choice(BATCHES))
        trials.append(dict(width=width, depth=depth, lr=lr, batch_size=batch))
    return trials


def model_spec(trial: dict[str, Any]) -> str:
    return ",".join([f"linear:{trial['width']},relu"] * trial["depth"] + ["linear:10"])


def trainerd_search(client: trainerd.Client, trials: list[dict[str, Any]],
                    halving: bool, metric: str) -> dict[str, Any]:
    points = [dict(model=model_spec(t), lr=t["lr"], batch_size=t["batch_size"]) for t in trials]
    options: dict[str, Any] = {}
    if halving:
        options = dict(halving_min_epochs=MIN_EPOCHS, halving_reduction_factor=FACTOR)
        if metric == "accuracy":
            options["early_stop_metric"] = "accuracy"  # the rungs compare 1 - accuracy
    begin = time.perf_counter()
    sweep = client.sweep("digits", model=points[0]["model"], points=points, epochs=EPOCHS,
                         loss="cross_entropy", optimizer="adam", seed=SEED,
                         validation_fraction=FRACTION, device="cpu", **options)
    sweep.wait(timeout=3600, progress=False, plot=False)
    seconds = time.perf_counter() - begin
    failed = [j for j in sweep.jobs if j.state != trainerd.JobState.SUCCEEDED]
    if failed:
        raise RuntimeError(f"{len(failed)} members did not succeed: {failed[0].error}")
    last = [j.history[-1] for j in sweep.jobs]
    best = sweep.best()
    return dict(seconds=seconds,
                best_accuracy=max(e.validation_accuracy for e in last),
                picked_accuracy=best.history[-1].validation_accuracy,
                picked=trials[sweep.jobs.index(best)],
                epochs=sum(j.epochs_completed for j in sweep.jobs),
                stopped=sum(1 for j in sweep.jobs if j.stopped_early))


class Mlp(nn.Sequential):
    def __init__(self, width: int, depth: int) -> None:
        layers: list[nn.Module] = []
        features = 64
        for _ in range(depth):
            layers += [nn.Linear(features, width), nn.ReLU()]
            features = width
        super().__init__(*layers, nn.Linear(features, 10))


def optuna_pytorch(trials: list[dict[str, Any]], x: np.ndarray, y: np.ndarray,
                   metric: str) -> dict[str, Any]:
    """Optuna's successive halving over plain single-threaded PyTorch loops (a permutation per
    epoch, loss.item() each step, an eval pass each epoch), on the rows trainerd trains and
    validates on."""
    held_out = held_out_rows(len(x), FRACTION, SEED)
    train = np.setdiff1d(np.arange(len(x)), held_out)
    features, targets = torch.from_numpy(x[train]), torch.from_numpy(y[train])
    val_x, val_y = torch.from_numpy(x[held_out]), torch.from_numpy(y[held_out])
    loss_fn = nn.CrossEntropyLoss()
    last: dict[int, tuple[float, float]] = {}
    epochs_trained = [0]

    def objective(trial: optuna.Trial) -> float:
        width = trial.suggest_int("width", 32, 256, log=True)
        depth = trial.suggest_int("depth", 1, 3)
        lr = trial.suggest_float("lr", 1e-4, 1e-1, log=True)
        batch = trial.suggest_categorical("batch_size", list(BATCHES))
        torch.manual_seed(SEED)
        model = Mlp(width, depth)
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        generator = torch.Generator().manual_seed(SEED)
        value = accuracy = math.inf
        for epoch in range(1, EPOCHS + 1):
            model.train()
            order = torch.randperm(len(features), generator=generator)
            total = 0.0
            for begin in range(0, len(order), batch):
                index = order[begin:begin + batch]
                optimizer.zero_grad()
                loss = loss_fn(model(features[index]), targets[index])
                loss.backward()
                optimizer.step()
                total += loss.item() * len(index)
            model.eval()
            with torch.no_grad():
                logits = model(val_x)
                value = float(loss_fn(logits, val_y))
                accuracy = float((logits.argmax(1) == val_y).float().mean())
            epochs_trained[0] += 1
            last[trial.number] = (value, accuracy)
            trial.report(value if metric == "loss" else 1.0 - accuracy, epoch)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return value if metric == "loss" else 1.0 - accuracy

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        begin = time.perf_counter()
        study = optuna.create_study(
            direction="minimize", sampler=optuna.samplers.TPESampler(seed=SEED),
            pruner=optuna.pruners.SuccessiveHalvingPruner(
                min_resource=MIN_EPOCHS, reduction_factor=FACTOR))
        for t in trials:
            study.enqueue_trial(t)
        study.optimize(objective, n_trials=len(trials))
        seconds = time.perf_counter() - begin
    finally:
        torch.set_num_threads(previous)
    best = study.best_trial
    return dict(seconds=seconds,
                best_accuracy=max(a for _, a in last.values()),
                picked_accuracy=last[best.number][1],
                picked=dict(best.params),
                epochs=epochs_trained[0],
                stopped=sum(1 for t in study.trials if t.state == optuna.trial.TrialState.PRUNED))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", default="build/release")
    parser.add_argument("--results-dir", default="build/bench")
    parser.add_argument("--trials", type=int, default=TRIALS)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--metrics", default="loss,accuracy",
                        help="what halving compares (and Optuna's pruner is told), each in turn: "
                        "loss (the validation loss), accuracy (the validation error, 1 - accuracy)")
    args = parser.parse_args()
    metrics = args.metrics.split(",")

    x, y = digits()
    trials = draw_trials(args.trials, SEED)
    runs: dict[str, list[dict[str, Any]]] = {"trainerd-full": []}
    for metric in metrics:
        runs[f"trainerd-asha-{metric}"] = []
        runs[f"optuna-pytorch-{metric}"] = []
    with tempfile.TemporaryDirectory() as work:
        address = f"127.0.0.1:{free_port()}"
        proc = start(args.build_dir, work, address, "", "node")
        try:
            client = trainerd.Client(address)
            client.upload("digits", x, y)
            for _ in range(args.rounds):
                runs["trainerd-full"].append(
                    trainerd_search(client, trials, halving=False, metric="loss"))
                for metric in metrics:
                    runs[f"trainerd-asha-{metric}"].append(
                        trainerd_search(client, trials, halving=True, metric=metric))
                    runs[f"optuna-pytorch-{metric}"].append(optuna_pytorch(trials, x, y, metric))
        finally:
            proc.terminate()
            proc.wait(timeout=30)

    median = {name: statistics.median(r["seconds"] for r in rs) for name, rs in runs.items()}
    print(f"search: digits, {args.trials} trials of up to {EPOCHS} epochs, "
          f"rungs {MIN_EPOCHS}x{FACTOR}^k, median of {args.rounds} round(s)")
    print(f"{'runner':<24} {'seconds':>9} {'epochs':>7} {'stopped':>8} {'best acc':>9} "
          f"{'picked acc':>11}")
    for name, rs in runs.items():
        r = rs[-1]
        print(f"{name:<24} {median[name]:>9.2f} {r['epochs']:>7} {r['stopped']:>8} "
              f"{r['best_accuracy']:>9.4f} {r['picked_accuracy']:>11.4f}")
    full = runs["trainerd-full"][-1]
    for metric in metrics:
        asha = runs[f"trainerd-asha-{metric}"][-1]
        print(f"asha by {metric}: "
              f"{median['trainerd-full'] / median[f'trainerd-asha-{metric}']:.2f}x faster than the "
              f"full search (target >= 3x), best accuracy "
              f"{(asha['best_accuracy'] / full['best_accuracy'] - 1) * 100:+.2f}% of the full "
              f"search's (target within -0.5%), "
              f"{median[f'optuna-pytorch-{metric}'] / median[f'trainerd-asha-{metric}']:.2f}x "
              "faster than Optuna + PyTorch (target >= 5x)")
    os.makedirs(args.results_dir, exist_ok=True)
    with open(os.path.join(args.results_dir, "search.json"), "w") as f:
        json.dump(dict(trials=trials, runs=runs, median_seconds=median), f, indent=1)


if __name__ == "__main__":
    main()
