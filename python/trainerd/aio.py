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
import contextlib
import os
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio
import numpy as np
from google.protobuf.message import Message

from trainerd import _health
from trainerd._split import held_out_rows
from trainerd._display import DisplayArg, JobDisplay, SweepDisplay
from trainerd._optional import torch_mismatch, warn_torch_mismatch
from trainerd._progress import ProgressArg, make_progress
from trainerd._transport import MAX_RECEIVE_MESSAGE_BYTES, MAX_SEND_MESSAGE_BYTES, _serialize
from trainerd._upload import prepare_payload, validate_dataset_name
from trainerd._version import __version__
from trainerd._spec import needs_feature_shape
from trainerd.client import (
    DEFAULT_TIMEOUT,
    DIAGNOSE_TIMEOUT,
    UPLOAD_TIMEOUT,
    DatasetArg,
    Version,
    _check_timeout,
    _given,
    _serialize_upload,
    check_replace_flags,
    checked_version,
    keep_existing,
    list_jobs_request,
    not_trainerd,
    ordered_jobs,
    page_size,
    submit_request,
    sweep_request,
    upload_requests,
    version_of,
)
from trainerd.config import Settings, resolve_settings
from trainerd.datasets import DatasetBase
from trainerd.errors import (
    DeadlineExceeded,
    NotFound,
    TrainerdError,
    Unimplemented,
    error_from_rpc,
)
from trainerd.jobs import (
    DOWNLOAD_TIMEOUT,
    MAX_CHECKPOINT_BYTES,
    MAX_MODEL_BYTES,
    Checkpoint,
    Epoch,
    JobBase,
    JobState,
    ModelReceiver,
    _checkpoint_epoch,
    download_request,
    epochs_of_event,
    load_model,
    write_atomically,
)
from trainerd._models import StateDict, export_program, load_into, parse_state_dict
from trainerd.sweeps import SweepBase
from trainerd.v1 import datasets_pb2, jobs_pb2, system_pb2

if TYPE_CHECKING:
    import pandas
    from typing_extensions import Unpack

    from trainerd._spec import SpecOptions, SweepOptions

__all__ = ["Client", "Dataset", "Job", "Sweep"]

_DATASETS = "/trainerd.v1.DatasetService/"
_JOBS = "/trainerd.v1.JobService/"
_SYSTEM = "/trainerd.v1.SystemService/"


class _Transport:
    """The grpc.aio channel and the calls on it (the asyncio twin of trainerd._transport)."""

    def __init__(self, settings: Settings, timeout: float) -> None:
        self.settings = settings
        self.address = settings.address
        self.timeout = timeout
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", MAX_RECEIVE_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_SEND_MESSAGE_BYTES),
            ("grpc.primary_user_agent", f"trainerd-python-aio/{__version__}"),
        ]
        self.channel: Any
        if settings.use_tls:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=settings.tls_ca_pem,
                private_key=settings.tls_key_pem,
                certificate_chain=settings.tls_cert_pem,
            )
            if settings.tls_server_name:
                options.append(("grpc.ssl_target_name_override", settings.tls_server_name))
            self.channel = grpc.aio.secure_channel(settings.address, credentials, options=options)
        else:
            self.channel = grpc.aio.insecure_channel(settings.address, options=options)
        self.metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {settings.token}"),) if settings.token else ()
        )

    def error(
        self, error: grpc.RpcError, timeout: float | None, had_replies: bool = False
    ) -> TrainerdError:
        return error_from_rpc(
            error,
            address=self.address,
            timeout=timeout,
            uses_tls=self.settings.use_tls,
            has_token=bool(self.settings.token),
            has_certificate=self.settings.tls_cert_pem is not None,
            had_replies=had_replies,
        )

    async def unary(
        self,
        method: str,
        request: Message,
        response_type: Any,
        *,
        timeout: float | None = -1.0,
    ) -> Any:
        deadline = self.timeout if timeout is not None and timeout < 0 else timeout
        call = self.channel.unary_unary(
            method, request_serializer=_serialize, response_deserializer=response_type.FromString
        )
        try:
            return await call(request, timeout=deadline, metadata=self.metadata)
        except grpc.RpcError as e:
            raise self.error(e, deadline) from None

    async def raw_unary(self, method: str, request: bytes, *, timeout: float | None) -> bytes:
        call = self.channel.unary_unary(method)
        try:
            response = await call(request, timeout=timeout, metadata=self.metadata)
        except grpc.RpcError as e:
            raise self.error(e, timeout) from None
        assert isinstance(response, bytes)
        return response

    async def stream(
        self, method: str, request: Message, response_type: Any, *, timeout: float | None
    ) -> AsyncGenerator[Any, None]:
        """The messages of a server-streaming call; the call ends when the iteration does."""
        call = self.channel.unary_stream(
            method, request_serializer=_serialize, response_deserializer=response_type.FromString
        )(request, timeout=timeout, metadata=self.metadata)
        had_replies = False
        try:
            async for message in call:
                had_replies = True
                yield message
        except grpc.RpcError as e:
            raise self.error(e, timeout, had_replies) from None
        finally:
            call.cancel()


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
        self._proto = await self._client._get_job_proto(self.id)  # noqa: SLF001
        return self

    async def cancel(self) -> Job:
        await self._client._ensure_compatible()  # noqa: SLF001
        self._proto = await self._client._transport.unary(  # noqa: SLF001
            _JOBS + "CancelJob", jobs_pb2.CancelJobRequest(id=self.id), jobs_pb2.Job
        )
        return self

    async def delete(self) -> None:
        await self._client.delete_job(self.id)

    async def _follow(
        self, timeout: float | None, display: JobDisplay | None
    ) -> jobs_pb2.Job | None:
        """Follows the job on a WatchJob stream until it ends, handing each epoch to
        ``display`` (see :meth:`trainerd.Job._follow`)."""
        await self._client._ensure_compatible()  # noqa: SLF001
        stream = self._client._transport.stream(  # noqa: SLF001
            _JOBS + "WatchJob", jobs_pb2.WatchJobRequest(id=self.id), jobs_pb2.JobEvent,
            timeout=timeout,
        )
        last = 0
        try:
            async for event in stream:
                if display is not None:
                    epochs, _ = epochs_of_event(event, last)
                    for epoch in epochs:
                        last = epoch.epoch
                        display.add(epoch)
                if event.HasField("job") and JobState.from_proto(event.job.state).ended:
                    ended: jobs_pb2.Job = event.job
                    return ended
        finally:
            await stream.aclose()
        return None

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
        start = time.monotonic()
        display = self._display(progress, plot)
        try:
            ended = await self._follow(timeout, display)
        except DeadlineExceeded:
            raise TimeoutError(
                f"job '{self.id}' did not end within {timeout:g} s (it goes on)"
            ) from None
        finally:
            if display is not None:
                display.close()
        await self.refresh()
        if ended is None and not self.cached_state.ended:
            if timeout is not None and time.monotonic() - start >= timeout:
                raise TimeoutError(f"job '{self.id}' did not end within {timeout:g} s")
            raise TrainerdError(f"the watch of job '{self.id}' ended before the job did")
        if check:
            self.raise_for_state()
        return self

    async def watch(
        self, *, progress: DisplayArg = None, plot: DisplayArg = None
    ) -> AsyncIterator[Epoch]:
        """Yields each epoch as the daemon reduces it, with the bar and curve ``progress`` and
        ``plot`` ask for (see :meth:`trainerd.Job.watch`)."""
        await self._client._ensure_compatible()  # noqa: SLF001
        display = self._display(progress, plot)
        stream = self._client._transport.stream(  # noqa: SLF001
            _JOBS + "WatchJob", jobs_pb2.WatchJobRequest(id=self.id), jobs_pb2.JobEvent,
            timeout=None,
        )
        last = 0
        try:
            async for event in stream:
                epochs, ended = epochs_of_event(event, last)
                for epoch in epochs:
                    last = epoch.epoch
                    if display is not None:
                        display.add(epoch)
                    yield epoch
                if ended:
                    break
        finally:
            await stream.aclose()
            if display is not None:
                display.close()
        await self.refresh()

    async def model_bytes(
        self,
        *,
        timeout: float | None = None,
        max_bytes: int = MAX_MODEL_BYTES,
        format: str = "torchscript",
    ) -> bytes:
        """The trained model's bytes in ``format``, as :meth:`trainerd.Job.model_bytes`."""
        request = download_request(self.id, format)
        receiver = ModelReceiver(self.id, max_bytes)
        await self._client._ensure_compatible()  # noqa: SLF001
        transport = self._client._transport  # noqa: SLF001
        deadline = timeout if timeout is not None else max(DOWNLOAD_TIMEOUT, transport.timeout)
        # Closing the stream (a refusal included) cancels the call at once.
        async with contextlib.aclosing(
            transport.stream(
                _JOBS + "DownloadModel", request, jobs_pb2.ModelChunk, timeout=deadline,
            )
        ) as chunks:
            async for chunk in chunks:
                receiver.add(chunk)
        return receiver.result()

    async def model(self, *, map_location: str = "cpu", max_bytes: int = MAX_MODEL_BYTES) -> Any:
        """The trained model via torch.jit.load (the archive's bytes without torch)."""
        model = load_model(await self.model_bytes(max_bytes=max_bytes), map_location)
        await self._client._check_torch()  # noqa: SLF001
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
        request = jobs_pb2.DownloadCheckpointRequest(id=self.id, epoch=_checkpoint_epoch(epoch))
        receiver = ModelReceiver(self.id, max_bytes, "checkpoint")
        await self._client._ensure_compatible()  # noqa: SLF001
        transport = self._client._transport  # noqa: SLF001
        deadline = timeout if timeout is not None else max(DOWNLOAD_TIMEOUT, transport.timeout)
        async with contextlib.aclosing(
            transport.stream(
                _JOBS + "DownloadCheckpoint", request, jobs_pb2.ModelChunk, timeout=deadline
            )
        ) as chunks:
            async for chunk in chunks:
                receiver.add(chunk)
        return receiver.result()

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
        return held_out_rows(rows, self.spec.validation_fraction, self.seed)


class Sweep(SweepBase[Job]):
    """A sweep's members (see :class:`trainerd.Sweep`); :meth:`best` and :meth:`frame` use the
    members' last answers, which :meth:`wait` leaves current."""

    def __init__(self, client: Client, sweep_id: str, jobs: list[Job]) -> None:
        super().__init__(sweep_id, jobs)
        self._client = client

    @property
    def ended(self) -> bool:
        return all(job.cached_state.ended for job in self.jobs)

    async def refresh(self) -> Sweep:
        await asyncio.gather(*(job.refresh() for job in self.jobs))
        return self

    async def wait(
        self,
        timeout: float | None = None,
        *,
        progress: DisplayArg = None,
        plot: DisplayArg = None,
    ) -> Sweep:
        """Waits until every member ended; a failed member does not raise. ``progress`` and
        ``plot`` are :meth:`trainerd.Sweep.wait`'s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        display = self._display(progress, plot)
        if display is not None:
            try:
                await self._follow(deadline, timeout, display)
            finally:
                display.close()
            return self
        for job in self.jobs:
            left = None if deadline is None else max(0.001, deadline - time.monotonic())
            try:
                await job.wait(left, check=False, progress=False, plot=False)
            except TimeoutError:
                raise self._timed_out(timeout) from None
        return self

    async def _follow(
        self, deadline: float | None, timeout: float | None, display: SweepDisplay
    ) -> None:
        """As :meth:`trainerd.Sweep._follow`: every member still running asked again, shown,
        then a wait of at most POLL_SECONDS on the first of them, until every member ended."""
        while True:
            await asyncio.gather(
                *(job.refresh() for job in self.jobs if job._needs_full())  # noqa: SLF001
            )
            display.update(self.jobs)
            running = [job for job in self.jobs if not job.cached_state.ended]
            if not running:
                return
            wait = self._poll_wait(deadline, timeout)
            try:
                await running[0]._follow(wait, None)  # noqa: SLF001
            except DeadlineExceeded:
                pass


class Client:
    """A connection to one trainerd daemon on grpc.aio: :class:`trainerd.Client`'s API with every
    call a coroutine (settings resolved the same way)."""

    def __init__(
        self,
        address: str | None = None,
        *,
        context: str | None = None,
        token: str | None = None,
        token_file: str | os.PathLike[str] | None = None,
        tls_ca: str | os.PathLike[str] | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
        tls_server_name: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        check_version: bool = True,
    ) -> None:
        _check_timeout(timeout)
        self.settings: Settings = resolve_settings(
            address,
            context=context,
            token=token,
            token_file=token_file,
            tls_ca=tls_ca,
            tls_cert=tls_cert,
            tls_key=tls_key,
            tls_server_name=tls_server_name,
        )
        self._transport = _Transport(self.settings, float(timeout))
        self._check_version = check_version
        self._compatible: Version | None = None
        self._torch_checked = False

    @property
    def address(self) -> str:
        return self.settings.address

    @property
    def timeout(self) -> float:
        return self._transport.timeout

    async def close(self) -> None:
        await self._transport.channel.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"trainerd.aio.Client(address={self.address!r})"

    async def _ensure_compatible(self) -> None:
        if not self._check_version or self._compatible is not None:
            return
        try:
            info = await self._transport.unary(
                _SYSTEM + "GetVersion", system_pb2.GetVersionRequest(), system_pb2.VersionInfo
            )
        except Unimplemented as e:
            raise not_trainerd(self.address, e) from None
        self._compatible = checked_version(info, self.address)

    async def _unary(self, method: str, request: Message, response_type: Any, **kw: Any) -> Any:
        await self._ensure_compatible()
        return await self._transport.unary(method, request, response_type, **kw)

    # --- System ----------------------------------------------------------------------------

    async def _check_torch(self) -> None:
        """As :meth:`trainerd.Client._check_torch`: one UserWarning when this torch and the
        daemon's LibTorch differ in major.minor version."""
        if self._torch_checked or "torch" not in sys.modules:
            return
        self._torch_checked = True
        warn_torch_mismatch(torch_mismatch((await self.version()).libtorch), 2)

    async def version(self) -> Version:
        await self._ensure_compatible()
        if self._compatible is not None:
            return self._compatible
        info = await self._transport.unary(
            _SYSTEM + "GetVersion", system_pb2.GetVersionRequest(), system_pb2.VersionInfo
        )
        return version_of(info)

    async def devices(self) -> list[system_pb2.DeviceStatus]:
        response = await self._unary(
            _SYSTEM + "ListDevices", system_pb2.ListDevicesRequest(), system_pb2.ListDevicesResponse
        )
        return list(response.devices)

    async def diagnose(
        self, *, refresh: bool = False, timeout: float | None = None
    ) -> system_pb2.DiagnoseResponse:
        deadline = timeout if timeout is not None else max(DIAGNOSE_TIMEOUT, self.timeout)
        response: system_pb2.DiagnoseResponse = await self._unary(
            _SYSTEM + "Diagnose",
            system_pb2.DiagnoseRequest(refresh=refresh),
            system_pb2.DiagnoseResponse,
            timeout=deadline,
        )
        return response

    async def health(self, service: str = "") -> str:
        try:
            reply = await self._transport.raw_unary(
                "/grpc.health.v1.Health/Check",
                _health.encode_request(service),
                timeout=self.timeout,
            )
        except NotFound:
            return "SERVICE_UNKNOWN"
        return _health.serving_status_name(_health.decode_response(reply))

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
        validate_dataset_name(name)
        check_replace_flags(exist_ok, overwrite)
        payload = await asyncio.to_thread(
            prepare_payload,
            X,
            y,
            target=target,
            target_dtype=target_dtype,
            target_columns=target_columns,
        )
        await self._ensure_compatible()
        if exist_ok or overwrite:
            try:
                existing: datasets_pb2.Dataset | None = await self._unary(
                    _DATASETS + "GetDataset",
                    datasets_pb2.GetDatasetRequest(name=name),
                    datasets_pb2.Dataset,
                )
            except NotFound:
                existing = None
            if existing is not None:
                keep = await asyncio.to_thread(
                    keep_existing, name, payload, existing, exist_ok, self.address
                )
                if keep:
                    return Dataset(self, existing)
                await self.delete_dataset(name)
        bar = make_progress(progress, payload.total_bytes, f"upload {name}")
        failure: list[BaseException] = []
        requests = upload_requests(name, payload, bar, failure)

        async def messages() -> AsyncIterator[Any]:
            done = object()
            while True:
                item = await asyncio.to_thread(_next_or, requests, done)
                if item is done:
                    return
                yield item

        deadline = timeout if timeout is not None else max(UPLOAD_TIMEOUT, self.timeout)
        call = self._transport.channel.stream_unary(
            _DATASETS + "UploadDataset",
            request_serializer=_serialize_upload,
            response_deserializer=datasets_pb2.Dataset.FromString,
        )
        try:
            response = await call(messages(), timeout=deadline, metadata=self._transport.metadata)
        except grpc.RpcError as e:
            if failure:
                raise failure[0] from None
            raise self._transport.error(e, deadline) from None
        finally:
            bar.close()
        assert isinstance(response, datasets_pb2.Dataset)
        return Dataset(self, response)

    async def datasets(self) -> list[Dataset]:
        response = await self._unary(
            _DATASETS + "ListDatasets",
            datasets_pb2.ListDatasetsRequest(),
            datasets_pb2.ListDatasetsResponse,
        )
        return [Dataset(self, d) for d in response.datasets]

    async def dataset(self, name: str) -> Dataset:
        proto = await self._unary(
            _DATASETS + "GetDataset", datasets_pb2.GetDatasetRequest(name=name), datasets_pb2.Dataset
        )
        return Dataset(self, proto)

    async def delete_dataset(self, name: DatasetArg | Dataset) -> None:
        dataset = name.name if isinstance(name, DatasetBase) else name
        await self._unary(
            _DATASETS + "DeleteDataset",
            datasets_pb2.DeleteDatasetRequest(name=dataset),
            datasets_pb2.DeleteDatasetResponse,
        )

    async def share_dataset(self, name: DatasetArg | Dataset, shared: bool = True) -> Dataset:
        dataset = name.name if isinstance(name, DatasetBase) else name
        proto = await self._unary(
            _DATASETS + "ShareDataset",
            datasets_pb2.ShareDatasetRequest(name=dataset, shared=shared),
            datasets_pb2.Dataset,
        )
        return Dataset(self, proto)

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
        name = dataset.name if isinstance(dataset, DatasetBase) else dataset
        shape: Sequence[int] = ()
        if needs_feature_shape(model):  # a torch.nn.Module to export: the dataset's rows
            shape = (
                dataset.feature_shape
                if isinstance(dataset, DatasetBase)
                else (await self.dataset(name)).feature_shape
            )
        request = await asyncio.to_thread(
            submit_request, name, model, _given(dict(options)), lambda: shape
        )
        if request_id is not None:
            request.request_id = request_id
        proto = await self._unary(_JOBS + "SubmitJob", request, jobs_pb2.Job)
        if request.torchscript_module or request.exported_program:
            await self._check_torch()
        return Job(self, proto)

    async def _get_job_proto(self, job_id: str) -> jobs_pb2.Job:
        proto: jobs_pb2.Job = await self._unary(
            _JOBS + "GetJob", jobs_pb2.GetJobRequest(id=job_id), jobs_pb2.Job
        )
        return proto

    async def job(self, job_id: str) -> Job:
        return Job(self, await self._get_job_proto(job_id))

    async def jobs(
        self,
        state: str | JobState | None = None,
        dataset: DatasetArg | Dataset | None = None,
        limit: int | None = None,
        sweep: str | None = None,
    ) -> list[Job]:
        name = dataset.name if isinstance(dataset, DatasetBase) else dataset
        request = list_jobs_request(state, name, limit, sweep)
        found: list[jobs_pb2.Job] = []
        while True:
            request.page_size = page_size(len(found), limit)
            page = await self._unary(_JOBS + "ListJobs", request, jobs_pb2.ListJobsResponse)
            found.extend(page.jobs)
            if not page.next_page_token or (limit is not None and len(found) >= limit):
                break
            request.page_token = page.next_page_token
        return [Job(self, proto) for proto in ordered_jobs(found, limit)]

    async def get_sweep(self, sweep_id: str) -> Sweep:
        """The sweep with id ``sweep_id``, its members in order (see
        :meth:`trainerd.Client.get_sweep`)."""
        members = await self.jobs(sweep=sweep_id)
        if not members:
            raise NotFound(f"sweep {sweep_id!r} not found", address=self.address)
        return Sweep(self, sweep_id, members)

    async def delete_job(self, job_id: str | Job) -> None:
        job_id = job_id.id if isinstance(job_id, Job) else job_id
        await self._unary(
            _JOBS + "DeleteJob", jobs_pb2.DeleteJobRequest(id=job_id), jobs_pb2.DeleteJobResponse
        )

    async def sweep(
        self,
        dataset: DatasetArg | Dataset,
        *,
        model: str,
        lr: float | list[float] | tuple[float, ...] = 0.01,
        momentum: float | list[float] | tuple[float, ...] | None = None,
        weight_decay: float | list[float] | tuple[float, ...] | None = None,
        seed: int | list[int] | tuple[int, ...] | None = None,
        points: Sequence[Mapping[str, float]] | None = None,
        request_id: str | None = None,
        **options: Unpack[SweepOptions],
    ) -> Sweep:
        """Submits a sweep (see :meth:`trainerd.Client.sweep`)."""
        name = dataset.name if isinstance(dataset, DatasetBase) else dataset
        request = sweep_request(
            name, model, lr, momentum, weight_decay, seed, dict(options), points
        )
        if request_id is not None:
            request.request_id = request_id
        response = await self._unary(_JOBS + "SubmitSweep", request, jobs_pb2.SubmitSweepResponse)
        return Sweep(self, response.sweep_id, [Job(self, m) for m in response.members])


def _next_or(iterator: Iterator[Any], default: object) -> Any:
    return next(iterator, default)
