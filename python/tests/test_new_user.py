"""What a new user hit with scikit-learn's data, from Python against the real daemon: the loss
follows the targets, the held-out rows can be recovered and give the daemon's validation figures,
int32 labels are class indices, and a sweep's best member is the best on held-out rows."""

from __future__ import annotations

import asyncio
import warnings

import numpy as np
import pytest

import trainerd
import trainerd.aio
from conftest import Daemon, class_data, seed_data
from trainerd._split import held_out_count
from trainerd.v1 import jobs_pb2

torch = pytest.importorskip("torch")


def test_without_a_loss_the_targets_choose_it(client: trainerd.Client, name: str) -> None:
    x, y = class_data(150)
    ds = client.upload(name, x.astype(np.float64), y.astype(np.int32))
    assert ds.target_dtype == "int64"  # int32 labels are class indices
    job = client.submit(ds, model="linear:3", lr=0.1, epochs=3, seed=2)
    job.wait(timeout=60)
    assert job.spec.loss == "cross_entropy"  # the name submit takes, not the enum's number
    assert job.spec.proto.loss == jobs_pb2.LOSS_CROSS_ENTROPY

    xs, ys = seed_data(64)
    values = client.upload(name + "-values", xs, ys)
    regression = client.submit(values, model="linear:1", epochs=2, seed=2)
    regression.wait(timeout=60)
    assert regression.spec.loss == "mse"


def test_spec_reads_every_choice_as_submits_name(client: trainerd.Client, name: str) -> None:
    x, y = class_data(90)
    ds = client.upload(name, x, y)
    job = client.submit(
        ds, model="linear:3", loss="nll", optimizer="adamw", lr=0.01, schedule="cosine_restarts",
        t_0=2, precision="bf16", priority="high", engine="libtorch", epochs=2,
        validation_fraction=0.2, early_stop_patience=3, early_stop_metric="accuracy", seed=4,
        device="cpu",
    )
    job.wait(timeout=60, check=False)
    for read in (job, client.job(job.id), client.jobs(dataset=name)[0]):
        spec = read.spec
        assert (spec.loss, spec.optimizer.kind, spec.schedule.kind) == (
            "nll", "adamw", "cosine_restarts")
        assert (spec.precision, spec.priority, spec.engine, spec.early_stop_metric) == (
            "bf16", "high", "libtorch", "accuracy")
        # The other fields read as the message's.
        assert spec.optimizer.learning_rate == pytest.approx(0.01)
        assert spec.schedule.t_0 == 2 and spec.epochs == 2 and spec.seed == 4
        assert spec.HasField("seed") and not spec.optimizer.HasField("momentum_decay")
        assert spec.proto.optimizer.kind == jobs_pb2.OPTIMIZER_KIND_ADAMW
        assert spec.proto.schedule.kind == jobs_pb2.Schedule.COSINE_WARM_RESTARTS
        assert "loss='nll'" in repr(spec) and "kind='adamw'" in repr(spec)
        assert "t_0=2" in repr(spec) and "dataset=" in repr(spec)
    with pytest.raises(AttributeError, match="read-only"):
        job.spec.loss = "mse"  # type: ignore[misc]
    # Left to the daemon's defaults: the names of the defaults.
    plain = client.submit(ds, model="linear:3", epochs=1, seed=1).wait(timeout=60)
    assert (plain.spec.loss, plain.spec.optimizer.kind, plain.spec.schedule.kind) == (
        "cross_entropy", "sgd", "constant")
    assert (plain.spec.precision, plain.spec.priority, plain.spec.engine) == (
        "fp32", "normal", "auto")
    assert plain.spec.early_stop_metric == "loss"


def test_held_out_rows_give_the_daemons_validation_figures(
    client: trainerd.Client, name: str
) -> None:
    x, y = class_data(300, seed=11)
    ds = client.upload(name, x, y)
    job = client.submit(
        ds,
        model="linear:16,relu,linear:3",
        optimizer="adam",
        lr=0.01,
        epochs=4,
        validation_fraction=0.25,
        seed=987654321987,
    )
    job.wait(timeout=60)
    rows = job.validation_rows()
    assert rows.dtype == np.int64
    assert len(rows) == 75 and len(set(rows.tolist())) == 75
    assert np.array_equal(rows, job.validation_rows(rows=300))
    last = job.history[-1]
    assert last.validation_loss is not None and last.validation_accuracy is not None

    model = job.model()
    with torch.no_grad():
        logits = model(torch.from_numpy(x[rows]))
    targets = torch.from_numpy(y[rows])
    loss = torch.nn.functional.cross_entropy(logits, targets).item()
    accuracy = (logits.argmax(dim=1) == targets).double().mean().item()
    assert loss == pytest.approx(last.validation_loss, rel=1e-5, abs=1e-6)
    assert accuracy == last.validation_accuracy
    # The other rows (which trained) give another loss.
    trained = np.setdiff1d(np.arange(300), rows)
    with torch.no_grad():
        other = torch.nn.functional.cross_entropy(
            model(torch.from_numpy(x[trained])), torch.from_numpy(y[trained])
        ).item()
    assert other != pytest.approx(last.validation_loss, rel=1e-4)

    plain = client.submit(ds, model="linear:3", epochs=1, seed=1)
    plain.wait(timeout=60)
    with pytest.raises(ValueError, match="holds no rows out"):
        plain.validation_rows()


def test_held_out_count_rounds_as_the_daemon_does() -> None:
    assert held_out_count(100, 0.29) == 29  # 0.29 * 100 is 28.999... in doubles
    assert held_out_count(10, 0.25) == 3  # 2.5 rounds away from zero, as llround
    assert held_out_count(10, 0.0) == 0
    assert held_out_count(7, 0.5) == 4


def test_aio_validation_rows_match_the_sync_client(
    daemon: Daemon, client: trainerd.Client, name: str
) -> None:
    x, y = class_data(120, seed=5)
    ds = client.upload(name, x, y)
    job = client.submit(ds, model="linear:3", epochs=2, validation_fraction=0.3, seed=77)
    job.wait(timeout=60)

    async def main() -> np.ndarray:
        async with trainerd.aio.Client(daemon.address) as aclient:
            ajob = await aclient.job(job.id)
            return await ajob.validation_rows()

    assert np.array_equal(asyncio.run(main()), job.validation_rows())


def test_sweep_best_is_the_best_on_held_out_rows(client: trainerd.Client, name: str) -> None:
    x, y = class_data(240, seed=21)
    ds = client.upload(name, x, y)
    sweep = client.sweep(
        ds,
        model="linear:8,relu,linear:3",
        optimizer="adam",
        lr=[0.05, 0.01, 0.001],
        epochs=6,
        validation_fraction=0.25,
        seed=[3],
    )
    sweep.wait(timeout=120)
    best = sweep.best()
    finals = {job.id: job.history[-1].validation_loss for job in sweep.jobs}
    assert finals[best.id] == min(v for v in finals.values() if v is not None)


def test_a_sweeps_members_with_other_seeds_hold_out_the_same_rows(
    client: trainerd.Client, name: str
) -> None:
    x, y = class_data(120, seed=5)
    ds = client.upload(name, x, y)
    sweep = client.sweep(
        ds, model="linear:3", lr=0.05, epochs=2, validation_fraction=0.25, seed=[1, 2, 3]
    ).wait(timeout=120)
    assert sorted(job.seed for job in sweep.jobs) == [1, 2, 3]
    split = {job.split_seed for job in sweep.jobs}
    assert len(split) == 1  # the sweep's seed, whatever each member's own
    rows = [job.validation_rows(120) for job in sweep.jobs]
    assert all(np.array_equal(r, rows[0]) for r in rows) and len(rows[0]) == 30
    # A job alone names the split it wants, and the daemon holds out exactly those rows.
    job = client.submit(
        ds, model="linear:3", lr=0.05, epochs=1, validation_fraction=0.25, seed=2,
        validation_split_seed=sweep.jobs[0].split_seed,
    ).wait(timeout=60)
    assert job.split_seed == sweep.jobs[0].split_seed
    assert np.array_equal(job.validation_rows(120), rows[0])
    own = client.submit(
        ds, model="linear:3", lr=0.05, epochs=1, validation_fraction=0.25, seed=2
    ).wait(timeout=60)
    assert own.split_seed == 2 and not np.array_equal(own.validation_rows(120), rows[0])


class _ShapeMismatch(torch.nn.Module):
    """Fits the daemon's check (eval mode, 2 rows) and fails while training: a shape error in the
    TorchScript interpreter, in the worker."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(2, 4)
        self.extra = torch.nn.Parameter(torch.ones(5, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        if self.training:
            return torch.mm(h, self.extra)
        return h[:, :3]


def test_a_torchscript_shape_error_names_the_shapes(client: trainerd.Client, name: str) -> None:
    x, y = class_data(40)
    ds = client.upload(name, x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.script's deprecation
        scripted = torch.jit.script(_ShapeMismatch())
    # As TorchScript: an nn.Module would be exported, and torch.export names the shapes itself.
    job = client.submit(ds, model=scripted, batch_size=10, epochs=1, seed=1)
    job.wait(timeout=120, check=False)
    assert job.state == trainerd.JobState.FAILED
    assert job.error == (
        "training failed at epoch 1: The following operation failed in the TorchScript "
        "interpreter: RuntimeError: mat1 and mat2 shapes cannot be multiplied (10x4 and 5x3)"
    )
    with pytest.raises(trainerd.JobFailed, match=r"shapes cannot be multiplied \(10x4 and 5x3\)"):
        job.raise_for_state()
