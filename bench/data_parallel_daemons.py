#!/usr/bin/env python3
"""A data-parallel job through the daemons (bench/README.md): the same MLP job as one rank with
the global batch, as 2 ranks in one daemon (threads, Gloo on loopback), and as 2 ranks on two
daemons on loopback (rank 1 through PeerService.RunRank), for each per-rank batch of --batches
(a step's all-reduce costs the same whatever the batch, its compute grows with it: the table shows
where 2 ranks start to pay). Each daemon gets one core's worth of work per rank
(--intra_op_threads=1). Reports the median of --repeats runs: the job's wall seconds (set-up and
the ranks' meeting included), seconds per epoch after the first, rank 0's share of compute in
collectives, the speed-up per epoch over one rank, and whether the three agree (final loss within
1e-4 relative). Writes data_parallel_daemons.json into --results-dir.

Run by bench/run.sh with the Python client's environment (python/venv.sh).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np

import trainerd
from daemons import free_port, start

MODEL = "linear:1024,relu,linear:1024,relu,linear:1"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--build-dir", default="build/release")
    parser.add_argument("--results-dir", default="build/bench")
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--batches", default="256,512,1024,2048",
                        help="per-rank batches, comma-separated")
    parser.add_argument("--epochs", type=int, default=3, help="at least 2")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.rows, 64)).astype(np.float32)
    y = (np.sin(x[:, :8].sum(axis=1)) + x[:, 8] * x[:, 9]).astype(np.float32).reshape(-1, 1)
    addresses = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    batches = [int(b) for b in args.batches.split(",")]
    results: dict[int, dict[str, dict[str, float]]] = {b: {} for b in batches}
    with tempfile.TemporaryDirectory() as work:
        procs = [start(args.build_dir, work, addresses[i], addresses[1 - i], f"node-{i}",
                       "--intra_op_threads=1")
                 for i in range(2)]
        try:
            clients = [trainerd.Client(a) for a in addresses]
            for c in clients:
                c.upload("mlp", x, y)
            common = dict(model=MODEL, optimizer="adam", lr=1e-3, epochs=args.epochs, seed=7,
                          engine="libtorch")
            for batch in batches:
                cases = {
                    "1 rank, batch 2B": dict(batch_size=2 * batch),
                    "2 ranks, one daemon": dict(batch_size=batch, replicas=2),
                    "2 ranks, two daemons": dict(batch_size=batch, replicas=2,
                                                 nodes=[addresses[1]]),
                }
                for name, extra in cases.items():
                    runs = []
                    for _ in range(args.repeats + 1):  # the first is untimed (warm-up)
                        job = clients[0].submit("mlp", **common, **extra).wait()  # type: ignore[arg-type]
                        runs.append(job)
                    timed = runs[1:]
                    wall = statistics.median(j.wall_seconds for j in timed)
                    # Steady state: the epochs after the first (set-up, the ranks' meeting and
                    # the first epoch's allocations are in the first).
                    epoch = statistics.median(
                        (j.history[-1].elapsed_seconds - j.history[0].elapsed_seconds)
                        / (args.epochs - 1) for j in timed)
                    share = statistics.median(
                        (j.report.collective_fraction if j.report.HasField("collective_fraction")
                         else 0.0) for j in timed)
                    results[batch][name] = {"wall_seconds": wall, "epoch_seconds": epoch,
                                            "collective_fraction": share,
                                            "final_loss": timed[-1].final_loss}
        finally:
            for p in procs:
                p.terminate()
                p.wait(timeout=30)
    print(f"data-parallel through the daemons: {MODEL}, {args.rows} rows x 64, {args.epochs} "
          f"epochs, median of {args.repeats}; B: the per-rank batch")
    print(f"{'B':>5} {'case':24} {'wall s':>8} {'s/epoch':>9} {'speed-up':>9} "
          f"{'in collectives':>15} {'final loss':>12}")
    for batch in batches:
        base = results[batch]["1 rank, batch 2B"]
        for name, r in results[batch].items():
            r["speedup"] = base["epoch_seconds"] / r["epoch_seconds"]
            # Float32 rounding in another order, carried through Adam's steps: within 1e-4.
            r["agrees"] = abs(r["final_loss"] - base["final_loss"]) <= 1e-4 * abs(base["final_loss"])
            print(f"{batch:5} {name:24} {r['wall_seconds']:8.2f} {r['epoch_seconds']:9.3f} "
                  f"{r['speedup']:8.2f}x {r['collective_fraction']:14.0%} {r['final_loss']:12.6g}"
                  f"{'' if r['agrees'] else '  (differs)'}")
    os.makedirs(args.results_dir, exist_ok=True)
    with open(os.path.join(args.results_dir, "data_parallel_daemons.json"), "w") as f:
        json.dump({"model": MODEL, "rows": args.rows, "epochs": args.epochs,
                   "results": {str(b): r for b, r in results.items()}, "time": time.time()},
                  f, indent=2)


if __name__ == "__main__":
    main()
