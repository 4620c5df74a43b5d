#!/usr/bin/env python3
"""Writes the real TorchScript pickles that tests/engine/pickle_check_test.cc must accept.

Each module below is saved with torch.jit.save; the archive's data.pkl and constants.pkl are
written here as <name>.data.pkl and <name>.constants.pkl, and the byte size of each storage
record (data/<key>, constants/<key>) goes into records.txt as "<name> <record> <bytes>", which
is all the checker needs of the rest of the archive. The tensors' values are not kept, so the
fixtures stay a few KB.

Run with a Python that has torch (make deps installs one):
  ~/.cache/trainerd/torch-2.11.0/bin/python tests/engine/testdata/make_pickle_fixtures.py
"""

import io
import os
import sys
import zipfile
from typing import Dict, List, Tuple

import torch


class WithBuffer(torch.nn.Module):
    """A float64 buffer beside a Linear layer."""

    def __init__(self):
        super().__init__()
        self.register_buffer("running", torch.arange(6, dtype=torch.float64).reshape(2, 3))
        self.lin = torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.lin(x) + self.running.sum()


class Views(torch.nn.Module):
    """Buffers that share one storage (a column view, a tail at an offset), an empty, a scalar,
    a conjugated tensor (whose rebuild carries the math-bits dict), other dtypes, and attributes
    of every other kind the pickler writes (lists, dicts, tuples, complex, device)."""

    def __init__(self):
        super().__init__()
        base = torch.arange(12, dtype=torch.float32)
        self.register_buffer("full", base.reshape(3, 4))
        self.register_buffer("col", base.reshape(3, 4)[:, 1])
        self.register_buffer("tail", base[5:])
        self.register_buffer("empty", torch.empty(0, 3))
        self.register_buffer("halves", torch.ones(2, dtype=torch.float16))
        self.register_buffer("flags", torch.ones(2, dtype=torch.bool))
        self.register_buffer("scalar", torch.tensor(3.0))
        self.register_buffer("conj", torch.tensor([1 + 2j]).conj())
        self.ints: List[int] = [1, 2, 300, 70000, -5, 2**40]
        self.floats: List[float] = [1.5, 2.5]
        self.bools: List[bool] = [True, False]
        self.tensors: List[torch.Tensor] = [torch.zeros(1), torch.ones(1)]
        self.named: Dict[str, torch.Tensor] = {"a": torch.zeros(2)}
        self.mixed: Tuple[int, str, float, int, int] = (1, "x", 2.0, 3, 4)
        self.names: List[str] = ["a", "b"]
        self.number = 1 + 2j
        self.place = torch.device("cpu")

    def forward(self, x):
        return x + self.full.sum() + self.col.sum() + self.tail.sum()


_TABLE = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
_STRIDED = torch.arange(10, dtype=torch.int64)[2:8:2]


def _with_constants(x):
    # Tracing turns the captured tensors into constants: constants.pkl holds them, one a strided
    # view at an offset.
    return x + _TABLE + _STRIDED.sum()


def _modules():
    torch.manual_seed(0)
    sequential = torch.nn.Sequential(
        torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    return [
        ("sequential", torch.jit.script(sequential)),
        ("buffer", torch.jit.script(WithBuffer())),
        ("constants", torch.jit.trace(_with_constants, torch.ones(2, 2))),
        ("views", torch.jit.script(Views())),
    ]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    lines = ["# <fixture> <record> <bytes>: storage records of the archives the fixtures come "
             "from (written by make_pickle_fixtures.py)"]
    for name, module in _modules():
        buffer = io.BytesIO()
        torch.jit.save(module, buffer)
        archive = zipfile.ZipFile(io.BytesIO(buffer.getvalue()))
        for info in archive.infolist():
            # Records are <archive name>/<path>; the archive name is the module's.
            path = info.filename.split("/", 1)[1]
            if path in ("data.pkl", "constants.pkl"):
                with open(os.path.join(out, f"{name}.{path}"), "wb") as f:
                    f.write(archive.read(info.filename))
            elif path.startswith("data/") or path.startswith("constants/"):
                lines.append(f"{name} {path} {info.file_size}")
    with open(os.path.join(out, "records.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
