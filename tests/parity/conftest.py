"""The parity suite's fixtures: one real trainerd (the Python client tests' Daemon, on the CPU)
for the whole session, and ``parity``, which trains a job there and the same job as a plain
PyTorch loop (reference_loop.py) and compares what they report."""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import trainerd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import datasets  # noqa: E402
import reference_loop  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "trainerd_pyclient_conftest", HERE.parent.parent / "python" / "tests" / "conftest.py"
)
assert _spec is not None and _spec.loader is not None
_pyclient = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_pyclient)

# float32 noise: per-epoch losses and trained parameters agree within this, relative.
RTOL = 1e-5

# (what, worst relative loss difference, worst parameter difference over its tensor's largest
# value) of every comparison, printed at the end with TRAINERD_PARITY_REPORT=1.
DEVIATIONS: list[tuple[str, float, float]] = []


def close(got: float, want: float, rtol: float) -> bool:
    return math.isclose(got, want, rel_tol=rtol, abs_tol=rtol * 1e-3)


class Parity:
    def __init__(self, client: trainerd.Client) -> None:
        self.client = client
        self.uploaded: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def data(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        if name not in self.uploaded:
            x, y = datasets.ALL[name]()
            self.client.upload(name, x, y)
            self.uploaded[name] = (x, y)
        return self.uploaded[name]

    def run(self, dataset: str, engine: str, spec: dict[str, Any]) -> trainerd.Job:
        """The job as trainerd trains it, ended (SUCCEEDED, else the test fails with its error)."""
        self.data(dataset)
        job = self.client.submit(dataset, engine=engine, **spec)
        job.wait(timeout=300)
        assert job.state == trainerd.JobState.SUCCEEDED, job.error
        return job

    def compare(self, job: trainerd.Job, want: reference_loop.Result, rtol: float, what: str) -> None:
        history = job.history
        got_losses = [e.loss for e in history]
        assert len(got_losses) == len(want.losses), f"{what}: epochs {got_losses} vs {want.losses}"
        for epoch, (g, w) in enumerate(zip(got_losses, want.losses), start=1):
            assert close(g, w, rtol), f"{what}: epoch {epoch} loss {g!r}, PyTorch {w!r}"
        got_rates = [e.learning_rate for e in history]
        for epoch, (g, w) in enumerate(zip(got_rates, want.learning_rates), start=1):
            assert close(g, w, 1e-9), f"{what}: epoch {epoch} learning rate {g!r}, PyTorch {w!r}"
        if want.validation_losses:
            got = [e.validation_loss for e in history]
            for epoch, (g, w) in enumerate(zip(got, want.validation_losses), start=1):
                assert g is not None and close(g, w, rtol), (
                    f"{what}: epoch {epoch} validation loss {g!r}, PyTorch {w!r}"
                )
        if want.validation_accuracies:
            got_acc = [e.validation_accuracy for e in history]
            assert got_acc == pytest.approx(want.validation_accuracies, abs=1e-12), what
        assert job.stopped_early == want.stopped_early, what
        assert (job.best_epoch, job.model_epoch) == (want.best_epoch, want.model_epoch), what
        params = job.parameters
        assert sorted(params) == sorted(want.parameters), what
        worst_parameter = 0.0
        for name, w in want.parameters.items():
            g = params[name]
            assert g.shape == w.shape, f"{what}: {name} shape {g.shape} vs {w.shape}"
            scale = max(float(np.abs(w).max()), 1e-3)
            worst = float(np.abs(g - w).max())
            assert worst <= rtol * scale, (
                f"{what}: {name} differs by {worst:.3g} (largest value {scale:.3g}, "
                f"allowed {rtol * scale:.3g})"
            )
            worst_parameter = max(worst_parameter, worst / scale)
        worst_loss = max(abs(g - w) / abs(w) for g, w in zip(got_losses, want.losses))
        DEVIATIONS.append((what, worst_loss, worst_parameter))

    def check(
        self,
        dataset: str,
        *,
        engines: tuple[str, ...] = ("libtorch",),
        rtol: float = RTOL,
        validation_dataset: str | None = None,
        **spec: Any,
    ) -> list[trainerd.Job]:
        """Trains `spec` on `dataset` with each of `engines` and as the PyTorch loop; every
        epoch's loss (and validation loss and accuracy), the early stop and the trained
        parameters must agree within `rtol`. Returns the jobs."""
        spec.setdefault("seed", 7)
        x, y = self.data(dataset)
        validation = None
        if validation_dataset is not None:
            validation = self.data(validation_dataset)
            spec["validation_dataset"] = validation_dataset
        want = reference_loop.train(spec, x, y, validation)
        jobs = []
        for engine in engines:
            job = self.run(dataset, engine, spec)
            self.compare(job, want, rtol, f"{engine} engine")
            jobs.append(job)
        return jobs


@pytest.fixture(scope="session")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    process = _pyclient.Daemon(tmp_path_factory.mktemp("trainerd-parity"), [])
    yield process
    assert process.stop() == 0, process.stderr_path.read_text()[-2000:]


@pytest.fixture(scope="session")
def parity(daemon: Any) -> Iterator[Parity]:
    with trainerd.Client(daemon.address) as client:
        yield Parity(client)


@pytest.fixture(autouse=True)
def _name_comparisons(request: pytest.FixtureRequest) -> Iterator[None]:
    start = len(DEVIATIONS)
    yield
    for i in range(start, len(DEVIATIONS)):
        what, loss, parameter = DEVIATIONS[i]
        DEVIATIONS[i] = (f"{request.node.name} ({what})", loss, parameter)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not os.environ.get("TRAINERD_PARITY_REPORT"):
        return
    terminalreporter.section("largest differences from the PyTorch loop")
    for what, loss, parameter in DEVIATIONS:
        terminalreporter.write_line(f"{loss:9.2e} loss  {parameter:9.2e} parameters  {what}")
