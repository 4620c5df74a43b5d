"""A job's results where people already look: TensorBoard event files (:func:`write_tensorboard`)
and MLflow runs (:class:`MlflowExport`), written with those projects' own libraries, which are
imported only when called (the ``tensorboard`` and ``mlflow`` extras). Both work from what a job
object holds: its spec, its epochs, its state and times; MLflow also gets the trained model's
files, through the caller's download.
"""

from __future__ import annotations

import json
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from google.protobuf import json_format
from google.protobuf.message import Message

from trainerd._jobbase import Epoch, JobBase, JobState
from trainerd._model_input import is_exported_program
from trainerd._optional import import_extra
from trainerd._spec_view import JobSpecView, _View
from trainerd.errors import TrainerdError

if TYPE_CHECKING:
    from trainerd.sweeps import SweepBase

__all__ = [
    "EPOCH_METRICS",
    "MlflowExport",
    "epoch_metrics",
    "prefetched",
    "spec_params",
    "write_tensorboard",
]

ParamValue = Union[bool, int, float, str]

#: The per-epoch figures written, by their name (as :class:`~trainerd.Epoch` names them), when an
#: epoch has them: validation only with validation, the loss scale and skipped steps only in fp16.
EPOCH_METRICS = (
    "loss",
    "validation_loss",
    "validation_accuracy",
    "learning_rate",
    "loss_scale",
    "skipped_steps",
)

# MLflow's limits (mlflow.utils.validation), when that module does not say.
_MLFLOW_PARAM_VALUE_CHARS = 6000
_MLFLOW_TAG_VALUE_CHARS = 8000
_MLFLOW_PARAMS_PER_BATCH = 100
_MLFLOW_METRICS_PER_BATCH = 1000

_MLFLOW_STATUS = {
    JobState.SUCCEEDED: "FINISHED",
    JobState.FAILED: "FAILED",
    JobState.CANCELLED: "KILLED",
}


# --- What both write -------------------------------------------------------------------------


def spec_params(spec: JobSpecView) -> dict[str, ParamValue]:
    """The fields the spec sets (those ``repr(job.spec)`` shows), flattened: nested messages as
    dotted names (``optimizer.learning_rate``), choices as submit's names (``loss:
    "cross_entropy"``, ``optimizer.kind: "adam"``), repeated fields as a JSON list."""
    params: dict[str, ParamValue] = {}
    _flatten(spec, "", params)
    return params


def _flatten(view: _View, prefix: str, out: dict[str, ParamValue]) -> None:
    for field, value in view.proto.ListFields():
        name = prefix + field.name
        if isinstance(value, Message):
            shown = getattr(view, field.name)
            _flatten(shown if isinstance(shown, _View) else _View(value), name + ".", out)
        elif hasattr(value, "extend"):  # a repeated field
            out[name] = json.dumps(list(value))
        else:
            shown = getattr(view, field.name)
            if isinstance(shown, (bool, int, float, str)):
                out[name] = shown
            elif shown is not None:
                out[name] = str(shown)


def epoch_metrics(epoch: Epoch) -> dict[str, float]:
    """The epoch's figures by :data:`EPOCH_METRICS`' names, those it has."""
    figures: dict[str, float] = {}
    for name in EPOCH_METRICS:
        value = getattr(epoch, name)
        if value is not None:
            figures[name] = float(value)
    return figures


def final_metrics(job: JobBase, history: Sequence[Epoch]) -> dict[str, float]:
    """The job's final figures: the last epoch's losses and accuracy, its epochs, wall time and
    throughput."""
    figures: dict[str, float] = {}
    if history:
        last = history[-1]
        figures["final/loss"] = last.loss
        if last.validation_loss is not None:
            figures["final/validation_loss"] = last.validation_loss
        if last.validation_accuracy is not None:
            figures["final/validation_accuracy"] = last.validation_accuracy
    figures["final/epochs"] = float(len(history))
    figures["final/wall_seconds"] = job.wall_seconds
    figures["final/samples_per_second"] = job.samples_per_second
    return figures


def start_seconds(job: JobBase) -> float:
    """When the job started running (seconds since the epoch); its creation before it started,
    now for neither."""
    start = job.start_time or job.create_time
    return start.timestamp() if start is not None else time.time()


def end_seconds(job: JobBase, history: Sequence[Epoch]) -> float:
    """When the job ended; its last epoch's end (or its start) without an end time."""
    if job.end_time is not None:
        return job.end_time.timestamp()
    return start_seconds(job) + (history[-1].elapsed_seconds if history else 0.0)


# --- TensorBoard -----------------------------------------------------------------------------


def _tensorboard(module: str) -> Any:
    return import_extra(f"tensorboard.{module}", "tensorboard", "to_tensorboard")


def write_tensorboard(job: JobBase, history: Sequence[Epoch], run_dir: Path) -> Path:
    """Writes the job as one TensorBoard run in ``run_dir`` (made if missing; event files of an
    earlier export there are replaced): its spec as the HParams plugin's session (hyperparameters
    :func:`spec_params`, group name the job id, its start, and its end status once it ended),
    each epoch's :func:`epoch_metrics` as scalars at step = the epoch with wall time = the job's
    start + the epoch's elapsed seconds, and once it ended its :func:`final_metrics` at the last
    epoch's step. Returns ``run_dir``."""
    event_pb2 = _tensorboard("compat.proto.event_pb2")
    summary_pb2 = _tensorboard("compat.proto.summary_pb2")
    event_file_writer = _tensorboard("summary.writer.event_file_writer")
    hparams_summary = _tensorboard("plugins.hparams.summary_v2")
    hparams_metadata = _tensorboard("plugins.hparams.metadata")
    hparams_data = _tensorboard("plugins.hparams.plugin_data_pb2")
    hparams_api = _tensorboard("plugins.hparams.api_pb2")

    run_dir.mkdir(parents=True, exist_ok=True)
    for old in run_dir.glob("events.out.tfevents.*"):
        if old.is_file():
            old.unlink()
    state = job.cached_state
    start = start_seconds(job)
    writer = event_file_writer.EventFileWriter(str(run_dir), max_queue_size=1024, flush_secs=5)

    def write(step: int, wall_time: float, summary: Any) -> None:
        writer.add_event(event_pb2.Event(wall_time=wall_time, step=step, summary=summary))

    def scalars(figures: dict[str, float]) -> Any:
        return summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag=t, simple_value=v) for t, v in figures.items()]
        )

    try:
        write(
            0,
            start,
            hparams_summary.hparams_pb(
                spec_params(job.spec), trial_id=job.id, start_time_secs=start
            ),
        )
        for epoch in history:
            write(epoch.epoch, start + epoch.elapsed_seconds, scalars(epoch_metrics(epoch)))
        if state.ended:
            end = end_seconds(job, history)
            last_step = history[-1].epoch if history else 0
            write(last_step, end, scalars(final_metrics(job, history)))
            # The plugin's statuses have no "cancelled": a cancelled job is a failure there.
            status = (
                hparams_api.STATUS_SUCCESS
                if state == JobState.SUCCEEDED
                else hparams_api.STATUS_FAILURE
            )
            content = hparams_data.HParamsPluginData(
                session_end_info=hparams_data.SessionEndInfo(status=status, end_time_secs=end)
            )
            summary = summary_pb2.Summary()
            summary.value.add(
                tag=hparams_metadata.SESSION_END_INFO_TAG,
                metadata=hparams_metadata.create_summary_metadata(content),
                tensor=hparams_metadata.NULL_TENSOR,
            )
            write(last_step, end, summary)
    finally:
        writer.close()
    return run_dir


# --- MLflow ----------------------------------------------------------------------------------


def _chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


class MlflowExport:
    """Runs written into one MLflow tracking store (``tracking_uri``, the current one when None)
    with its MlflowClient."""

    def __init__(self, tracking_uri: str | None) -> None:
        self.mlflow = import_extra("mlflow", "mlflow", "to_mlflow")
        self.entities = import_extra("mlflow.entities", "mlflow", "to_mlflow")
        tracking = import_extra("mlflow.tracking", "mlflow", "to_mlflow")
        self.tracking_uri = tracking_uri
        self.client = tracking.MlflowClient(tracking_uri=tracking_uri)
        try:
            validation = import_extra("mlflow.utils.validation", "mlflow", "to_mlflow")
        except ImportError:
            validation = None
        limit = getattr(validation, "MAX_PARAM_VAL_LENGTH", _MLFLOW_PARAM_VALUE_CHARS)
        self.param_chars = int(limit)
        self.tag_chars = int(getattr(validation, "MAX_TAG_VAL_LENGTH", _MLFLOW_TAG_VALUE_CHARS))

    def place(self, experiment: str | None, parent_run_id: str | None) -> tuple[str, str | None]:
        """The experiment id and parent run of a new run: ``experiment`` by name (made when
        missing), else the active run's when there is one in the current tracking store (which
        then becomes the parent unless one is given), else the current experiment (as
        ``mlflow.set_experiment`` or $MLFLOW_EXPERIMENT_NAME / _ID chose it; MLflow's default
        experiment when the tracking URI is another one)."""
        active = self.mlflow.active_run() if self.tracking_uri is None else None
        if active is not None and parent_run_id is None:
            parent_run_id = active.info.run_id
        if experiment is not None:
            found = self.client.get_experiment_by_name(experiment)
            if found is not None:
                return str(found.experiment_id), parent_run_id
            return str(self.client.create_experiment(experiment)), parent_run_id
        if active is not None:
            return str(active.info.experiment_id), parent_run_id
        if self.tracking_uri is None:
            current = getattr(self.mlflow.tracking.fluent, "_get_experiment_id", None)
            if current is not None:
                found_id = current()
                if found_id:
                    return str(found_id), parent_run_id
        default = self.client.get_experiment_by_name("Default")
        return (str(default.experiment_id) if default is not None else "0"), parent_run_id

    def start_run(
        self,
        experiment_id: str,
        run_name: str,
        start: float,
        tags: dict[str, str],
        parent_run_id: str | None,
    ) -> str:
        tags = {k: v[: self.tag_chars] for k, v in tags.items()}
        if parent_run_id is not None:
            tags["mlflow.parentRunId"] = parent_run_id
        run = self.client.create_run(
            experiment_id, start_time=int(start * 1000), tags=tags, run_name=run_name
        )
        return str(run.info.run_id)

    def log_job(
        self,
        job: JobBase,
        history: Sequence[Epoch],
        *,
        experiment_id: str,
        run_name: str,
        parent_run_id: str | None,
        fetch_model: Callable[[str], bytes] | None,
    ) -> str:
        """One run for the job: params, per-epoch and final metrics, tags, the spec as
        ``trainerd/spec.json`` and (``fetch_model`` given and the job SUCCEEDED) the model's files
        under ``model/``; terminated with the job's outcome once it ended. Returns its id."""
        state = job.cached_state
        start = start_seconds(job)
        tags = {
            "trainerd.job_id": job.id,
            "trainerd.state": state.value,
            "trainerd.dataset": job.dataset,
            "trainerd.device": job.device,
        }
        if job.sweep_id:
            tags["trainerd.sweep_id"] = job.sweep_id
            tags["trainerd.sweep_member"] = str(job.sweep_member)
        if job.error:
            tags["trainerd.error"] = job.error
        if job.stop_reason:
            tags["trainerd.stop_reason"] = job.stop_reason
        if job.model_epoch:
            tags["trainerd.model_epoch"] = str(job.model_epoch)
        run_id = self.start_run(experiment_id, run_name, start, tags, parent_run_id)
        try:
            self._log_figures(run_id, job, history, start, state.ended)
            with tempfile.TemporaryDirectory(prefix="trainerd-mlflow-") as tmp:
                spec_file = Path(tmp) / "spec.json"
                spec_file.write_text(
                    json_format.MessageToJson(job.spec.proto, preserving_proto_field_name=True)
                )
                self.client.log_artifact(run_id, str(spec_file), artifact_path="trainerd")
                if fetch_model is not None and state == JobState.SUCCEEDED:
                    self._log_model(run_id, job, fetch_model, Path(tmp))
        except BaseException:
            self.client.set_terminated(run_id, status="FAILED")
            raise
        if state.ended:
            self.client.set_terminated(
                run_id,
                status=_MLFLOW_STATUS[state],
                end_time=int(end_seconds(job, history) * 1000),
            )
        return run_id

    def _log_figures(
        self, run_id: str, job: JobBase, history: Sequence[Epoch], start: float, ended: bool
    ) -> None:
        entities = self.entities
        params = [
            entities.Param(key, str(value)[: self.param_chars])
            for key, value in spec_params(job.spec).items()
        ]
        metrics = [
            entities.Metric(name, value, int((start + epoch.elapsed_seconds) * 1000), epoch.epoch)
            for epoch in history
            for name, value in epoch_metrics(epoch).items()
        ]
        if ended:
            end_ms = int(end_seconds(job, history) * 1000)
            last_step = history[-1].epoch if history else 0
            metrics += [
                entities.Metric(name, value, end_ms, last_step)
                for name, value in final_metrics(job, history).items()
            ]
        for batch in _chunks(params, _MLFLOW_PARAMS_PER_BATCH):
            self.client.log_batch(run_id, params=batch)
        for batch in _chunks(metrics, _MLFLOW_METRICS_PER_BATCH):
            self.client.log_batch(run_id, metrics=batch)

    def _log_model(
        self, run_id: str, job: JobBase, fetch_model: Callable[[str], bytes], folder: Path
    ) -> None:
        """The model as the client downloads it by default (``model/model.pt``, TorchScript, or
        ``model/model.pt2`` for an exported job) and its state_dict (``model/model.safetensors``)
        when the daemon gives one."""
        data = fetch_model("torchscript")
        model_file = folder / ("model.pt2" if is_exported_program(data) else "model.pt")
        model_file.write_bytes(data)
        self.client.log_artifact(run_id, str(model_file), artifact_path="model")
        try:
            weights = fetch_model("safetensors")
        except TrainerdError as e:
            warnings.warn(
                f"to_mlflow: job '{job.id}' has no safetensors state_dict to log ({e})",
                stacklevel=4,
            )
            return
        weights_file = folder / "model.safetensors"
        weights_file.write_bytes(weights)
        self.client.log_artifact(run_id, str(weights_file), artifact_path="model")

    def log_sweep(
        self,
        sweep: SweepBase[Any],
        histories: Sequence[Sequence[Epoch]],
        fetchers: Sequence[Callable[[str], bytes] | None],
        *,
        experiment_id: str,
        run_name: str,
        parent_run_id: str | None,
    ) -> str:
        """A parent run for the sweep and a nested run per member (:meth:`log_job`), named by
        the member's number and id; the parent ends FINISHED once every member ended. Returns
        the parent's id."""
        jobs: list[JobBase] = list(sweep.jobs)
        tags = {"trainerd.sweep_id": sweep.id, "trainerd.members": str(len(jobs))}
        try:
            best = sweep.best()
        except ValueError:
            pass
        else:
            tags["trainerd.best_job_id"] = best.id
            tags["trainerd.best_metric"] = sweep.best_metric
        start = min((start_seconds(job) for job in jobs), default=time.time())
        sweep_run = self.start_run(experiment_id, run_name, start, tags, parent_run_id)
        try:
            names = sweep._run_names()  # noqa: SLF001
            for job, history, fetch, name in zip(jobs, histories, fetchers, names):
                self.log_job(
                    job,
                    history,
                    experiment_id=experiment_id,
                    run_name=name,
                    parent_run_id=sweep_run,
                    fetch_model=fetch,
                )
        except BaseException:
            self.client.set_terminated(sweep_run, status="FAILED")
            raise
        if all(job.cached_state.ended for job in jobs):
            end = max((end_seconds(job, h) for job, h in zip(jobs, histories)), default=start)
            self.client.set_terminated(sweep_run, status="FINISHED", end_time=int(end * 1000))
        return sweep_run


def prefetched(models: dict[str, bytes | TrainerdError]) -> Callable[[str], bytes]:
    """A ``fetch_model`` for :meth:`MlflowExport.log_job` from downloads made beforehand (the
    asyncio client's, whose logging runs in a worker thread): each format's bytes, or the error
    its download raised."""

    def fetch(format: str) -> bytes:
        value = models[format]
        if isinstance(value, TrainerdError):
            raise value
        return value

    return fetch
