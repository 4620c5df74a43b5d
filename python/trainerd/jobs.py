"""Training jobs: what :meth:`trainerd.Client.submit`, :meth:`~trainerd.Client.job` and
:meth:`~trainerd.Client.jobs` return."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import io
import os
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainerd._display import DisplayArg, JobDisplay, job_display, job_html
from trainerd._models import StateDict, export_program, load_into, parse_state_dict
from trainerd._optional import import_torch
from trainerd._spec_view import JobSpecView
from trainerd._split import held_out_rows
from trainerd._spec import is_exported_program
from trainerd.errors import (
    DeadlineExceeded,
    DownloadRefused,
    JobCancelled,
    JobFailed,
    TrainerdError,
)
from trainerd.v1 import jobs_pb2

if TYPE_CHECKING:
    import pandas

    from trainerd.client import Client

__all__ = ["MAX_CHECKPOINT_BYTES", "MAX_MODEL_BYTES", "Checkpoint", "Epoch", "Job", "JobState"]

_JOBS = "/trainerd.v1.JobService/"
# A model download may be large on a slow link: it gets an upload's allowance (as trainctl).
DOWNLOAD_TIMEOUT = 600.0
#: The largest model a download takes unless given ``max_bytes``: the largest model the daemon
#: trains (2**31 float32 parameters, its common/job_limits.h) and 64 MiB for the archive's own
#: code and records; trainctl's ``job model --max-size`` default too.
MAX_MODEL_BYTES = (8 << 30) + (64 << 20)
#: The largest checkpoint a download takes unless given ``max_bytes``: a checkpoint of that model
#: (the model, up to three optimizer tensors per parameter and the best epoch's copy); trainctl's
#: ``job checkpoint --max-size`` default too.
MAX_CHECKPOINT_BYTES = 5 * (8 << 30) + (64 << 20)


class JobState(str, enum.Enum):
    """A job's state; the last three are terminal."""

    UNSPECIFIED = "UNSPECIFIED"
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def ended(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)

    @classmethod
    def from_proto(cls, value: int) -> JobState:
        name = jobs_pb2.JobState.Name(value)  # type: ignore[arg-type,unused-ignore]
        return cls(name.removeprefix("JOB_STATE_"))

    def to_proto(self) -> int:
        return int(jobs_pb2.JobState.Value(f"JOB_STATE_{self.value}"))

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class Epoch:
    """One finished epoch of a job (trainerd.v1.EpochResult).

    ``loss`` is the epoch's mean training loss over the rows that trained, with the job's loss
    terms (label_smoothing, class_weights, pos_weight): each batch's mean loss times its rows,
    summed, divided by the rows (not the mean of the batch means, which differs when the last
    batch is shorter). ``validation_loss`` is the plain loss over the validation rows, without
    those training-only terms, as an eval loop computes it, averaged the same way; with
    ``ignore_index``, ignored rows are left out of it and of ``validation_accuracy``.
    """

    epoch: int
    loss: float
    elapsed_seconds: float
    learning_rate: float
    validation_loss: float | None = None
    validation_accuracy: float | None = None
    loss_scale: float | None = None
    skipped_steps: int | None = None

    @classmethod
    def from_proto(cls, proto: jobs_pb2.EpochResult) -> Epoch:
        def optional(name: str) -> Any:
            return getattr(proto, name) if proto.HasField(name) else None

        return cls(
            epoch=proto.epoch,
            loss=proto.loss,
            elapsed_seconds=proto.elapsed_seconds,
            learning_rate=proto.learning_rate,
            validation_loss=optional("validation_loss"),
            validation_accuracy=optional("validation_accuracy"),
            loss_scale=optional("loss_scale"),
            skipped_steps=optional("skipped_steps"),
        )


def _timestamp(message: Any, field: str) -> datetime.datetime | None:
    if not message.HasField(field):
        return None
    value = getattr(message, field).ToDatetime(tzinfo=datetime.timezone.utc)
    assert isinstance(value, datetime.datetime)
    return value


def epochs_of_event(event: jobs_pb2.JobEvent, last: int) -> tuple[list[Epoch], bool]:
    """The epochs after ``last`` that a WatchJob event carries (an epoch event, or the job with
    its epochs), and whether it says the job ended."""
    if event.HasField("epoch"):
        return ([Epoch.from_proto(event.epoch)] if event.epoch.epoch > last else []), False
    if event.HasField("job"):
        epochs = [Epoch.from_proto(e) for e in event.job.epochs if e.epoch > last]
        return epochs, JobState.from_proto(event.job.state).ended
    return [], False


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """One of a job's checkpoints (trainerd.v1.Checkpoint): written at the end of ``epoch``;
    :meth:`Job.checkpoint` downloads it."""

    epoch: int
    size_bytes: int
    create_time: datetime.datetime | None


def checked_model(job_id: str, data: bytes, total: int, what: str = "model") -> bytes:
    """The downloaded archive, when all ``total`` bytes (the first chunk's figure) arrived."""
    if len(data) != total or not data:
        raise TrainerdError(
            f"the {what} of job '{job_id}' arrived incomplete ({len(data)} of {max(total, 0)} "
            "bytes)"
        )
    return data


def _checkpoint_epoch(epoch: int | None) -> int:
    """DownloadCheckpointRequest.epoch: 0 (the newest) for None."""
    if epoch is None:
        return 0
    if isinstance(epoch, bool) or not isinstance(epoch, int) or not 1 <= epoch < 2**31:
        raise ValueError(f"epoch must be a checkpoint's epoch (>= 1) or None, not {epoch!r}")
    return epoch


def _check_max_bytes(max_bytes: int) -> int:
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ValueError(f"max_bytes must be a whole number of bytes above 0, not {max_bytes!r}")
    return max_bytes


class ModelReceiver:
    """DownloadModel's chunks gathered, bounded by the size the daemon declares on the first
    chunk and by ``max_bytes``: :meth:`add` raises DownloadRefused, and the caller stops reading
    (cancelling the call), when the declared size is above ``max_bytes`` or a chunk would take
    the bytes received past the declared size. Nothing is allocated from the declared size."""

    def __init__(self, job_id: str, max_bytes: int, what: str = "model") -> None:
        self._job_id = job_id
        self._what = what
        self._max_bytes = _check_max_bytes(max_bytes)
        self._total = -1
        self._received = 0
        self._buffer = io.BytesIO()

    def add(self, chunk: jobs_pb2.ModelChunk) -> None:
        if self._total < 0:
            total = chunk.total_bytes
            if total < 0 or total > self._max_bytes:
                raise DownloadRefused(
                    f"the daemon declared the {self._what} of job '{self._job_id}' as {total} "
                    "bytes, "
                    + (
                        "which is no size"
                        if total < 0
                        else f"more than this download takes (max_bytes={self._max_bytes}); "
                        "pass a larger max_bytes to download it"
                    )
                )
            self._total = total
        size = len(chunk.data)
        if self._received + size > self._total:
            raise DownloadRefused(
                f"the daemon sent more than the {self._total} bytes it declared for the "
                f"{self._what} of job '{self._job_id}' ({self._received + size} so far); stopped "
                "reading and kept nothing"
            )
        self._received += size
        self._buffer.write(chunk.data)

    def result(self) -> bytes:
        """The whole archive; TrainerdError when the stream ended before the declared size."""
        return checked_model(self._job_id, self._buffer.getvalue(), self._total, self._what)


def download_request(job_id: str, format: str) -> jobs_pb2.DownloadModelRequest:
    """DownloadModel's request for ``format`` ("torchscript", "safetensors" or "pt2")."""
    formats = {
        "torchscript": jobs_pb2.MODEL_FORMAT_TORCHSCRIPT,
        "safetensors": jobs_pb2.MODEL_FORMAT_SAFETENSORS,
        "pt2": jobs_pb2.MODEL_FORMAT_PT2,
    }
    if format not in formats:
        raise ValueError(
            f"format must be 'torchscript', 'safetensors' or 'pt2', not {format!r}"
        )
    return jobs_pb2.DownloadModelRequest(id=job_id, format=formats[format])


def load_model(data: bytes, map_location: str) -> Any:
    """The trained model from an archive's bytes: an exported program's (an exported job's .pt2)
    as a torch.fx.GraphModule in evaluation mode (eval_exported_module), a TorchScript archive's
    with torch.jit.load; the bytes themselves without torch."""
    try:
        torch = import_torch()
    except ImportError:
        return data
    if is_exported_program(data):
        with warnings.catch_warnings():
            # torch.export.load makes its tensors over the archive's read-only bytes and says
            # so; they are copied below, before anything can write to them.
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            program = torch.export.load(io.BytesIO(data))
        module = program.module()
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                tensor.data = tensor.data.clone()
        return eval_exported_module(module).to(map_location)
    return torch.jit.load(io.BytesIO(data), map_location=map_location)


# Each mode-dependent operator trainerd switches (docs/TRAINING.md): its argument, and the value
# it takes in evaluation mode.
_EVAL_ARGUMENTS = {
    "aten.dropout.default": ("train", 2, False),
    "aten.feature_dropout.default": ("train", 2, False),
    "aten.alpha_dropout.default": ("train", 2, False),
    "aten.feature_alpha_dropout.default": ("train", 2, False),
    "aten.batch_norm.default": ("training", 5, False),
    "aten.lstm.input": ("train", 6, False),
    "aten.gru.input": ("train", 6, False),
    "aten.rnn_tanh.input": ("train", 6, False),
    "aten.rnn_relu.input": ("train", 6, False),
    "aten.scaled_dot_product_attention.default": ("dropout_p", 4, 0.0),
}


def eval_exported_module(module: Any) -> Any:
    """An exported program's module (``ExportedProgram.module()``, exported in training mode)
    switched to evaluation behaviour as trainerd validates it: dropout off, batch norm on its
    running statistics (when it has them), the recurrent layers' and attention's dropout off.
    ``.eval()`` is not supported on such modules; this rewrites the nodes' mode arguments."""
    for node in module.graph.nodes:
        rule = _EVAL_ARGUMENTS.get(str(node.target)) if node.op == "call_function" else None
        if rule is None:
            continue
        name, position, value = rule
        if name == "training" and (len(node.args) <= 3 or node.args[3] is None):
            continue  # batch norm without running statistics uses the batch's in both modes
        if name in node.kwargs:
            node.update_kwarg(name, value)
        elif len(node.args) > position:
            node.update_arg(position, value)
        else:
            node.update_kwarg(name, value)
    module.recompile()
    return module


def write_atomically(path: str | os.PathLike[str], data: bytes) -> Path:
    """Writes ``data`` to a temporary file beside ``path`` and renames it over ``path``."""
    target = Path(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target


class JobBase:
    """What every job object has: the figures of the daemon's last answer (trainerd.v1.Job).
    :class:`Job` (and ``trainerd.aio.Job``) add the calls."""

    def __init__(self, proto: jobs_pb2.Job) -> None:
        self._proto = proto

    # --- Figures ---------------------------------------------------------------------------

    @property
    def proto(self) -> jobs_pb2.Job:
        """The daemon's message (trainerd.v1.Job) as last fetched."""
        return self._proto

    @property
    def id(self) -> str:
        return self._proto.id

    @property
    def error(self) -> str:
        """For a FAILED job, the daemon's reason, e.g. "loss became NaN at epoch 3"."""
        return self._proto.error

    @property
    def spec(self) -> JobSpecView:
        """The spec as the daemon accepted it, defaults filled in (seed, shuffle, device, the
        loss). Its choices read as the names :meth:`Client.submit` takes (``spec.loss ==
        "cross_entropy"``, ``spec.optimizer.kind == "adam"``, ``spec.schedule.kind ==
        "cosine"``, ``spec.precision``, ``spec.priority``, ``spec.engine``,
        ``spec.early_stop_metric``); every other field as trainerd.v1.JobSpec has it
        (``spec.optimizer.learning_rate``). ``spec.proto`` is the message itself."""
        return JobSpecView(self._proto.spec)

    @property
    def dataset(self) -> str:
        return self._proto.spec.dataset

    @property
    def seed(self) -> int:
        return self._proto.spec.seed

    @property
    def device(self) -> str:
        return self._proto.device

    @property
    def owner(self) -> str:
        return self._proto.owner

    @property
    def replicas(self) -> int:
        """The ranks the job trains on, data-parallel (1 for a one-rank job)."""
        return max(1, self._proto.spec.replicas)

    @property
    def global_batch_size(self) -> int:
        """Rows per optimizer step over all the ranks: ``spec.batch_size * replicas``."""
        return self._proto.global_batch_size or self._proto.spec.batch_size * self.replicas

    @property
    def ranks(self) -> list[tuple[int, str, str]]:
        """Where each rank of a data-parallel job ran, as (rank, device, node), rank 0 first;
        empty for a one-rank job or before it starts."""
        return [(r.rank, r.device, r.node) for r in self._proto.ranks]

    @property
    def peer(self) -> tuple[str, str] | None:
        """For a sweep's member that trains whole on a peer (a sweep with ``nodes`` and no
        replicas deals members there): (the peer, the member's job id there, "" until the peer
        took it). The daemon the sweep was sent to follows that job, also across its own
        restarts, and keeps the results and the model here. None for any other job."""
        spec = self._proto.spec
        if spec.replicas > 1 or len(spec.nodes) != 1:
            return None
        there = self._proto.ranks[0].job_id if self._proto.ranks else ""
        return (spec.nodes[0], there)

    @property
    def sweep_id(self) -> str:
        """The sweep it is a member of ("" for a job alone): :meth:`Client.get_sweep` takes it."""
        return self._proto.sweep_id

    @property
    def sweep_member(self) -> int:
        """Its place in its sweep, from 1 (0 for a job alone)."""
        return self._proto.sweep_member

    @property
    def request_id(self) -> str:
        """The request id it was submitted with ("" without one)."""
        return self._proto.request_id

    @property
    def final_loss(self) -> float:
        """The last finished epoch's loss (:attr:`Epoch.loss`: the mean over the rows that
        trained); 0 before the first."""
        return self._proto.final_loss

    @property
    def epochs_completed(self) -> int:
        return self._proto.epochs_completed

    @property
    def stopped_early(self) -> bool:
        return self._proto.stopped_early

    @property
    def model_epoch(self) -> int:
        """The epoch whose weights the trained model holds (``model_from``): the best validation
        epoch or the last; 0 until the job succeeded."""
        return self._proto.model_epoch

    @property
    def best_epoch(self) -> int:
        """The best validation epoch by early stopping's metric (its figures are
        ``history[best_epoch - 1]``), set when the job ends; 0 without validation."""
        return self._proto.best_epoch

    def _checkpoint_list(self) -> list[Checkpoint]:
        return [
            Checkpoint(
                epoch=c.epoch, size_bytes=c.size_bytes, create_time=_timestamp(c, "create_time")
            )
            for c in self._proto.checkpoints
        ]

    @property
    def wall_seconds(self) -> float:
        return self._proto.wall_seconds

    @property
    def steps(self) -> int:
        """Optimizer steps taken (with gradient_accumulation_steps N, one per N batches)."""
        return self._proto.steps

    @property
    def samples_per_second(self) -> float:
        return self._proto.samples_per_second

    @property
    def parameter_count(self) -> int:
        return self._proto.parameter_count

    @property
    def create_time(self) -> datetime.datetime | None:
        return _timestamp(self._proto, "create_time")

    @property
    def start_time(self) -> datetime.datetime | None:
        return _timestamp(self._proto, "start_time")

    @property
    def end_time(self) -> datetime.datetime | None:
        return _timestamp(self._proto, "end_time")

    @property
    def cached_state(self) -> JobState:
        """The state as last fetched (no call)."""
        return JobState.from_proto(self._proto.state)

    def _history(self) -> list[Epoch]:
        return [Epoch.from_proto(e) for e in self._proto.epochs]

    def _parameters(self) -> dict[str, np.ndarray[Any, np.dtype[np.float32]]]:
        return {
            p.name: np.asarray(p.values, dtype=np.float32).reshape(tuple(p.shape))
            for p in self._proto.parameters
        }

    def _history_frame(self, history: list[Epoch]) -> pandas.DataFrame:
        import pandas as pd

        rows = [dataclasses.asdict(e) for e in history]
        columns = [f.name for f in dataclasses.fields(Epoch)]
        frame: pd.DataFrame = pd.DataFrame(rows, columns=columns).set_index("epoch")
        return frame

    def _needs_full(self) -> bool:
        """Whether the figures may be stale or incomplete: the job has not ended, or this is a
        listing's basic view (no epochs)."""
        return not self.cached_state.ended or self._proto.epochs_completed != len(
            self._proto.epochs
        )

    def raise_for_state(self) -> None:
        """Raises JobFailed or JobCancelled when the job ended so (as last fetched)."""
        state = JobState.from_proto(self._proto.state)
        if state == JobState.FAILED:
            raise JobFailed(self)
        if state == JobState.CANCELLED:
            raise JobCancelled(self)

    def __repr__(self) -> str:
        state = JobState.from_proto(self._proto.state).value
        text = f"Job(id={self.id!r}, state={state}, dataset={self.dataset!r}"
        text += f", epochs={self._proto.epochs_completed}/{self._proto.spec.epochs}"
        if self._proto.epochs_completed:
            text += f", final_loss={self._proto.final_loss:.6g}"
        if self._proto.model_epoch and self._proto.model_epoch != self._proto.epochs_completed:
            text += f", model_epoch={self._proto.model_epoch}"
        if self._proto.error:
            text += f", error={self._proto.error!r}"
        return text + ")"

    def _repr_html_(self) -> str:
        """Jupyter's view: the job's state, id, dataset, losses (first, final, best; validation
        loss and accuracy when it validates) and its device report, as of the last answer."""
        return job_html(self)

    def _display(self, progress: DisplayArg, plot: DisplayArg) -> JobDisplay | None:
        """The bar and curve ``progress`` and ``plot`` ask for (see :meth:`Job.watch`)."""
        return job_display(self.id, self._proto.spec.epochs, progress, plot)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Job) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)


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

    # --- Calls -----------------------------------------------------------------------------

    def refresh(self) -> Job:
        """Asks the daemon for the job again (GetJob, every field); returns self."""
        self._proto = self._client._get_job_proto(self.id)  # noqa: SLF001
        return self

    def _full(self) -> None:
        """Makes sure the job is the full view and current unless it ended."""
        if self._needs_full():
            self.refresh()

    def cancel(self) -> Job:
        """Cancels the job if it is queued or running (a running one stops before its next
        step); returns self. FailedPrecondition when it already ended."""
        request = jobs_pb2.CancelJobRequest(id=self.id)
        self._client._ensure_compatible()  # noqa: SLF001
        self._proto = self._client._transport.unary(  # noqa: SLF001
            _JOBS + "CancelJob", request, jobs_pb2.Job
        )
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

    def _follow(self, timeout: float | None, display: JobDisplay | None) -> jobs_pb2.Job | None:
        """Follows the job on a WatchJob stream until it ends, handing each epoch to
        ``display``: the terminal Job event, or None when the stream ended without one.
        DeadlineExceeded when ``timeout`` passes first."""
        transport = self._client._transport  # noqa: SLF001
        self._client._ensure_compatible()  # noqa: SLF001
        stream = transport.unary_stream(
            _JOBS + "WatchJob", jobs_pb2.WatchJobRequest(id=self.id), jobs_pb2.JobEvent,
            timeout=timeout,
        )
        last = 0
        try:
            for event in stream:
                if display is not None:
                    epochs, _ = epochs_of_event(event, last)
                    for epoch in epochs:
                        last = epoch.epoch
                        display.add(epoch)
                if event.HasField("job") and JobState.from_proto(event.job.state).ended:
                    return event.job
        finally:
            stream.cancel()
        return None

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
        start = time.monotonic()
        display = self._display(progress, plot)
        try:
            ended = self._follow(timeout, display)
        except DeadlineExceeded:
            raise TimeoutError(
                f"job '{self.id}' did not end within {timeout:g} s (it goes on)"
            ) from None
        finally:
            if display is not None:
                display.close()
        self.refresh()
        if ended is None and not JobState.from_proto(self._proto.state).ended:
            if timeout is not None and time.monotonic() - start >= timeout:
                raise TimeoutError(f"job '{self.id}' did not end within {timeout:g} s")
            raise TrainerdError(f"the watch of job '{self.id}' ended before the job did")
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
        transport = self._client._transport  # noqa: SLF001
        self._client._ensure_compatible()  # noqa: SLF001
        display = self._display(progress, plot)
        stream = transport.unary_stream(
            _JOBS + "WatchJob", jobs_pb2.WatchJobRequest(id=self.id), jobs_pb2.JobEvent,
            timeout=None,
        )
        last = 0
        try:
            for event in stream:
                epochs, ended = epochs_of_event(event, last)
                for epoch in epochs:
                    last = epoch.epoch
                    if display is not None:
                        display.add(epoch)
                    yield epoch
                if ended:
                    break
        finally:
            stream.cancel()
            if display is not None:
                display.close()
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
        request = download_request(self.id, format)
        receiver = ModelReceiver(self.id, max_bytes)
        transport = self._client._transport  # noqa: SLF001
        self._client._ensure_compatible()  # noqa: SLF001
        deadline = timeout if timeout is not None else max(DOWNLOAD_TIMEOUT, transport.timeout)
        stream = transport.unary_stream(
            _JOBS + "DownloadModel", request, jobs_pb2.ModelChunk, timeout=deadline,
        )
        with stream:  # leaving it (a refusal included) cancels the call
            for chunk in stream:
                receiver.add(chunk)
        return receiver.result()

    def model(self, *, map_location: str = "cpu", max_bytes: int = MAX_MODEL_BYTES) -> Any:
        """The trained model as TorchScript, loaded with ``torch.jit.load`` (in eval mode; its
        forward takes a float32 batch shaped like the dataset's features). Without torch, the
        archive's bytes. ``max_bytes`` as for :meth:`model_bytes`. Warns once per client
        (UserWarning) when this torch's major.minor version is not the daemon's LibTorch's.
        PyTorch deprecates TorchScript: :meth:`module` and :meth:`export` give the same model as
        an ``nn.Module`` and as a ``torch.export`` program."""
        model = load_model(self.model_bytes(max_bytes=max_bytes), map_location)
        self._client._check_torch(stacklevel=2)  # noqa: SLF001
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
        request = jobs_pb2.DownloadCheckpointRequest(id=self.id, epoch=_checkpoint_epoch(epoch))
        receiver = ModelReceiver(self.id, max_bytes, "checkpoint")
        transport = self._client._transport  # noqa: SLF001
        self._client._ensure_compatible()  # noqa: SLF001
        deadline = timeout if timeout is not None else max(DOWNLOAD_TIMEOUT, transport.timeout)
        stream = transport.unary_stream(
            _JOBS + "DownloadCheckpoint", request, jobs_pb2.ModelChunk, timeout=deadline
        )
        with stream:  # leaving it (a refusal included) cancels the call
            for chunk in stream:
                receiver.add(chunk)
        return receiver.result()

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
            self._held_out_dataset_rows(rows), self.spec.validation_fraction, self.seed
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
