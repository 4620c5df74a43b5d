#!/usr/bin/env python3
"""A sweep spread over a peer against the same sweep on one daemon (bench/README.md): two
daemons on loopback (each the other's --peers), the same sweep submitted to the first alone and
with nodes=[the second] (members dealt round the two; the second's share goes there as one sweep,
packed there). Two sweeps: many small members, whose steps are cheap, and fewer members with
large steps. Reports the median of --repeats runs (after an untimed one) of the wall time from
submit to every member ended, and checks that every member succeeded. Writes spread_sweep.json
into --results-dir.

Run by bench/run.sh with the Python client's environment (python/venv.sh).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any

import numpy as np

import trainerd
from daemons import free_port, start

SWEEPS: dict[str, dict[str, Any]] = {
    "16 small members": dict(model="linear:32,tanh,linear:1", lr=[0.01, 0.02, 0.03, 0.05],
                             seed=[1, 2, 3, 4], epochs=20, batch_size=32),
    "8 members of 2x256": dict(model="linear:256,relu,linear:256,relu,linear:1",
                               lr=[0.001, 0.003], seed=[1, 2, 3, 4], epochs=10, batch_size=64),
}


def timed_sweep(client: trainerd.Client, spread: list[str], sweep: dict[str, Any]) -> float:
    begin = time.perf_counter()
    if spread:
        submitted = client.sweep("waves", optimizer="adam", nodes=spread, **sweep)
    else:
        submitted = client.sweep("waves", optimizer="adam", **sweep)
    submitted.wait(timeout=600)
    seconds = time.perf_counter() - begin
    failed = [j for j in submitted.jobs if j.state != trainerd.JobState.SUCCEEDED]
    if failed:
        raise RuntimeError(f"{len(failed)} members did not succeed: {failed[0].error}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--build-dir", default="build/release")
    parser.add_argument("--results-dir", default="build/bench")
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, (args.rows, 4)).astype(np.float32)
    y = (np.sin(x[:, 0] * x[:, 1]) + np.cos(x[:, 2]) - 0.5 * x[:, 3]).astype(np.float32)
    addresses = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as work:
        procs = [start(args.build_dir, work, addresses[i], addresses[1 - i], f"node-{i}")
                 for i in range(2)]
        try:
            clients = [trainerd.Client(a) for a in addresses]
            for c in clients:
                c.upload("waves", x, y.reshape(-1, 1))
            for name, sweep in SWEEPS.items():
                row: dict[str, float] = {}
                for case, spread in (("one daemon", []), ("spread over two", [addresses[1]])):
                    runs = [timed_sweep(clients[0], spread, sweep)
                            for _ in range(args.repeats + 1)][1:]
                    row[case] = statistics.median(runs)
                results[name] = row
        finally:
            for p in procs:
                p.terminate()
                p.wait(timeout=30)
    print(f"a sweep spread over a peer: {args.rows} rows x 4, adam, median of {args.repeats}")
    print(f"{'sweep':22} {'one daemon':>11} {'spread':>9} {'':>14}")
    for name, row in results.items():
        one, spread = row["one daemon"], row["spread over two"]
        ratio = f"{one / spread:.2f}x faster" if spread < one else f"{spread / one:.2f}x slower"
        print(f"{name:22} {one:10.2f}s {spread:8.2f}s {ratio:>14}")
    os.makedirs(args.results_dir, exist_ok=True)
    with open(os.path.join(args.results_dir, "spread_sweep.json"), "w") as f:
        json.dump({"rows": args.rows, "results": results, "time": time.time()}, f, indent=2)


if __name__ == "__main__":
    main()
