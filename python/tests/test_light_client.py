"""The client without torch: a process where torch cannot be imported uploads, submits, watches,
waits and downloads against the real daemon, and never imports torch; with torch, a torch whose
major.minor version is not the daemon's LibTorch's gets one warning where TorchScript moves."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

import trainerd
from conftest import Daemon, class_data

# Runs in a fresh interpreter: an import hook refuses torch (as in an environment without it),
# then the client makes a user's whole round trip.
WITHOUT_TORCH = textwrap.dedent(
    """
    import importlib.abc
    import sys

    class NoTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoTorch())

    import numpy as np
    import trainerd

    address, dataset = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, size=120)
    x = (np.eye(3)[y] * 3 + 0.3 * rng.standard_normal((120, 3))).astype(np.float32)
    with trainerd.Client(address) as client:
        ds = client.upload(dataset, x, y, progress=False)
        assert (ds.rows, ds.target_dtype) == (120, "int64"), ds
        job = client.submit(ds, model="linear:8,relu,linear:3", optimizer="adam", lr=0.05,
                            epochs=4, validation_fraction=0.25, seed=3)
        seen = [epoch.epoch for epoch in job.watch(progress=False, plot=False)]
        assert seen == [1, 2, 3, 4], seen
        job.wait(timeout=60)
        assert job.state == trainerd.JobState.SUCCEEDED, job.error
        assert job.spec.loss == "cross_entropy"
        archive = job.model()  # without torch: the archive's bytes
        assert isinstance(archive, bytes) and archive[:2] == b"PK", archive[:8]
        assert archive == job.model_bytes()
        parameters = job.parameters
        assert parameters["0.weight"].shape == (8, 3), {k: v.shape for k, v in parameters.items()}
        try:
            import torch  # noqa: F401
        except ImportError:
            pass
        else:
            raise AssertionError("the hook let torch in")
    assert not any(m == "torch" or m.startswith("torch.") for m in sys.modules), [
        m for m in sys.modules if m.startswith("torch")]
    print("ok", job.id, job.final_loss)
    """
)


def test_round_trip_without_torch(daemon: Daemon, name: str, tmp_path: Path) -> None:
    # From a folder of its own: `python -c` puts the current folder first on sys.path, and the
    # installed package is the one under test.
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCH, daemon.address, name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("ok job-"), result.stdout


def test_import_does_not_import_torch(tmp_path: Path) -> None:
    code = (
        "import sys, trainerd, trainerd.aio; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_torch_of_another_minor_version_is_warned_once(
    daemon: Daemon, client: trainerd.Client, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch")
    x, y = class_data(60)
    ds = client.upload(name, x, y)
    libtorch = client.version().libtorch
    major, minor = (int(p) for p in libtorch.split(".")[:2])

    # The same major.minor (whatever the local build suffix): no warning.
    monkeypatch.setattr(torch, "__version__", f"{major}.{minor}.9+cpu")
    same = trainerd.Client(daemon.address)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        job = same.submit(ds, model=torch.nn.Linear(2, 3), epochs=1, seed=1).wait(timeout=60)
        job.model()

    other = f"{major}.{minor + 1}.0"
    monkeypatch.setattr(torch, "__version__", other)
    fresh = trainerd.Client(daemon.address)
    with pytest.warns(UserWarning) as caught:
        job = fresh.submit(ds, model=torch.nn.Linear(2, 3), epochs=1, seed=1).wait(timeout=60)
    texts = [str(w.message) for w in caught if "LibTorch" in str(w.message)]
    assert len(texts) == 1, texts
    assert f"torch is {other}" in texts[0] and f"LibTorch is {libtorch}" in texts[0]
    assert f"torch {major}.{minor} beside the client" in texts[0]
    assert [w.filename for w in caught if "LibTorch" in str(w.message)] == [__file__]
    with warnings.catch_warnings():  # once per client
        warnings.simplefilter("error", UserWarning)
        fresh.submit(ds, model=torch.nn.Linear(2, 3), epochs=1, seed=2).wait(timeout=60)
        job.model()
    # A download is a move too; a spec-string job sends no TorchScript.
    loader = trainerd.Client(daemon.address)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        spec_job = loader.submit(ds, model="linear:3", epochs=1, seed=1).wait(timeout=60)
    with pytest.warns(UserWarning, match=f"LibTorch is {libtorch}"):
        spec_job.model()
