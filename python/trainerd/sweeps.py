"""Hyperparameter sweeps: what :meth:`trainerd.Client.sweep` returns. :class:`SweepBase` is what
both clients' sweeps have; :class:`Sweep` is the synchronous client's, whose calls block (the
operations of :mod:`trainerd._calls`, run on the client's transport)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from trainerd import _calls, _export
from trainerd._calls import POLL_SECONDS as POLL_SECONDS  # noqa: PLC0414 (trainerd.sweeps's)
from trainerd._display import DisplayArg, SweepDisplay, sweep_display, sweep_html
from trainerd._jobbase import Epoch, JobBase, JobState
from trainerd.errors import TrainerdError
from trainerd.jobs import Job

if TYPE_CHECKING:
    import pandas

    from trainerd.client import Client

__all__ = ["Sweep", "SweepBase"]

JobT = TypeVar("JobT", bound=JobBase)


class SweepBase(Generic[JobT]):
    """What every sweep object has: its id, its members and the rankings of their results.
    :class:`Sweep` (and ``trainerd.aio.Sweep``) add the calls."""

    def __init__(self, sweep_id: str, jobs: Sequence[JobT]) -> None:
        self.id = sweep_id
        self.jobs: list[JobT] = list(jobs)
        #: What :meth:`best` ranked by: "validation_loss" when the members validate (a
        #: validation fraction or dataset), else "loss" (the final training loss).
        self.best_metric = "validation_loss" if self._validates() else "loss"

    def _validates(self) -> bool:
        if not self.jobs:
            return False
        spec = self.jobs[0].spec
        return spec.validation_fraction > 0 or bool(spec.validation_dataset)

    def _state(self, job: JobT) -> JobState:
        return job.cached_state

    def _member_history(self, job: JobT) -> list[Epoch]:
        return job._history()  # noqa: SLF001

    @property
    def succeeded(self) -> list[JobT]:
        return [job for job in self.jobs if self._state(job) == JobState.SUCCEEDED]

    @property
    def failed(self) -> list[JobT]:
        return [job for job in self.jobs if self._state(job) == JobState.FAILED]

    def _score(self, job: JobT) -> float | None:
        history = self._member_history(job)
        if not history:
            return None
        if self.best_metric == "validation_loss":
            return history[-1].validation_loss
        return history[-1].loss

    def epochs_saved(self) -> int:
        """The epochs the members that stopped early (by halving's rungs or their patience) did
        not train: the sum of each one's planned epochs less those it trained."""
        return sum(
            max(0, job.spec.epochs - job.epochs_completed)
            for job in self.succeeded
            if job.stopped_early
        )

    def best(self) -> JobT:
        """The succeeded member with the lowest final validation loss when the members validate,
        else the lowest final training loss (:attr:`best_metric` says which). ValueError when no
        member succeeded."""
        scored = [
            (score, index, job)
            for index, job in enumerate(self.succeeded)
            if (score := self._score(job)) is not None
        ]
        if not scored:
            raise ValueError(f"no member of sweep '{self.id}' succeeded")
        return min(scored, key=lambda item: (item[0], item[1]))[2]

    def frame(self) -> pandas.DataFrame:
        """One row per member: its swept values, state and results (needs pandas)."""
        import pandas as pd

        rows: list[dict[str, Any]] = []
        for job in self.jobs:
            spec = job.spec
            history = self._member_history(job)
            last = history[-1] if history else None
            rows.append(
                {
                    "id": job.id,
                    "state": self._state(job).value,
                    "lr": spec.optimizer.learning_rate,
                    "momentum": spec.optimizer.momentum,
                    "weight_decay": (
                        spec.optimizer.weight_decay
                        if spec.optimizer.HasField("weight_decay")
                        else None
                    ),
                    "seed": spec.seed,
                    "model": spec.model,
                    "batch_size": spec.batch_size,
                    "epochs": job.epochs_completed,
                    "loss": last.loss if last else None,
                    "validation_loss": last.validation_loss if last else None,
                    "validation_accuracy": last.validation_accuracy if last else None,
                    "wall_seconds": job.wall_seconds,
                    "error": job.error,
                    "stop_reason": job.stop_reason,
                }
            )
        frame: pd.DataFrame = pd.DataFrame(rows).set_index("id")
        return frame

    def _run_names(self) -> list[str]:
        """Each member's run name: its number in the sweep (zero-padded) and its id."""
        width = len(str(len(self.jobs)))
        return [
            f"{job.sweep_member or index:0{width}d}-{job.id}"
            for index, job in enumerate(self.jobs, 1)
        ]

    def _repr_html_(self) -> str:
        """Jupyter's view: one row per member (swept values, state, epochs, results), the best
        member (as :meth:`best` ranks them) marked, as of the members' last answers."""
        return sweep_html(self)

    def _display(self, progress: DisplayArg, plot: DisplayArg) -> SweepDisplay | None:
        """The bar (all members' epochs) and curve (each member's :attr:`best_metric`) that
        ``progress`` and ``plot`` ask for (see :meth:`Sweep.wait`)."""
        return sweep_display(self, progress, plot)

    def __len__(self) -> int:
        return len(self.jobs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, members={len(self.jobs)})"


class Sweep(SweepBase[Job]):
    """The members of one sweep (one Job each, in product order: learning rates outermost, then
    momenta, weight decays, and seeds innermost; or in the order of its ``points``).

    Example::

        sweep = client.sweep("houses", model="linear:1", lr=[0.1, 0.03, 0.01], seed=[1, 2])
        sweep.wait()
        best = sweep.best()            # by validation loss when the members validate
        print(best.id, sweep.best_metric, sweep.frame())
    """

    def __init__(self, client: Client, sweep_id: str, jobs: list[Job]) -> None:
        super().__init__(sweep_id, jobs)
        self._client = client
        self._call = client._call  # noqa: SLF001 (runs an operation on the client's transport)

    def _state(self, job: Job) -> JobState:
        return job.state  # asked again while the member runs

    def _member_history(self, job: Job) -> list[Epoch]:
        return job.history

    def refresh(self) -> Sweep:
        """Asks the daemon for every member again; returns self."""
        self._call(_calls.refresh_all, self.jobs)
        return self

    @property
    def ended(self) -> bool:
        return all(job.state.ended for job in self.jobs)

    def _repr_html_(self) -> str:
        # The members current (full views, unless they ended and were fetched whole); their last
        # answers when the daemon cannot be asked: a view must not raise.
        try:
            for job in self.jobs:
                if job._needs_full():  # noqa: SLF001
                    job.refresh()
        except TrainerdError:
            pass
        return sweep_html(self)

    def wait(
        self,
        timeout: float | None = None,
        *,
        progress: DisplayArg = None,
        plot: DisplayArg = None,
    ) -> Sweep:
        """Blocks until every member ended (members that train as one pack end together), then
        returns self. A member that failed does not raise: see :attr:`failed` (a diverging
        learning rate is a normal outcome of a sweep). :class:`TimeoutError` when ``timeout``
        seconds pass first.

        ``progress``: a tqdm bar over all the members' epochs, with how many ended and the best
        figure so far; None (the default) draws one in Jupyter or when stderr is a terminal and
        tqdm is installed, True anyway (with tqdm), False never. ``plot``: each member's
        :attr:`best_metric` by epoch, redrawn in place, the leading member's line emphasised;
        None draws it in a Jupyter kernel when matplotlib is installed, True wherever IPython
        and matplotlib are, False never. While either shows, the members are asked again every
        0.4 s."""
        self._call(_calls.wait_sweep, self, timeout, self._display(progress, plot))
        return self

    def to_tensorboard(self, logdir: str | os.PathLike[str]) -> list[Path]:
        """Writes every member as a TensorBoard run (:meth:`Job.to_tensorboard`) named by its
        number (zero-padded to the members' count) and id (``logdir/1-job-…``), so that
        TensorBoard's runs selector compares their curves and the HParams dashboard tables their
        hyperparameters and final figures (``pip install 'trainerd[tensorboard]'``). Returns the
        runs' directories, in member order."""
        return [
            job.to_tensorboard(logdir, run_name=name)
            for job, name in zip(self.jobs, self._run_names())
        ]

    def to_mlflow(
        self,
        experiment: str | None = None,
        run_name: str | None = None,
        tracking_uri: str | None = None,
        log_model: bool = True,
    ) -> str:
        """Logs the sweep as an MLflow parent run (named ``run_name`` or the sweep id; tags
        ``trainerd.sweep_id``, ``trainerd.members``, and ``trainerd.best_job_id`` with
        ``trainerd.best_metric`` when a member succeeded) with one nested run per member, as
        :meth:`Job.to_mlflow` logs a job, named by the member's number and id (``pip install
        'trainerd[mlflow]'``). ``experiment`` and ``tracking_uri`` as there. Returns the parent
        run's id."""
        histories = [job.history for job in self.jobs]  # every member full and current
        export = _export.MlflowExport(tracking_uri)
        experiment_id, parent = export.place(experiment, None)
        fetchers = [
            job._model_fetcher() if log_model else None  # noqa: SLF001
            for job in self.jobs
        ]
        return export.log_sweep(
            self,
            histories,
            fetchers,
            experiment_id=experiment_id,
            run_name=run_name or self.id,
            parent_run_id=parent,
        )
