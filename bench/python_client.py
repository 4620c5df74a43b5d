#!/usr/bin/env python3
"""The Python client (`import trainerd`) against trainctl, on a daemon of its own (bench/README.md).

  upload   the same dataset (--upload-mib MiB: float32 rows of 63 features and one target) sent
           by client.upload from numpy arrays in memory, and by `trainctl dataset upload` from
           .npy files of the same arrays (the page cache holds them); also client.upload of the
           .npy paths (memory-mapped). MB/s of each, the median of --repeats rounds after an
           untimed one, interleaved (the order alternates by round), the dataset deleted after
           each upload. Target: the Python client within 20% of trainctl.
  seed     the seed job (bench/seed_data.py's 800 rows, linear:1, sgd lr 0.1, mse, batch 16, 100
           epochs, seed 42, engine auto, as bench.py runs it) by client.submit(...).wait() with a
           connected client, by a new Python process doing the same (interpreter start and import
           included), and by `trainctl submit ... --watch` as a process: the median wall seconds
           of --seed-repeats runs each, the job's own wall_seconds, and what each adds to it.

Run by bench/run.sh with the Python client's environment (python/venv.sh); prints a table and
writes python_client.json into --results-dir.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench import WORKLOADS, Daemon, submit_args  # noqa: E402 (bench/bench.py)
from seed_data import seed_data  # noqa: E402

import trainerd  # noqa: E402

FEATURES = 63  # per row, plus one float32 target: 256 bytes a row, as bench.py's upload
SEED_JOB = dict(model='linear:1', loss='mse', optimizer='sgd', lr=0.1, batch_size=16,
                epochs=100, seed=42, device='cpu', engine='auto')


def upload_data(mib: int) -> tuple[np.ndarray, np.ndarray]:
    rows = (mib << 20) // ((FEATURES + 1) * 4)
    rng = np.random.default_rng(0)
    x = np.empty((rows, FEATURES), dtype=np.float32)
    step = 1 << 18
    for begin in range(0, rows, step):
        x[begin:begin + step] = rng.standard_normal((min(step, rows - begin), FEATURES),
                                                    dtype=np.float32)
    return x, rng.standard_normal(rows, dtype=np.float32)


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def upload_bench(a: argparse.Namespace, daemon: Daemon, client: trainerd.Client,
                 work: str) -> dict[str, Any]:
    x, y = upload_data(a.upload_mib)
    payload = x.nbytes + y.nbytes
    x_path, y_path = os.path.join(work, 'x.npy'), os.path.join(work, 'y.npy')
    np.save(x_path, x)
    np.save(y_path, y)

    def python_numpy() -> None:
        client.upload('big', x, y, progress=False)

    def python_npy() -> None:
        client.upload('big', x_path, y_path, progress=False)

    def trainctl() -> None:
        subprocess.run([daemon.ctl, '--addr', daemon.addr, 'dataset', 'upload', 'big', x_path,
                        '--targets', y_path], check=True, stdout=subprocess.DEVNULL)

    runners = {'python-numpy': python_numpy, 'trainctl-npy': trainctl, 'python-npy': python_npy}
    seconds: dict[str, list[float]] = {name: [] for name in runners}
    try:
        # An untimed upload of each first: the daemon's first upload also faults in the memory
        # that later ones reuse, which would count against whichever runner went first.
        for fn in runners.values():
            fn()
            client.delete_dataset('big')
        for round_no in range(a.repeats):
            names = list(runners)
            if round_no % 2:
                names.reverse()
            for name in names:
                seconds[name].append(timed(runners[name]))
                client.delete_dataset('big')
    finally:
        os.remove(x_path)
        os.remove(y_path)
    result: dict[str, Any] = dict(payload_bytes=payload, rows=len(x), repeats=a.repeats)
    for name, values in seconds.items():
        median = statistics.median(values)
        result[name] = dict(seconds=median, mb_per_s=payload / median / 1e6, all_seconds=values)
    result['python_vs_trainctl'] = (result['python-numpy']['mb_per_s'] /
                                    result['trainctl-npy']['mb_per_s'])
    return result


def seed_bench(a: argparse.Namespace, daemon: Daemon, client: trainerd.Client) -> dict[str, Any]:
    x, y = seed_data()
    client.upload('seed', x, y, progress=False)

    def python_warm() -> tuple[float, str]:
        start = time.perf_counter()
        job = client.submit('seed', **SEED_JOB).wait(progress=False, plot=False)
        return time.perf_counter() - start, job.id

    script = ('import sys, trainerd\n'
              f'job = trainerd.Client(sys.argv[1]).submit("seed", **{SEED_JOB!r})'
              '.wait(progress=False, plot=False)\n'
              'print(job.id)\n')

    def python_process() -> tuple[float, str]:
        start = time.perf_counter()
        out = subprocess.run([sys.executable, '-c', script, daemon.addr], check=True,
                             capture_output=True, text=True).stdout
        return time.perf_counter() - start, out.strip()

    def trainctl() -> tuple[float, str]:
        w = WORKLOADS['seed']
        assert (w['model'], w['lr'], w['batch']) == ('linear:1', '0.1', 16)  # SEED_JOB's
        start = time.perf_counter()
        out = subprocess.run([daemon.ctl, '--addr', daemon.addr, '-o', 'json',
                              *submit_args('seed', 'cpu', SEED_JOB['epochs']), '--watch'],
                             check=True, capture_output=True, text=True).stdout
        seconds = time.perf_counter() - start
        found = re.search(r'"(job-[0-9a-f]{12})"', out)
        if not found:
            raise RuntimeError(f'no job id in what trainctl printed: {out[:200]!r}')
        return seconds, found.group(1)

    runners = {'python-submit-wait': python_warm, 'python-process': python_process,
               'trainctl-submit-watch': trainctl}
    for fn in runners.values():  # a first run of each settles the daemon and the page cache
        fn()
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in runners}
    for round_no in range(a.seed_repeats):
        names = list(runners)
        if round_no % 2:
            names.reverse()
        for name in names:
            seconds, job_id = runners[name]()
            job = client.job(job_id)
            if job.state != trainerd.JobState.SUCCEEDED or job.epochs_completed != 100:
                raise RuntimeError(f'{name}: job {job_id} is {job.state}')
            runs[name].append((seconds, job.wall_seconds))
    result: dict[str, Any] = dict(repeats=a.seed_repeats, job=SEED_JOB)
    for name, values in runs.items():
        wall = statistics.median(s for s, _ in values)
        job_wall = statistics.median(j for _, j in values)
        result[name] = dict(seconds=wall, job_wall_seconds=job_wall,
                            added_seconds=statistics.median(s - j for s, j in values),
                            all_seconds=[s for s, _ in values])
    result['python_minus_trainctl_seconds'] = (result['python-submit-wait']['seconds'] -
                                               result['trainctl-submit-watch']['seconds'])
    result['python_process_minus_trainctl_seconds'] = (result['python-process']['seconds'] -
                                                       result['trainctl-submit-watch']['seconds'])
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument('--build-dir', default=os.path.join(os.path.dirname(HERE), 'build', 'release'))
    ap.add_argument('--results-dir', default=os.environ.get('RESULTS_DIR', ''))
    ap.add_argument('--upload-mib', type=int, default=512, help='size of the upload payload')
    ap.add_argument('--repeats', type=int, default=7, help='upload rounds (median)')
    ap.add_argument('--seed-repeats', type=int, default=9, help='seed job runs each (median)')
    ap.add_argument('--parts', default='upload,seed')
    a = ap.parse_args()
    results: dict[str, Any] = dict(date=time.strftime('%Y-%m-%d'), cpu_count=os.cpu_count(),
                                   trainerd_python=trainerd.__version__)
    with tempfile.TemporaryDirectory(prefix='trainerd-bench-py.') as work:
        daemon = Daemon(a.build_dir, 'cpu', os.path.join(work, 'daemon'))
        try:
            with trainerd.Client(daemon.addr) as client:
                if 'upload' in a.parts:
                    r = results['upload'] = upload_bench(a, daemon, client, work)
                    print(f"upload  {r['payload_bytes'] / 2**20:.0f} MiB, median of {a.repeats}:",
                          flush=True)
                    for name in ('python-numpy', 'python-npy', 'trainctl-npy'):
                        print(f"  {name:22} {r[name]['seconds']:7.3f} s {r[name]['mb_per_s']:7.0f} "
                              f"MB/s", flush=True)
                    ratio = r['python_vs_trainctl']
                    print(f"  client.upload(numpy) runs at {ratio:.2f}x trainctl's throughput "
                          f"(target: at least 0.80)", flush=True)
                if 'seed' in a.parts:
                    r = results['seed'] = seed_bench(a, daemon, client)
                    print(f"seed job, median of {a.seed_repeats}:", flush=True)
                    for name in ('python-submit-wait', 'python-process', 'trainctl-submit-watch'):
                        print(f"  {name:22} {r[name]['seconds']:7.3f} s (the job itself "
                              f"{r[name]['job_wall_seconds']:.3f} s, the client adds "
                              f"{r[name]['added_seconds'] * 1e3:.0f} ms)", flush=True)
                    print(f"  submit().wait() minus trainctl submit --watch: "
                          f"{r['python_minus_trainctl_seconds'] * 1e3:+.0f} ms; a new Python "
                          f"process doing it: {r['python_process_minus_trainctl_seconds'] * 1e3:+.0f} "
                          f"ms", flush=True)
        finally:
            daemon.stop()
    if a.results_dir:
        os.makedirs(a.results_dir, exist_ok=True)
        with open(os.path.join(a.results_dir, 'python_client.json'), 'w') as f:
            json.dump(results, f, indent=1)


if __name__ == '__main__':
    main()
