#!/usr/bin/env python3
"""Writes the seed question's training data as CSV (header x,y): y = 1 + 2x + 0.1*noise.

Exactly the 800 training rows of ../shared/bench/seed_scenario.py's seed_data() (numpy's
RandomState(42), the same shuffle and split), so trainerd and the PyTorch loops train on the same
rows. With --workload mlp, the 20,000 x 64 ten-class data of the same script (label last); with
--workload mlp3, the small-MLP workload's 3,000-row 3-class spiral in 2-D (bench/peer_mlp3.py).
"""
import argparse
import sys

import numpy as np


def seed_data():
    rng = np.random.RandomState(42)
    n = 1000
    x = rng.rand(n, 1)
    y = 1 + 2 * x + .1 * rng.randn(n, 1)
    idx = np.arange(n)
    rng.shuffle(idx)
    tr = idx[:800]
    return x[tr].astype(np.float32), y[tr].astype(np.float32)


def mlp_data():
    rng = np.random.RandomState(7)
    n, d, k = 20000, 64, 10
    centers = rng.randn(k, d) * 2
    labels = rng.randint(0, k, n)
    x = centers[labels] + rng.randn(n, d)
    return x.astype(np.float32), labels.astype(np.int64)


def mlp3_data():
    """The small-MLP workload: 3,000 rows of a 3-arm spiral in 2-D, int64 classes 0..2."""
    rng = np.random.RandomState(3)
    per = 1000
    xs, ys = [], []
    for c in range(3):
        r = np.linspace(0.0, 1.0, per)
        t = np.linspace(c * 4.0, (c + 1) * 4.0, per) + rng.randn(per) * 0.2
        xs.append(np.c_[r * np.sin(t), r * np.cos(t)])
        ys.append(np.full(per, c))
    return np.concatenate(xs).astype(np.float32), np.concatenate(ys).astype(np.int64)


DATA = {'seed': seed_data, 'mlp': mlp_data, 'mlp3': mlp3_data}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--workload', choices=sorted(DATA), default='seed')
    ap.add_argument('out', nargs='?', default='-')
    a = ap.parse_args()
    x, y = DATA[a.workload]()
    out = sys.stdout if a.out == '-' else open(a.out, 'w')
    d = x.shape[1]
    out.write(','.join([f'x{i}' for i in range(d)] + ['y']) + '\n')
    fmt = '%.9g'
    ys = y.reshape(len(y), -1)
    for row, t in zip(x, ys):
        out.write(','.join(fmt % v for v in row) + ',' + ','.join(
            (str(int(v)) if y.dtype == np.int64 else fmt % v) for v in t) + '\n')
    if out is not sys.stdout:
        out.close()


if __name__ == '__main__':
    main()
