"""The asyncio client: :class:`trainerd.Client`'s API on grpc.aio, every call a coroutine.

Example::

    import asyncio, trainerd.aio

    async def main() -> None:
        async with trainerd.aio.Client("127.0.0.1:50051") as client:
            ds = await client.upload("seed", X, y)
            job = await client.submit(ds, model="linear:1", lr=0.1, epochs=20)
            async for epoch in job.watch():
                print(epoch.epoch, epoch.loss)
            await job.wait()
            model = await job.model()

    asyncio.run(main())

The objects differ from the synchronous ones only where a property would have to call the daemon:
here ``job.state``, ``job.history``, ``job.report`` and ``job.parameters`` are those of the last
answer (``await job.refresh()`` asks again; ``wait`` and ``watch`` leave the job current).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import numpy as np

from trainerd import _calls, _download, _export, _health, _submit, _upload
from trainerd._connection import ClientBase, Connection, Version
from trainerd._display import DisplayArg
from trainerd._download import MAX_CHECKPOINT_BYTES, MAX_MODEL_BYTES
from trainerd._jobbase import Checkpoint, Epoch, EpochFeed, JobBase, JobState
from trainerd._models import (
    StateDict,
    export_program,
    load_into,
    load_model,
    parse_state_dict,
    write_atomically,
)
from trainerd._progress import ProgressArg
from trainerd._rpc import Op
from trainerd.search import Distribution
from trainerd._spec import given_options
from trainerd._split import held_out_rows
from trainerd._transport import AioTransport
from trainerd.client import DatasetArg
from trainerd.config import Settings
from trainerd.datasets import DatasetBase
from trainerd.errors import TrainerdError
from trainerd.sweeps import SweepBase
from trainerd.v1 import datasets_pb2, jobs_pb2, system_pb2

if TYPE_CHECKING:
    import pandas
    from typing_extensions import Unpack

    from trainerd._spec import SpecOptions, SweepOptions

__all__ = ["Client", "Dataset", "Job", "Sweep"]

P = ParamSpec("P")
T = TypeVar("T")


class Dataset(DatasetBase):
    """A dataset the daemon holds (see :class:`trainerd.Dataset`); the calls are coroutines."""

    def __init__(self, client: Client, proto: datasets_pb2.Dataset) -> None:
        super().__init__(proto)
        self._client = client

    async def refresh(self) -> Dataset:
        self._proto = (await self._client.dataset(self.name)).proto
        return self

    async def delete(self) -> None:
        await self._client.delete_dataset(self.name)

    async def share(self, shared: bool = True) -> Dataset:
        self._proto = (await self._client.share_dataset(self.name, shared)).proto
        return self


class Job(JobBase):
    """A training job (see :class:`trainerd.Job`); the calls are coroutines, and the figures are
    those of the last answer."""

    def __init__(self, client: Client, proto: jobs_pb2.Job) -> None:
        super().__init__(proto)
        self._client = client
        self._call = client._call  # noqa: SLF001 (runs an operation on the client's transport)

    @property
    def state(self) -> JobState:
        """The state as last fetched (``await job.refresh()`` asks again)."""
        return self.cached_state

    @property
    def ended(self) -> bool:
        return self.cached_state.ended

    @property
    def report(self) -> jobs_pb2.DeviceReport:
        return self._proto.report

    @property
    def history(self) -> list[Epoch]:
        """The epochs of the last full answer (GetJob, or the end of wait and watch)."""
        return self._history()

    @property
    def parameters(self) -> dict[str, np.ndarray[Any, np.dtype[np.float32]]]:
        return self._parameters()

    def history_frame(self) -> pandas.DataFrame:
        return self._history_frame(self.history)
    async def refresh(self) -> Job:
        await self._call(_calls.refresh, self)
        return self

    async def _full(self) -> None:
        """Fetches the job whole unless it ended and is already (a listing's view is not)."""
        if self._needs_full():
            await self.refresh()

    async def _model_files(self, log_model: bool) -> Callable[[str], bytes] | None:
        """What :meth:`to_mlflow` logs of the model, downloaded beforehand."""
        if not log_model or self.cached_state != JobState.SUCCEEDED:
            return None
        models: dict[str, bytes | TrainerdError] = {"torchscript": await self.model_bytes()}
        try:
            models["safetensors"] = await self.model_bytes(format="safetensors")
        except TrainerdError as e:
            models["safetensors"] = e
        return _export.prefetched(models)

    async def to_tensorboard(
        self, logdir: str | os.PathLike[str], *, run_name: str | None = None
    ) -> Path:
        """Writes the job as a TensorBoard run (see :meth:`trainerd.Job.to_tensorboard`), after
        fetching it whole unless it ended; the files are written in a worker thread."""
        await self._full()
        run_dir = Path(logdir) / (run_name or self.id)
        return await asyncio.to_thread(_export.write_tensorboard, self, self.history, run_dir)

    async def to_mlflow(
        self,
        experiment: str | None = None,
        run_name: str | None = None,
        tracking_uri: str | None = None,
        log_model: bool = True,
    ) -> str:
        """Logs the job as an MLflow run (see :meth:`trainerd.Job.to_mlflow`), after fetching it
        whole unless it ended and downloading its model files; MLflow's calls run in a worker
        thread. Returns the run's id."""
        await self._full()
        fetch = await self._model_files(log_model)
        export = _export.MlflowExport(tracking_uri)
        experiment_id, parent = export.place(experiment, None)  # the active run is this thread's
        return await asyncio.to_thread(
            lambda: export.log_job(
                self,
                self.history,
                experiment_id=experiment_id,
                run_name=run_name or self.id,
                parent_run_id=parent,
                fetch_model=fetch,
            )
        )

    async def cancel(self) -> Job:
        self._proto = await self._call(_calls.cancel_job, self.id)
        return self

    async def delete(self) -> None:
        await self._client.delete_job(self.id)

    async def wait(
        self,
        timeout: float | None = None,
        *,
        check: bool = True,
        progress: DisplayArg = None,
        plot: DisplayArg = None,
    ) -> Job:
        """Waits until the job ends (see :meth:`trainerd.Job.wait`), showing the bar and curve
        ``progress`` and ``plot`` ask for (see :meth:`trainerd.Job.watch`)."""
        await self._call(_calls.wait, self, timeout, self._display(progress, plot))
        if check:
            self.raise_for_state()
        return self

    async def watch(
        self, *, progress: DisplayArg = None, plot: DisplayArg = None
    ) -> AsyncIterator[Epoch]:
        """Yields each epoch as the daemon reduces it, with the bar and curve ``progress`` and
        ``plot`` ask for (see :meth:`trainerd.Job.watch`)."""
        await self._call(Connection.ready)
        feed = EpochFeed(self._display(progress, plot))
        stream = self._client._transport.stream(_calls.watch(self.id, None))  # noqa: SLF001
        try:
            async for event in stream:
                for epoch in feed.take(event):
                    yield epoch
                if feed.ended:
                    break
        finally:
            await stream.aclose()
            feed.close()
        await self.refresh()

    async def model_bytes(
        self,
        *,
        timeout: float | None = None,
        max_bytes: int = MAX_MODEL_BYTES,
        format: str = "torchscript",
    ) -> bytes:
        """The trained model's bytes in ``format``, as :meth:`trainerd.Job.model_bytes`."""
        return await self._call(_download.model_bytes, self.id, format, max_bytes, timeout)

    async def model(self, *, map_location: str = "cpu", max_bytes: int = MAX_MODEL_BYTES) -> Any:
        """The trained model via torch.jit.load (the archive's bytes without torch)."""
        model = load_model(await self.model_bytes(max_bytes=max_bytes), map_location)
        await self._call(Connection.check_torch)
        return model

    async def state_dict(self, *, max_bytes: int = MAX_MODEL_BYTES) -> StateDict:
        """The trained weights (see :meth:`trainerd.Job.state_dict`)."""
        return parse_state_dict(await self.model_bytes(max_bytes=max_bytes, format="safetensors"))

    async def module(self, module: Any = None, *, max_bytes: int = MAX_MODEL_BYTES) -> Any:
        """The trained model as an ``nn.Module`` (see :meth:`trainerd.Job.module`)."""
        return load_into(self.id, await self.state_dict(max_bytes=max_bytes), module)

    async def export(
        self, path: str | os.PathLike[str], module: Any = None, *, max_bytes: int = MAX_MODEL_BYTES
    ) -> Path:
        """The trained model saved as a ``.pt2`` program (see :meth:`trainerd.Job.export`)."""
        state = await self.state_dict(max_bytes=max_bytes)
        return export_program(load_into(self.id, state, module), state.feature_shape, path)

    async def save_model(
        self, path: str | os.PathLike[str], *, max_bytes: int = MAX_MODEL_BYTES
    ) -> Path:
        return write_atomically(path, await self.model_bytes(max_bytes=max_bytes))

    async def checkpoints(self) -> list[Checkpoint]:
        """The checkpoints written so far, oldest first (see :meth:`trainerd.Job.checkpoints`)."""
        await self.refresh()
        return self._checkpoint_list()

    async def checkpoint_bytes(
        self,
        epoch: int | None = None,
        *,
        timeout: float | None = None,
        max_bytes: int = MAX_CHECKPOINT_BYTES,
    ) -> bytes:
        """A checkpoint's file, ``epoch``'s or the newest (see
        :meth:`trainerd.Job.checkpoint_bytes`)."""
        return await self._call(_download.checkpoint_bytes, self.id, epoch, max_bytes, timeout)

    async def checkpoint(
        self,
        epoch: int | None = None,
        *,
        path: str | os.PathLike[str],
        max_bytes: int = MAX_CHECKPOINT_BYTES,
    ) -> Path:
        """Downloads a checkpoint to ``path`` (see :meth:`trainerd.Job.checkpoint`)."""
        return write_atomically(path, await self.checkpoint_bytes(epoch, max_bytes=max_bytes))

    async def validation_rows(
        self, rows: int | None = None
    ) -> np.ndarray[Any, np.dtype[np.int64]]:
        """The rows the job held out for validation (see :meth:`trainerd.Job.validation_rows`)."""
        if not self.spec.validation_fraction > 0:
            raise ValueError(f"job '{self.id}' holds no rows out (it has no validation_fraction)")
        if rows is None:
            rows = (await self._client.dataset(self.dataset)).rows
        return held_out_rows(rows, self.spec.validation_fraction, self.split_seed)


class Sweep(SweepBase[Job]):
    """A sweep's members (see :class:`trainerd.Sweep`); :meth:`best` and :meth:`frame` use the
    members' last answers, which :meth:`wait` leaves current."""

    def __init__(self, client: Client, sweep_id: str, jobs: list[Job]) -> None:
        super().__init__(sweep_id, jobs)
        self._client = client
        self._call = client._call  # noqa: SLF001 (runs an operation on the client's transport)

    @property
    def ended(self) -> bool:
        return all(job.cached_state.ended for job in self.jobs)

    async def refresh(self) -> Sweep:
        await self._call(_calls.refresh_all, self.jobs)
        return self

    async def to_tensorboard(self, logdir: str | os.PathLike[str]) -> list[Path]:
        """Writes every member as a TensorBoard run (see :meth:`trainerd.Sweep.to_tensorboard`)."""
        return [
            await job.to_tensorboard(logdir, run_name=name)
            for job, name in zip(self.jobs, self._run_names())
        ]

    async def to_mlflow(
        self,
        experiment: str | None = None,
        run_name: str | None = None,
        tracking_uri: str | None = None,
        log_model: bool = True,
    ) -> str:
        """Logs the sweep as an MLflow parent run with a nested run per member (see
        :meth:`trainerd.Sweep.to_mlflow`), after fetching the members whole and downloading
        their model files; MLflow's calls run in a worker thread. Returns the parent's id."""
        fetchers = []
        for job in self.jobs:
            await job._full()  # noqa: SLF001
            fetchers.append(await job._model_files(log_model))  # noqa: SLF001
        histories = [job.history for job in self.jobs]
        export = _export.MlflowExport(tracking_uri)
        experiment_id, parent = export.place(experiment, None)
        return await asyncio.to_thread(
            lambda: export.log_sweep(
                self,
                histories,
                fetchers,
                experiment_id=experiment_id,
                run_name=run_name or self.id,
                parent_run_id=parent,
            )
        )

    async def wait(
        self,
        timeout: float | None = None,
        *,
        progress: DisplayArg = None,
        plot: DisplayArg = None,
    ) -> Sweep:
        """Waits until every member ended; a failed member does not raise. ``progress`` and
        ``plot`` are :meth:`trainerd.Sweep.wait`'s."""
        await self._call(_calls.wait_sweep, self, timeout, self._display(progress, plot))
        return self


class Client(ClientBase[AioTransport]):
    """A connection to one trainerd daemon on grpc.aio: :class:`trainerd.Client`'s API with every
    call a coroutine (settings resolved the same way)."""

    def _connect(self, settings: Settings, timeout: float) -> AioTransport:
        return AioTransport(settings, timeout)

    async def _call(
        self,
        operation: Callable[Concatenate[Connection, P], Op[T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Runs ``operation`` of the request layer, with this client's connection, to its result."""
        return await self._transport.run(operation(self._connection, *args, **kwargs))

    async def close(self) -> None:
        await self._transport.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"trainerd.aio.Client(address={self.address!r})"

    # --- System ----------------------------------------------------------------------------

    async def version(self) -> Version:
        return await self._call(Connection.version)

    async def devices(self) -> list[system_pb2.DeviceStatus]:
        return await self._call(_calls.devices)

    async def diagnose(
        self, *, refresh: bool = False, timeout: float | None = None
    ) -> system_pb2.DiagnoseResponse:
        return await self._call(_calls.diagnose, refresh, timeout)

    async def health(self, service: str = "") -> str:
        return await self._transport.run(_health.check(service))

    # --- Datasets --------------------------------------------------------------------------

    async def upload(
        self,
        name: str,
        X: Any,
        y: Any = None,
        *,
        target: Any = None,
        target_dtype: object = None,
        target_columns: int | None = None,
        progress: ProgressArg = None,
        timeout: float | None = None,
        exist_ok: bool = False,
        overwrite: bool = False,
    ) -> Dataset:
        """Uploads a dataset (see :meth:`trainerd.Client.upload`, ``exist_ok`` and
        ``overwrite`` included). The checks and the reading of the data run in a worker thread,
        so the event loop stays free."""
        options = (target, target_dtype, target_columns, progress, timeout, exist_ok, overwrite)
        return Dataset(self, await self._call(_upload.upload, name, X, y, *options))

    async def datasets(self) -> list[Dataset]:
        return [Dataset(self, d) for d in await self._call(_calls.datasets)]

    async def dataset(self, name: str) -> Dataset:
        return Dataset(self, await self._call(_calls.dataset, name))

    async def delete_dataset(self, name: DatasetArg | Dataset) -> None:
        await self._call(_calls.delete_dataset, name)

    async def share_dataset(self, name: DatasetArg | Dataset, shared: bool = True) -> Dataset:
        return Dataset(self, await self._call(_calls.share_dataset, name, shared))

    # --- Jobs ------------------------------------------------------------------------------

    async def submit(
        self,
        dataset: DatasetArg | Dataset,
        *,
        model: Any,
        request_id: str | None = None,
        **options: Unpack[SpecOptions],
    ) -> Job:
        """Submits a job; the keyword arguments are :meth:`trainerd.Client.submit`'s."""
        given = given_options(dict(options), {})
        return Job(self, await self._call(_submit.submit, dataset, model, given, request_id))

    async def job(self, job_id: str) -> Job:
        return Job(self, await self._call(_calls.job, job_id))

    async def jobs(
        self,
        state: str | JobState | None = None,
        dataset: DatasetArg | Dataset | None = None,
        limit: int | None = None,
        sweep: str | None = None,
    ) -> list[Job]:
        found = await self._call(_calls.jobs, state, dataset, limit, sweep)
        return [Job(self, proto) for proto in found]

    async def get_sweep(self, sweep_id: str) -> Sweep:
        """The sweep with id ``sweep_id``, its members in order (see
        :meth:`trainerd.Client.get_sweep`)."""
        members = await self._call(_calls.get_sweep, sweep_id)
        return Sweep(self, sweep_id, [Job(self, proto) for proto in members])

    async def delete_job(self, job_id: str | Job) -> None:
        await self._call(_calls.delete_job, job_id.id if isinstance(job_id, Job) else job_id)

    async def sweep(
        self,
        dataset: DatasetArg | Dataset,
        *,
        model: str,
        lr: float | list[float] | tuple[float, ...] = 0.01,
        momentum: float | list[float] | tuple[float, ...] | None = None,
        weight_decay: float | list[float] | tuple[float, ...] | None = None,
        seed: int | list[int] | tuple[int, ...] | None = None,
        points: Sequence[Mapping[str, Any]] | None = None,
        request_id: str | None = None,
        search: Mapping[str, Distribution] | None = None,
        trials: int | None = None,
        search_seed: int | None = None,
        **options: Unpack[SweepOptions],
    ) -> Sweep:
        """Submits a sweep (see :meth:`trainerd.Client.sweep`)."""
        request = _submit.sweep_request(
            dataset, model, lr, momentum, weight_decay, seed, options, points, request_id,
            search, trials, search_seed,
        )
        response = await self._call(_submit.sweep, request)
        return Sweep(self, response.sweep_id, [Job(self, m) for m in response.members])
