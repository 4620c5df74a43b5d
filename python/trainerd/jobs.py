"""Training jobs: what :meth:`trainerd.Client.submit`, :meth:`~trainerd.Client.job` and
:meth:`~trainerd.Client.jobs` return. :class:`Job` is the synchronous client's: its calls block.
Its figures are :class:`JobBase`'s, which ``trainerd.aio.Job`` shares; its calls are the
operations of :mod:`trainerd._calls` and :mod:`trainerd._download`, run on the client's
transport."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainerd import _calls, _download, _export
from trainerd._connection import Connection
from trainerd._display import DisplayArg, job_html
from trainerd._download import DOWNLOAD_TIMEOUT as DOWNLOAD_TIMEOUT  # noqa: PLC0414
from trainerd._download import MAX_CHECKPOINT_BYTES, MAX_MODEL_BYTES
from trainerd._jobbase import Checkpoint, Epoch, EpochFeed, JobState
from trainerd._jobbase import JobBase as JobBase  # noqa: PLC0414 (trainerd.jobs.JobBase)
from trainerd._models import StateDict, export_program, load_into, load_model, parse_state_dict
from trainerd._models import eval_exported_module as eval_exported_module  # noqa: PLC0414
from trainerd._models import write_atomically
from trainerd._split import held_out_rows
from trainerd.errors import TrainerdError
from trainerd.v1 import jobs_pb2

if TYPE_CHECKING:
    import pandas

    from trainerd.client import Client

__all__ = ["MAX_CHECKPOINT_BYTES", "MAX_MODEL_BYTES", "Checkpoint", "Epoch", "Job", "JobState"]


class Job(JobBase):
    """A training job. Its figures are those of the daemon's last answer: ``state`` asks again
    while the job has not ended; :meth:`refresh` always does.

    Example::

        job = client.submit("houses", model="linear:64,relu,linear:1", epochs=20)
        for epoch in job.watch():
            print(epoch.epoch, epoch.loss)
        job.wait()                     # raises JobFailed / JobCancelled
        model = job.model()            # torch.jit.load of the trained model
    """

    def __init__(self, client: Client, proto: jobs_pb2.Job) -> None:
        super().__init__(proto)
        self._client = client
        self._call = client._call  # noqa: SLF001 (runs an operation on the client's transport)

    @property
    def state(self) -> JobState:
        """The job's state, asked of the daemon again unless the job has already ended."""
        if not JobState.from_proto(self._proto.state).ended:
            self.refresh()
        return JobState.from_proto(self._proto.state)

    @property
    def ended(self) -> bool:
        return self.state.ended

    @property
    def report(self) -> jobs_pb2.DeviceReport:
        """Where the job's time went and what bounded it (trainerd.v1.DeviceReport; its
        ``verdict`` is one line), complete once the job ended."""
        self._full()
        return self._proto.report

    @property
    def history(self) -> list[Epoch]:
        """Every finished epoch, in order."""
        self._full()
        return self._history()

    @property
    def parameters(self) -> dict[str, np.ndarray[Any, np.dtype[np.float32]]]:
        """The trained parameters by name ("0.weight"), for models of at most 1,000 values;
        empty otherwise."""
        self._full()
        return self._parameters()

    def history_frame(self) -> pandas.DataFrame:
        """The history as a pandas DataFrame, one row per epoch (needs pandas)."""
        return self._history_frame(self.history)

    def to_tensorboard(
        self, logdir: str | os.PathLike[str], *, run_name: str | None = None
    ) -> Path:
        """Writes the job as a TensorBoard run, ``logdir/<run_name>`` (default: the job id), with
        TensorBoard's own library (``pip install 'trainerd[tensorboard]'``; no TensorFlow): each
        epoch's ``loss``, ``validation_loss`` and ``validation_accuracy`` (when it validates),
        ``learning_rate`` (and fp16's ``loss_scale``, ``skipped_steps``) as scalars at step =
        the epoch, wall time = the job's start + the epoch's ``elapsed_seconds``; once it ended,
        ``final/loss``, ``final/validation_loss``, ``final/validation_accuracy``,
        ``final/epochs``, ``final/wall_seconds`` and ``final/samples_per_second`` at the last
        epoch's step; and the spec's fields (as ``repr(job.spec)`` shows them, flattened:
        ``optimizer.learning_rate``) as the HParams dashboard's hyperparameters. Event files of
        an earlier export to the same run are replaced. Returns the run's directory."""
        history = self.history  # the full job, current unless it ended
        return _export.write_tensorboard(self, history, Path(logdir) / (run_name or self.id))

    def to_mlflow(
        self,
        experiment: str | None = None,
        run_name: str | None = None,
        tracking_uri: str | None = None,
        log_model: bool = True,
    ) -> str:
        """Logs the job as an MLflow run with MLflow's own client (``pip install
        'trainerd[mlflow]'``) and returns the run's id. The run goes to ``tracking_uri`` (the
        current one, ``mlflow.get_tracking_uri()``, when None), into ``experiment`` by name (made
        when missing), else the current experiment; inside an active ``mlflow.start_run()`` (on
        the current tracking URI) it is nested under that run. Its name is ``run_name`` or the
        job id; its start and end the job's. It holds: the spec's fields as parameters
        (flattened as :meth:`to_tensorboard`'s hyperparameters, values cut to MLflow's length
        limit); each epoch's figures as metrics at step = the epoch, timestamped by the epoch's
        end; the final figures (``final/loss``, ...); tags ``trainerd.job_id``,
        ``trainerd.state``, ``trainerd.dataset``, ``trainerd.device``, ``trainerd.sweep_id``
        and ``trainerd.sweep_member`` for a sweep's member, ``trainerd.error`` or
        ``trainerd.stop_reason`` when there is one; the spec as ``trainerd/spec.json``; and with
        ``log_model`` for a SUCCEEDED job, the trained model as :meth:`model_bytes` downloads it
        (``model/model.pt``, TorchScript, or ``model/model.pt2`` for an exported job) and its
        state_dict (``model/model.safetensors``). An ended job's run ends FINISHED, FAILED or
        KILLED; a job still running gives a run left RUNNING with the epochs so far."""
        history = self.history
        export = _export.MlflowExport(tracking_uri)
        experiment_id, parent = export.place(experiment, None)
        return export.log_job(
            self,
            history,
            experiment_id=experiment_id,
            run_name=run_name or self.id,
            parent_run_id=parent,
            fetch_model=self._model_fetcher() if log_model else None,
        )

    def _model_fetcher(self) -> Callable[[str], bytes]:
        def fetch(format: str) -> bytes:
            return self.model_bytes(format=format)

        return fetch

    # --- Calls -----------------------------------------------------------------------------

    def refresh(self) -> Job:
        """Asks the daemon for the job again (GetJob, every field); returns self."""
        self._call(_calls.refresh, self)
        return self

    def _full(self) -> None:
        """Makes sure the job is the full view and current unless it ended."""
        if self._needs_full():
            self.refresh()

    def cancel(self) -> Job:
        """Cancels the job if it is queued or running (a running one stops before its next
        step); returns self. FailedPrecondition when it already ended."""
        self._proto = self._call(_calls.cancel_job, self.id)
        return self

    def delete(self) -> None:
        """Forgets the job that ended: its record, model and checkpoints. FailedPrecondition while
        it is queued or running (cancel it first)."""
        self._client.delete_job(self.id)

    def _repr_html_(self) -> str:
        # Current figures when the job runs (or this is a listing's basic view); the last ones
        # when the daemon cannot be asked: a view must not raise.
        try:
            self._full()
        except TrainerdError:
            pass
        return job_html(self)

    def wait(
        self,
        timeout: float | None = None,
        *,
        check: bool = True,
        progress: DisplayArg = None,
        plot: DisplayArg = None,
    ) -> Job:
        """Blocks until the job ends, on a WatchJob stream (the end is seen the moment the daemon
        publishes it), and returns self, refreshed. With ``check`` (the default), a FAILED job
        raises :class:`~trainerd.JobFailed` carrying the daemon's reason and a CANCELLED one
        :class:`~trainerd.JobCancelled`. :class:`TimeoutError` when ``timeout`` seconds pass
        first (the job goes on). ``progress`` and ``plot`` are :meth:`watch`'s."""
        self._call(_calls.wait, self, timeout, self._display(progress, plot))
        if check:
            self.raise_for_state()
        return self

    def watch(self, *, progress: DisplayArg = None, plot: DisplayArg = None) -> Iterator[Epoch]:
        """Yields each epoch as the daemon reduces it (WatchJob): first the history, then every
        new epoch, each once and in order, until the job ends. The job's state is then current
        (``job.state``); a failure does not raise here (:meth:`wait` or
        :meth:`raise_for_state` do). Stopping the loop early ends the stream, not the job.

        ``progress``: a tqdm bar over the epochs with the latest losses; None (the default)
        draws one in Jupyter or when stderr is a terminal and tqdm is installed, True anyway
        (with tqdm), False never. ``plot``: a loss curve (training loss, and validation loss when
        the job validates) redrawn in place as epochs arrive; None draws it in a Jupyter kernel
        when matplotlib is installed, True wherever IPython and matplotlib are (a warning when
        they are not), False never."""
        self._call(Connection.ready)
        feed = EpochFeed(self._display(progress, plot))
        stream = self._client._transport.stream(_calls.watch(self.id, None))  # noqa: SLF001
        try:
            for event in stream:
                yield from feed.take(event)
                if feed.ended:
                    break
        finally:
            stream.cancel()
            feed.close()
        self.refresh()

    def model_bytes(
        self,
        *,
        timeout: float | None = None,
        max_bytes: int = MAX_MODEL_BYTES,
        format: str = "torchscript",
    ) -> bytes:
        """The trained model's bytes (DownloadModel): ``format="torchscript"`` a TorchScript
        archive, ``"safetensors"`` the state_dict as a safetensors file (see
        :meth:`state_dict`), ``"pt2"`` torch.export's archive (an exported job's trained
        program; a spec-built job's ``nn.Sequential`` in eval mode, written by the daemon;
        FailedPrecondition for a TorchScript job: see :meth:`export`). FailedPrecondition unless
        the job SUCCEEDED. The download takes at
        most the size the daemon declares, and refuses (DownloadRefused) a declared size above
        ``max_bytes`` (default :data:`MAX_MODEL_BYTES`, the largest model the daemon trains) or
        more bytes than declared, stopping the call at once."""
        return self._call(_download.model_bytes, self.id, format, max_bytes, timeout)

    def model(self, *, map_location: str = "cpu", max_bytes: int = MAX_MODEL_BYTES) -> Any:
        """The trained model as TorchScript, loaded with ``torch.jit.load`` (in eval mode; its
        forward takes a float32 batch shaped like the dataset's features). Without torch, the
        archive's bytes. ``max_bytes`` as for :meth:`model_bytes`. Warns once per client
        (UserWarning) when this torch's major.minor version is not the daemon's LibTorch's.
        PyTorch deprecates TorchScript: :meth:`module` and :meth:`export` give the same model as
        an ``nn.Module`` and as a ``torch.export`` program."""
        model = load_model(self.model_bytes(max_bytes=max_bytes), map_location)
        self._call(Connection.check_torch)
        return model

    def state_dict(self, *, max_bytes: int = MAX_MODEL_BYTES) -> StateDict:
        """The trained weights, an OrderedDict of name to tensor in the order of the module's own
        ``state_dict()``: torch tensors when torch is importable, numpy arrays otherwise (needs
        the safetensors package: ``pip install 'trainerd[safetensors]'``). A spec's names are
        ``nn.Sequential``'s (``0.weight``, ``0.bias``, ``1.running_mean``, ...), so that
        ``nn.Sequential(...).load_state_dict(job.state_dict())`` takes them; a TorchScript job's
        are its module's own. ``.metadata`` holds the job's id, its spec and one row's shape."""
        return parse_state_dict(self.model_bytes(max_bytes=max_bytes, format="safetensors"))

    def module(self, module: Any = None, *, max_bytes: int = MAX_MODEL_BYTES) -> Any:
        """The trained model as a ready ``nn.Module`` in eval mode: the ``nn.Sequential`` of the
        job's spec with its weights, or ``module`` (an instance of the user's own class, e.g.
        ``job.module(MyNet())``) with the weights loaded into it (strictly: every name must
        match). Needs torch."""
        return load_into(self.id, self.state_dict(max_bytes=max_bytes), module)

    def export(
        self, path: str | os.PathLike[str], module: Any = None, *, max_bytes: int = MAX_MODEL_BYTES
    ) -> Path:
        """Saves the trained model as a ``.pt2`` program for deployment: ``torch.export`` of
        :meth:`module` (``module`` as there) in eval mode, traced on an example batch of the
        dataset's feature shape with the batch dimension dynamic, written by
        ``torch.export.save``; ``torch.export.load(path).module()`` runs it. Returns the path."""
        state = self.state_dict(max_bytes=max_bytes)
        return export_program(load_into(self.id, state, module), state.feature_shape, path)

    def save_model(
        self, path: str | os.PathLike[str], *, max_bytes: int = MAX_MODEL_BYTES
    ) -> Path:
        """Downloads the trained model to ``path`` (written to a temporary file beside it and
        renamed over it once whole); returns the path. ``max_bytes`` as for
        :meth:`model_bytes`."""
        return write_atomically(path, self.model_bytes(max_bytes=max_bytes))

    def checkpoints(self) -> list[Checkpoint]:
        """The checkpoints written so far (``checkpoint_every``), oldest first, as the daemon
        lists them now (GetJob)."""
        self.refresh()
        return self._checkpoint_list()

    def checkpoint_bytes(
        self,
        epoch: int | None = None,
        *,
        timeout: float | None = None,
        max_bytes: int = MAX_CHECKPOINT_BYTES,
    ) -> bytes:
        """A checkpoint's file (DownloadCheckpoint): ``epoch``'s, or the newest. It is the
        archive the daemon resumes the job from: LibTorch's ``torch::serialize::OutputArchive``
        (a ZIP that ``torch.jit.load`` opens), with the model's parameters and buffers under
        ``model``, the optimizer's state under ``optimizer``, the loop's state under ``meta`` and,
        for a job that hands back its best epoch, that epoch's weights under ``best_model``.
        NotFound for an epoch without one (the message names those that have one); bounded as
        :meth:`model_bytes` is, by default at :data:`MAX_CHECKPOINT_BYTES`."""
        return self._call(_download.checkpoint_bytes, self.id, epoch, max_bytes, timeout)

    def checkpoint(
        self,
        epoch: int | None = None,
        *,
        path: str | os.PathLike[str],
        max_bytes: int = MAX_CHECKPOINT_BYTES,
    ) -> Path:
        """Downloads a checkpoint (:meth:`checkpoint_bytes`: ``epoch``'s, or the newest) to
        ``path`` (written to a temporary file beside it and renamed over it once whole); returns
        the path."""
        return write_atomically(path, self.checkpoint_bytes(epoch, max_bytes=max_bytes))

    def validation_rows(self, rows: int | None = None) -> np.ndarray[Any, np.dtype[np.int64]]:
        """The indices of the dataset rows the job held out for validation
        (``validation_fraction``), in the split's order (the order the daemon validates them in
        when the job shuffles; with ``shuffle=False`` it validates them sorted): evaluate the trained model on them to
        get the job's last validation loss and accuracy. ``rows``: the dataset's row count (asked
        of the daemon when not given). Needs torch, the daemon's version (jobs.proto,
        JobSpec.validation_fraction, says the rule). ValueError for a job that held none out.

        Example::

            job = client.submit(ds, model="linear:64,relu,linear:10", validation_fraction=0.2)
            job.wait()
            held_out = job.validation_rows()
            logits = job.model()(torch.from_numpy(X[held_out]))
        """
        return held_out_rows(
            self._held_out_dataset_rows(rows), self.spec.validation_fraction, self.split_seed
        )

    def _held_out_dataset_rows(self, rows: int | None) -> int:
        if not self.spec.validation_fraction > 0:
            raise ValueError(
                f"job '{self.id}' holds no rows out "
                + (
                    f"(it validates on dataset '{self.spec.validation_dataset}')"
                    if self.spec.validation_dataset
                    else "(it has no validation_fraction)"
                )
            )
        return rows if rows is not None else self._client.dataset(self.dataset).rows
