#!/usr/bin/env python3
"""Peer for the small-MLP workload (mlp3): the plain PyTorch loop a user would write for it.

3,000 rows of a 3-class spiral in 2-D (bench/seed_data.py), nn.Sequential(Linear(2, 64), ReLU,
Linear(64, 64), ReLU, Linear(64, 3)), SGD lr 0.05, cross-entropy, batch 32, shuffled every epoch.
Styles as in ../shared/bench/seed_scenario.py:
  original   DataLoader over host tensors, each batch copied with .to(device), loss.item() per step
  optimized  data on the device once, a device-side permutation and gathers, losses kept on the
             device and read once per epoch
Prints one JSON line like seed_scenario.py: seconds (the epochs only), us_per_step, samples_per_s,
final_loss. Run it with the Python of the torch trainerd is built against.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from seed_data import mlp3_data  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--style', choices=['original', 'optimized'], default='optimized')
    ap.add_argument('--device', default='cpu')
    ap.add_argument('--epochs', type=int, default=20)
    ap.add_argument('--threads', type=int, default=0, help='torch.set_num_threads (0 = default)')
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(42)
    x, y = mlp3_data()
    dev = torch.device(a.device)
    model = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 3)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()
    bs = 32
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)
    xd, yd = xt.to(dev), yt.to(dev)

    def step(xb, yb):
        loss = loss_fn(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    steps = 0
    t0 = time.perf_counter()
    for _ in range(a.epochs):
        if a.style == 'original':
            losses = [step(xb.to(dev), yb.to(dev)).item()
                      for xb, yb in DataLoader(TensorDataset(xt, yt), batch_size=bs, shuffle=True)]
            epoch_loss = sum(losses) / len(losses)
        else:
            perm = torch.randperm(len(xd), device=dev)
            losses = [step(xd[perm[i:i + bs]], yd[perm[i:i + bs]]).detach()
                      for i in range(0, len(xd), bs)]
            epoch_loss = torch.stack(losses).mean().item()
        steps += len(losses)
    secs = time.perf_counter() - t0
    print(json.dumps(dict(workload='mlp3', style=a.style, device=a.device, epochs=a.epochs,
                          seconds=round(secs, 4), us_per_step=round(secs / steps * 1e6, 2),
                          samples_per_s=round(len(x) * a.epochs / secs, 1),
                          final_loss=round(epoch_loss, 6), threads=torch.get_num_threads())))


if __name__ == '__main__':
    main()
