"""Job.to_tensorboard / to_mlflow and Sweep.to_tensorboard / to_mlflow against the real daemon:
what was written is read back with TensorBoard's EventAccumulator and MLflow's MlflowClient."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import seed_data

import trainerd

SCALARS = ("loss", "validation_loss", "validation_accuracy", "learning_rate")


@pytest.fixture(scope="module")
def finished(client: trainerd.Client, tmp_path_factory: pytest.TempPathFactory) -> trainerd.Job:
    """A small validating job that succeeded (Adam, a step schedule: the rate changes)."""
    x, y = seed_data(240, seed=11)
    client.upload("exports", x, y)
    return client.submit(
        "exports",
        model="linear:8,relu,linear:1",
        optimizer="adam",
        lr=0.05,
        epochs=5,
        batch_size=32,
        validation_fraction=0.25,
        schedule="step",
        step_epochs=2,
        gamma=0.5,
        seed=3,
    ).wait()


@pytest.fixture(scope="module")
def classifier_sweep(client: trainerd.Client) -> trainerd.Sweep:
    """Three members that validate with accuracy (cross_entropy on three classes)."""
    rng = np.random.default_rng(5)
    y = rng.integers(0, 3, size=180, dtype=np.int64)
    x = (np.eye(3, dtype=np.float32)[y] * 3 + rng.standard_normal((180, 3))).astype(np.float32)
    client.upload("exports-classes", x, y)
    return client.sweep(
        "exports-classes",
        model="linear:3",
        lr=[0.1, 0.03, 0.01],
        epochs=3,
        validation_fraction=0.2,
        seed=1,
    ).wait(timeout=120)


def expected_params(job: trainerd.Job) -> dict[str, Any]:
    """The spec's set fields, flattened by hand from the view (choices as names)."""
    params: dict[str, Any] = {}
    for field, value in job.spec.proto.ListFields():
        if field.name in ("optimizer", "schedule", "halving"):
            view = getattr(job.spec, field.name)
            for sub, sub_value in value.ListFields():
                shown = getattr(view, sub.name) if hasattr(view, "proto") else sub_value
                params[f"{field.name}.{sub.name}"] = shown
        elif hasattr(value, "extend"):
            params[field.name] = json.dumps(list(value))
        else:
            params[field.name] = getattr(job.spec, field.name)
    return params


def accumulate(run_dir: Path) -> Any:
    accumulator_module = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator"
    )
    accumulator = accumulator_module.EventAccumulator(
        str(run_dir), size_guidance={accumulator_module.SCALARS: 0, accumulator_module.TENSORS: 0}
    )
    accumulator.Reload()
    return accumulator


def hparams_of(accumulator: Any) -> Any:
    """The HParams plugin's session start info of a run."""
    plugin_data_pb2 = pytest.importorskip("tensorboard.plugins.hparams.plugin_data_pb2")
    content = accumulator.PluginTagToContent("hparams")
    data = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    return data.session_start_info


def test_job_to_tensorboard(finished: trainerd.Job, tmp_path: Path) -> None:
    history = finished.history
    assert len(history) == 5 and history[-1].validation_loss is not None
    run_dir = finished.to_tensorboard(tmp_path / "logs")
    assert run_dir == tmp_path / "logs" / finished.id
    accumulator = accumulate(run_dir)
    tags = accumulator.Tags()["scalars"]
    start = finished.start_time
    assert start is not None
    for tag in ("loss", "validation_loss", "learning_rate"):
        events = accumulator.Scalars(tag)
        assert [e.step for e in events] == [1, 2, 3, 4, 5]
        # simple_value is a float32: the epoch's figure as float32, exactly.
        assert [e.value for e in events] == [float(np.float32(getattr(h, tag))) for h in history]
        assert [e.wall_time for e in events] == pytest.approx(
            [start.timestamp() + h.elapsed_seconds for h in history], abs=1e-3
        )
    assert "validation_accuracy" not in tags  # mse: no accuracy
    assert len({e.value for e in accumulator.Scalars("learning_rate")}) == 3  # the step schedule
    (final,) = accumulator.Scalars("final/loss")
    assert final.step == 5 and final.value == float(np.float32(history[-1].loss))
    (epochs,) = accumulator.Scalars("final/epochs")
    assert epochs.value == 5.0
    (validation,) = accumulator.Scalars("final/validation_loss")
    assert validation.value == float(np.float32(history[-1].validation_loss))

    info = hparams_of(accumulator)
    assert info.group_name == finished.id
    assert info.hparams["optimizer.kind"].string_value == "adam"
    assert info.hparams["optimizer.learning_rate"].number_value == 0.05
    assert info.hparams["epochs"].number_value == 5
    assert info.hparams["model"].string_value == "linear:8,relu,linear:1"
    assert info.hparams["schedule.kind"].string_value == "step"
    assert set(info.hparams) == set(expected_params(finished))
    content = accumulator.PluginTagToContent("hparams")
    assert "_hparams_/session_end_info" in content

    # Again, under a name of its own: the earlier export's events are replaced, not doubled.
    again = finished.to_tensorboard(tmp_path / "logs", run_name="mine")
    assert again == tmp_path / "logs" / "mine"
    finished.to_tensorboard(tmp_path / "logs", run_name="mine")
    assert len(list(again.glob("events.out.tfevents.*"))) == 1
    assert [e.step for e in accumulate(again).Scalars("loss")] == [1, 2, 3, 4, 5]


def test_job_to_tensorboard_from_a_listing(
    client: trainerd.Client, finished: trainerd.Job, tmp_path: Path
) -> None:
    """A listing's job (the basic view, no epochs) is fetched whole first."""
    (listed,) = [j for j in client.jobs() if j.id == finished.id]
    assert len(listed.proto.epochs) == 0
    run_dir = listed.to_tensorboard(tmp_path)
    assert [e.step for e in accumulate(run_dir).Scalars("loss")] == [1, 2, 3, 4, 5]


def test_sweep_to_tensorboard(classifier_sweep: trainerd.Sweep, tmp_path: Path) -> None:
    runs = classifier_sweep.to_tensorboard(tmp_path)
    assert [r.name for r in runs] == [f"{i}-{j.id}" for i, j in enumerate(classifier_sweep.jobs, 1)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(r.name for r in runs)
    rates = []
    for run_dir, job in zip(runs, classifier_sweep.jobs):
        accumulator = accumulate(run_dir)
        history = job.history
        accuracy = accumulator.Scalars("validation_accuracy")
        assert [e.step for e in accuracy] == [1, 2, 3]
        assert [e.value for e in accuracy] == [
            float(np.float32(h.validation_accuracy)) for h in history
        ]
        info = hparams_of(accumulator)
        assert info.group_name == job.id
        rates.append(info.hparams["optimizer.learning_rate"].number_value)
    assert rates == [0.1, 0.03, 0.01]


# --- MLflow --------------------------------------------------------------------------------------


@pytest.fixture
def tracking_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A SQLite tracking store of the test's own (MLflow 3 refuses new file stores), its
    artifacts under the test's folder too (MLflow's default artifact root is ./mlruns)."""
    pytest.importorskip("mlflow")
    monkeypatch.chdir(tmp_path)
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture
def mlflow_client(tracking_uri: str) -> Any:
    tracking = pytest.importorskip("mlflow.tracking")
    return tracking.MlflowClient(tracking_uri=tracking_uri)


def test_job_to_mlflow(
    finished: trainerd.Job, tracking_uri: str, mlflow_client: Any, tmp_path: Path
) -> None:
    run_id = finished.to_mlflow(experiment="trainerd-tests", tracking_uri=tracking_uri)
    run = mlflow_client.get_run(run_id)
    experiment = mlflow_client.get_experiment_by_name("trainerd-tests")
    assert run.info.experiment_id == experiment.experiment_id
    assert run.info.run_name == finished.id
    assert run.info.status == "FINISHED"
    assert finished.start_time is not None and finished.end_time is not None
    assert run.info.start_time == int(finished.start_time.timestamp() * 1000)
    assert run.info.end_time == int(finished.end_time.timestamp() * 1000)

    assert run.data.params == {k: str(v) for k, v in expected_params(finished).items()}
    assert run.data.params["optimizer.kind"] == "adam"
    assert run.data.params["optimizer.learning_rate"] == "0.05"
    assert run.data.params["dataset"] == "exports"
    assert run.data.tags["trainerd.job_id"] == finished.id
    assert run.data.tags["trainerd.state"] == "SUCCEEDED"
    assert "trainerd.sweep_id" not in run.data.tags

    history = finished.history
    start = finished.start_time.timestamp()
    for name in ("loss", "validation_loss", "learning_rate"):
        series = mlflow_client.get_metric_history(run_id, name)
        assert [m.step for m in series] == [1, 2, 3, 4, 5]
        assert [m.value for m in series] == [getattr(h, name) for h in history]
        assert [m.timestamp for m in series] == [
            int((start + h.elapsed_seconds) * 1000) for h in history
        ]
    assert run.data.metrics["final/loss"] == history[-1].loss
    assert run.data.metrics["final/validation_loss"] == history[-1].validation_loss
    assert run.data.metrics["final/epochs"] == 5

    names = {a.path for a in mlflow_client.list_artifacts(run_id, "model")}
    assert names == {"model/model.pt", "model/model.safetensors"}
    downloaded = Path(mlflow_client.download_artifacts(run_id, "model", str(tmp_path)))
    assert (
        hashlib.sha256((downloaded / "model.pt").read_bytes()).hexdigest()
        == hashlib.sha256(finished.model_bytes()).hexdigest()
    )
    assert (downloaded / "model.safetensors").read_bytes() == finished.model_bytes(
        format="safetensors"
    )
    spec = json.loads(
        Path(mlflow_client.download_artifacts(run_id, "trainerd/spec.json", str(tmp_path)))
        .read_text()
    )
    assert spec["dataset"] == "exports" and spec["epochs"] == 5

    bare = finished.to_mlflow(tracking_uri=tracking_uri, run_name="bare", log_model=False)
    assert mlflow_client.get_run(bare).info.run_name == "bare"
    assert mlflow_client.get_run(bare).info.experiment_id == "0"  # the default experiment
    assert [a.path for a in mlflow_client.list_artifacts(bare)] == ["trainerd"]


def test_failed_job_to_mlflow(
    client: trainerd.Client, seed_dataset: trainerd.Dataset, tracking_uri: str, mlflow_client: Any
) -> None:
    job = client.submit("seed", model="linear:1", lr=1e6, epochs=50, batch_size=16)
    job.wait(check=False)
    run = mlflow_client.get_run(job.to_mlflow(tracking_uri=tracking_uri))
    assert run.info.status == "FAILED"
    assert run.data.tags["trainerd.state"] == "FAILED"
    assert "loss became" in run.data.tags["trainerd.error"]
    assert not mlflow_client.list_artifacts(run.info.run_id, "model")


def test_sweep_to_mlflow(
    classifier_sweep: trainerd.Sweep, tracking_uri: str, mlflow_client: Any
) -> None:
    parent_id = classifier_sweep.to_mlflow(
        experiment="sweeps", tracking_uri=tracking_uri, log_model=False
    )
    parent = mlflow_client.get_run(parent_id)
    assert parent.info.run_name == classifier_sweep.id
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["trainerd.sweep_id"] == classifier_sweep.id
    assert parent.data.tags["trainerd.best_job_id"] == classifier_sweep.best().id
    children = mlflow_client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_id}'"
    )
    assert len(children) == 3
    by_job = {c.data.tags["trainerd.job_id"]: c for c in children}
    for number, job in enumerate(classifier_sweep.jobs, 1):
        child = by_job[job.id]
        assert child.info.run_name == f"{number}-{job.id}"
        assert child.data.tags["trainerd.sweep_id"] == classifier_sweep.id
        assert child.data.tags["trainerd.sweep_member"] == str(number)
        accuracy = mlflow_client.get_metric_history(child.info.run_id, "validation_accuracy")
        assert [m.value for m in accuracy] == [h.validation_accuracy for h in job.history]


def test_to_mlflow_nests_under_the_active_run(
    finished: trainerd.Job, tracking_uri: str, mlflow_client: Any
) -> None:
    mlflow = pytest.importorskip("mlflow")
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(tracking_uri)
    try:
        with mlflow.start_run() as outer:
            run_id = finished.to_mlflow(log_model=False)
    finally:
        mlflow.set_tracking_uri(previous)
    run = mlflow_client.get_run(run_id)
    assert run.data.tags["mlflow.parentRunId"] == outer.info.run_id
    assert run.info.experiment_id == outer.info.experiment_id


def test_missing_extra_names_it(monkeypatch: pytest.MonkeyPatch, finished: trainerd.Job) -> None:
    """Without the extras installed, the calls say which to install."""
    import importlib

    real_import_module = importlib.import_module

    def import_module(name: str, package: str | None = None) -> Any:
        if name.startswith(("tensorboard", "mlflow")):
            raise ModuleNotFoundError(f"No module named '{name}'")
        return real_import_module(name, package)

    monkeypatch.setattr(importlib, "import_module", import_module)
    with pytest.raises(ImportError, match=r"pip install 'trainerd\[tensorboard\]'"):
        finished.to_tensorboard("unused")
    with pytest.raises(ImportError, match=r"pip install 'trainerd\[mlflow\]'"):
        finished.to_mlflow()


def test_aio_exports(
    daemon: Any, finished: trainerd.Job, classifier_sweep: trainerd.Sweep, tracking_uri: str,
    mlflow_client: Any, tmp_path: Path,
) -> None:
    """trainerd.aio's jobs and sweeps export the same: a listing's job is fetched whole first."""
    import asyncio

    import trainerd.aio

    async def main() -> tuple[Path, list[Path], str, str]:
        async with trainerd.aio.Client(daemon.address) as client:
            (listed,) = [j for j in await client.jobs() if j.id == finished.id]
            run_dir = await listed.to_tensorboard(tmp_path / "logs")
            sweep = await client.get_sweep(classifier_sweep.id)
            runs = await sweep.to_tensorboard(tmp_path / "sweep")
            run_id = await listed.to_mlflow(tracking_uri=tracking_uri)
            sweep_run = await sweep.to_mlflow(tracking_uri=tracking_uri, log_model=False)
            return run_dir, runs, run_id, sweep_run

    run_dir, runs, run_id, sweep_run = asyncio.run(main())
    history = finished.history
    assert [e.value for e in accumulate(run_dir).Scalars("loss")] == [
        float(np.float32(h.loss)) for h in history
    ]
    assert [r.name for r in runs] == [f"{i}-{j.id}" for i, j in enumerate(classifier_sweep.jobs, 1)]
    losses = mlflow_client.get_metric_history(run_id, "loss")
    assert [(m.step, m.value) for m in losses] == [(h.epoch, h.loss) for h in history]
    model = Path(mlflow_client.download_artifacts(run_id, "model/model.pt", str(tmp_path)))
    assert model.read_bytes() == finished.model_bytes()
    children = mlflow_client.search_runs(
        [mlflow_client.get_run(sweep_run).info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{sweep_run}'",
    )
    assert len(children) == 3
