"""Exported programs (torch.export.save) and eager PyTorch's results on them, for the interpreter's
tests (exported_program_test.cc). Run at build time with the torch trainerd builds against:

    python make_exported_fixtures.py OUT_DIR

For each model NAME: NAME.pt2 (exported in training mode, batch dimension dynamic) and NAME.json:
the input and, from the eager module, the output in training and in evaluation mode and every
parameter's gradient of the training output's sum, each as a flat list of float32 values with its
shape. Models whose training output is random (dropout) have p=0 copies for the training output.
"""

import json
import os
import sys

import torch
from torch import nn
from torch.export import Dim


class Mlp(nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        self.l1 = nn.Linear(8, 16)
        self.bn = nn.BatchNorm1d(16)
        self.drop = nn.Dropout(p)
        self.l2 = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(self.drop(torch.relu(self.bn(self.l1(x)))))


class Cnn(nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(1, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 16, 3, padding=1)
        self.drop = nn.Dropout(p)
        self.fc = nn.Linear(16 * 2 * 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.c1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.c2(x)), 2)
        return self.fc(self.drop(torch.flatten(x, 1)))


class Lstm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(4, 16, batch_first=True)
        self.fc = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.fc(out[:, -1])


class Transformer(nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        self.enc = nn.TransformerEncoderLayer(32, 4, 64, dropout=p, batch_first=True)
        self.fc = nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.enc(x).mean(dim=1))


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.l2 = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(torch.relu(self.norm(x + self.l1(x))))


def flat(t: torch.Tensor) -> dict:
    return {"shape": list(t.shape), "values": t.detach().double().flatten().tolist()}


def main() -> None:
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    models = {
        "mlp": (lambda p: Mlp(p), (8,)),
        "cnn": (lambda p: Cnn(p), (1, 8, 8)),
        "lstm": (lambda p: Lstm(), (6, 4)),
        "transformer": (lambda p: Transformer(p), (5, 32)),
        "residual": (lambda p: Residual(), (8,)),
    }
    for name, (make, shape) in models.items():
        for suffix, p in (("", 0.25), ("_p0", 0.0)):
            torch.manual_seed(1)
            model = make(p)
            model.train()
            example = torch.randn(4, *shape)
            program = torch.export.export(
                model, (example,), dynamic_shapes=({0: Dim("batch", min=1, max=65536)},))
            torch.export.save(program, os.path.join(out_dir, f"{name}{suffix}.pt2"))
            x = torch.randn(6, *shape)
            record = {"input": flat(x)}
            if p == 0.0 or name in ("lstm", "residual"):
                model.zero_grad()
                out = model(x)
                out.sum().backward()
                record["train"] = flat(out)
                record["grads"] = {n: flat(q.grad) for n, q in model.named_parameters()}
                record["buffers"] = {n: flat(b.float()) for n, b in model.named_buffers()}
            model.eval()
            with torch.no_grad():
                record["eval"] = flat(model(x))
            with open(os.path.join(out_dir, f"{name}{suffix}.json"), "w") as f:
                json.dump(record, f)


if __name__ == "__main__":
    main()
