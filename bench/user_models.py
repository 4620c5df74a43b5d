#!/usr/bin/env python3
"""Users' own models through the daemon against a plain PyTorch loop (bench/README.md).

Two models a user brings as an nn.Module, trained on scikit-learn's digits (1,797 8x8 images,
10 classes, pixels scaled to 0-1), adam lr 1e-3, cross-entropy, batch 64, --epochs epochs (30),
seed 7:

  cnn          Conv2d(1,16,3,p=1), ReLU, MaxPool2d(2), Conv2d(16,32,3,p=1), ReLU, Flatten,
               Dropout(0.25), Linear(512,10); rows shaped 1x8x8.
  transformer  each image as 8 tokens of 8 pixels: Linear(8,32), TransformerEncoderLayer(32, 4, 64,
               batch_first=True, dropout=0.1), mean over the tokens, Linear(32,10); rows 8x8.

Runners, interleaved (one of each per round, the median of --repeats rounds after an untimed one):

  pytorch-1t     a plain PyTorch loop as users write it (a permutation per epoch, a batch at a
                 time, loss.item() each step), torch.set_num_threads(1)
  pytorch-nt     the same loop with as many intra-op threads as the daemon gave the job
  exported       client.submit(model=module): exported with torch.export by the client, trained in
                 the daemon's worker; submit to result, as a user waits (the dataset resident)
  torchscript    client.submit(model=torch.jit.script(module)): the same, as TorchScript

For each daemon runner, the job's own wall_seconds; its fixed cost: what a one-epoch job of the
same model costs the daemon beyond its epoch (wall from Submit to SUCCEEDED minus the job's
wall_seconds, the module already exported or scripted), the median of --repeats one-epoch jobs
submitted a second after the previous job (its checker and worker started and waiting) and, "at
once", of as many submitted as the previous job ended (which wait for a worker's start where
the daemon has too few cores to start one beside a job); and the client's side: torch.export (or torch.jit.script) and save of the module, which the
end-to-end figures include and the fixed cost does not.

Run by bench/run.sh with the Python client's environment (python/venv.sh: torch and scikit-learn);
prints a table and writes user_models.json into --results-dir. A runner the daemon refuses (an
older daemon without exported programs) is reported with its error and left out of the ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from typing import Any, Callable

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench import Daemon  # noqa: E402 (bench/bench.py)

import torch  # noqa: E402
from torch import nn  # noqa: E402

import trainerd  # noqa: E402

EPOCHS = 30
BATCH = 64
LR = 1e-3
SEED = 7


class Cnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Dropout(0.25))
        self.head = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class Transformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 32)
        self.encoder = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.1)
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x)).mean(dim=1))


MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "cnn": (Cnn, (1, 8, 8)),
    "transformer": (Transformer, (8, 8)),
}


def digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    data = load_digits()
    return (data.data / 16.0).astype(np.float32), data.target.astype(np.int64)


def pytorch_loop(make: Callable[[], nn.Module], x: np.ndarray, y: np.ndarray, epochs: int,
                 threads: int) -> float:
    """A plain loop as users write it; returns its wall seconds."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(SEED)
        model = make()
        features, targets = torch.from_numpy(x), torch.from_numpy(y)
        optimizer = torch.optim.Adam(model.parameters(), lr=LR)
        loss_fn = nn.CrossEntropyLoss()
        generator = torch.Generator().manual_seed(SEED)
        start = time.perf_counter()
        for _ in range(epochs):
            model.train()
            order = torch.randperm(len(features), generator=generator)
            total = 0.0
            for begin in range(0, len(order), BATCH):
                index = order[begin:begin + BATCH]
                optimizer.zero_grad()
                loss = loss_fn(model(features[index]), targets[index])
                loss.backward()
                optimizer.step()
                total += loss.item() * len(index)
        return time.perf_counter() - start
    finally:
        torch.set_num_threads(previous)


def module_bytes(runner: str, module: nn.Module, shape: tuple[int, ...]) -> tuple[float, bytes]:
    """What submit(model=module) sends, and the seconds the client takes to make it: the exported
    program (trainerd's own export, as submit does it) or the scripted module, saved."""
    import io

    from trainerd import _spec

    start = time.perf_counter()
    if runner == "exported":
        data = _spec._export_module(module, shape)  # noqa: SLF001 (submit's own export)
    else:
        buffer = io.BytesIO()
        torch.jit.save(torch.jit.script(module), buffer)
        data = buffer.getvalue()
    return time.perf_counter() - start, data


def submit_and_wait(client: trainerd.Client, dataset: str, model: Any, epochs: int) -> tuple[
        float, Any]:
    start = time.perf_counter()
    job = client.submit(dataset, model=model, loss="cross_entropy", optimizer="adam", lr=LR,
                        batch_size=BATCH, epochs=epochs, seed=SEED, device="cpu")
    job.wait(progress=False, plot=False)
    return time.perf_counter() - start, job


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", default="build/release")
    parser.add_argument("--results-dir", default="build/bench")
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default="cnn,transformer")
    args = parser.parse_args()
    os.makedirs(args.results_dir, exist_ok=True)
    x, y = digits()
    results: dict[str, Any] = {"epochs": args.epochs, "rows": int(len(x)), "batch": BATCH,
                               "machine": {"cpus": os.cpu_count(), "torch": torch.__version__},
                               "models": {}}
    daemon = Daemon(args.build_dir, "cpu", os.path.join(args.results_dir, "user_models_daemon"))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.jit's deprecation (the peer)
            measure(daemon, x, y, args, results)
    finally:
        daemon.stop()
    report(results, args)
    return 0


def measure(daemon: Daemon, x: np.ndarray, y: np.ndarray, args: argparse.Namespace,
            results: dict[str, Any]) -> None:
    client = trainerd.Client(daemon.addr)
    for name in args.models.split(","):
        make, shape = MODELS[name]
        dataset = f"digits-{name}"
        client.upload(dataset, x.reshape((-1,) + shape), y, progress=False)
        torch.manual_seed(SEED)
        runners: dict[str, Callable[[int], tuple[float, Any]]] = {
            "exported": lambda e, make=make: submit_and_wait(client, dataset, make(), e),
            "torchscript": lambda e, make=make: submit_and_wait(
                client, dataset, torch.jit.script(make()), e),
        }
        figures: dict[str, Any] = {}
        errors: dict[str, str] = {}
        threads = 1
        for runner, run in list(runners.items()):
            try:
                _, first = run(1)  # untimed; tells the job's intra-op threads
                threads = max(threads, int(first.report.intra_op_threads or 1))
            except Exception as error:  # noqa: BLE001 (reported, not fatal)
                errors[runner] = f"{type(error).__name__}: {error}"
                del runners[runner]
        walls: dict[str, list[float]] = {r: [] for r in
                                         ["pytorch-1t", "pytorch-nt", *runners]}
        own: dict[str, list[float]] = {r: [] for r in runners}
        fixed: dict[str, list[float]] = {r: [] for r in runners}
        client_side: dict[str, list[float]] = {r: [] for r in runners}
        after: dict[str, list[float]] = {r: [] for r in runners}
        for _ in range(args.repeats):
            walls["pytorch-1t"].append(pytorch_loop(make, x.reshape((-1,) + shape), y,
                                                    args.epochs, 1))
            walls["pytorch-nt"].append(pytorch_loop(make, x.reshape((-1,) + shape), y,
                                                    args.epochs, threads))
            for runner, run in runners.items():
                wall, job = run(args.epochs)
                walls[runner].append(wall)
                own[runner].append(job.wall_seconds)
                made, data = module_bytes(runner, make(), shape)
                client_side[runner].append(made)
                wall1, job1 = submit_and_wait(client, dataset, data, 1)
                after[runner].append(wall1 - job1.wall_seconds)
                time.sleep(1.0)  # the daemon's checker and worker started for the next one
                wall1, job1 = submit_and_wait(client, dataset, data, 1)
                fixed[runner].append(wall1 - job1.wall_seconds)
        for runner, times in walls.items():
            figures[runner] = {"median_seconds": statistics.median(times), "runs": times}
            if runner in own:
                figures[runner]["job_wall_seconds"] = statistics.median(own[runner])
                figures[runner]["fixed_seconds"] = statistics.median(fixed[runner])
                figures[runner]["client_seconds"] = statistics.median(client_side[runner])
                figures[runner]["fixed_after_job_seconds"] = statistics.median(after[runner])
        peer = figures["pytorch-1t"]["median_seconds"]
        for runner in runners:
            figures[runner]["speedup_vs_pytorch_1t"] = peer / figures[runner]["median_seconds"]
            figures[runner]["speedup_vs_pytorch_nt"] = (
                figures["pytorch-nt"]["median_seconds"] / figures[runner]["median_seconds"])
        results["models"][name] = {"figures": figures, "errors": errors,
                                   "intra_op_threads": threads}
        client.delete_dataset(dataset)


def report(results: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"user models: digits, {args.epochs} epochs, batch {BATCH}, adam, "
          f"median of {args.repeats}")
    print(f"{'model':<12} {'runner':<12} {'seconds':>8} {'job s':>7} {'fixed s':>8} "
          f"{'at once':>8} {'client s':>9} {'x 1t':>6} {'x nt':>6}")
    for name, entry in results["models"].items():
        for runner, f in entry["figures"].items():
            print(f"{name:<12} {runner:<12} {f['median_seconds']:8.3f} "
                  f"{f.get('job_wall_seconds', float('nan')):7.3f} "
                  f"{f.get('fixed_seconds', float('nan')):8.3f} "
                  f"{f.get('fixed_after_job_seconds', float('nan')):8.3f} "
                  f"{f.get('client_seconds', float('nan')):9.3f} "
                  f"{f.get('speedup_vs_pytorch_1t', float('nan')):6.2f} "
                  f"{f.get('speedup_vs_pytorch_nt', float('nan')):6.2f}")
        for runner, error in entry["errors"].items():
            print(f"{name:<12} {runner:<12} refused: {error}")
    with open(os.path.join(args.results_dir, "user_models.json"), "w") as out:
        json.dump(results, out, indent=2)


if __name__ == "__main__":
    sys.exit(main())
