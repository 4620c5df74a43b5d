"""What every job object has, whichever client made it: the figures of the daemon's last answer
(:class:`JobBase`, on trainerd.v1.Job), the job's :class:`JobState`, its finished epochs
(:class:`Epoch`) and checkpoints (:class:`Checkpoint`), and the epochs a WatchJob stream carries
(:class:`EpochFeed`). :class:`trainerd.Job` and ``trainerd.aio.Job`` add the calls."""

from __future__ import annotations

import dataclasses
import datetime
import enum
from typing import TYPE_CHECKING, Any

import numpy as np

from trainerd._display import DisplayArg, JobDisplay, job_display, job_html
from trainerd._spec_view import JobSpecView
from trainerd.errors import JobCancelled, JobFailed
from trainerd.v1 import jobs_pb2

if TYPE_CHECKING:
    import pandas

__all__ = ["Checkpoint", "Epoch", "EpochFeed", "JobBase", "JobState", "epochs_of_event"]


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
    :meth:`trainerd.Job.checkpoint` downloads it."""

    epoch: int
    size_bytes: int
    create_time: datetime.datetime | None


class EpochFeed:
    """The epochs of a WatchJob stream as a caller takes them: each once and in order (from
    :func:`epochs_of_event`), also handed to ``display`` when there is one."""

    def __init__(self, display: JobDisplay | None) -> None:
        self.display = display
        self.last = 0
        self.ended = False

    def take(self, event: jobs_pb2.JobEvent) -> list[Epoch]:
        """The new epochs ``event`` carries; :attr:`ended` says whether it ended the job."""
        epochs, self.ended = epochs_of_event(event, self.last)
        for epoch in epochs:
            self.last = epoch.epoch
            if self.display is not None:
                self.display.add(epoch)
        return epochs

    def close(self) -> None:
        if self.display is not None:
            self.display.close()


class JobBase:
    """What every job object has: the figures of the daemon's last answer (trainerd.v1.Job).
    :class:`trainerd.Job` (and ``trainerd.aio.Job``) add the calls."""

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
        loss). Its choices read as the names :meth:`trainerd.Client.submit` takes (``spec.loss ==
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
    def split_seed(self) -> int:
        """The seed of the job's validation split: ``validation_split_seed`` when it has one (a
        sweep's members all have the sweep's), else its :attr:`seed`."""
        spec = self._proto.spec
        return spec.validation_split_seed if spec.HasField("validation_split_seed") else spec.seed

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
        """The sweep it is a member of ("" for a job alone): :meth:`trainerd.Client.get_sweep`
        takes it."""
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
    def stop_reason(self) -> str:
        """Why the job stopped early (:attr:`stopped_early`): the patience, or the rung of its
        sweep's halving and the cutoff it was behind; "" otherwise."""
        return self._proto.stop_reason

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
        """The bar and curve ``progress`` and ``plot`` ask for (see :meth:`trainerd.Job.watch`)."""
        return job_display(self.id, self._proto.spec.epochs, progress, plot)

    def __eq__(self, other: object) -> bool:
        # Equal to a trainerd.Job (the synchronous client's) of the same id.
        from trainerd.jobs import Job  # noqa: PLC0415 (jobs.py builds on this module)

        return isinstance(other, Job) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)
