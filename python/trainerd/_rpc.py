"""The RPCs of trainerd.v1 that the client makes, each named once and taken from the services the
generated modules describe (``DatasetService``, ``JobService``, ``SystemService``): its path and
the message classes it takes and returns.

And how an operation of the client talks to its transport: an operation (:data:`Op`, see
:mod:`trainerd._calls`) is a generator that yields the steps it needs (a unary call, an upload, a
server stream read to its end, several unary calls together, blocking work) and is sent each
step's result; a failed step is thrown into it, so that it may catch the error. The synchronous
client performs the steps one after another (:func:`trainerd._transport.Transport.run`), the
asyncio client awaits them (:func:`trainerd._transport.AioTransport.run`), and everything between
the steps, which is what the two clients have in common, is written once.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Generator, Iterator
from typing import Any, Generic, TypeVar, Union

from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import Message

from trainerd.v1 import datasets_pb2, jobs_pb2, system_pb2

__all__ = [
    "CLIENT_TIMEOUT",
    "Blocking",
    "Drain",
    "Many",
    "Op",
    "Raw",
    "Rpc",
    "Runner",
    "Step",
    "Stream",
    "Unary",
    "Upload",
    "call",
]

RequestT = TypeVar("RequestT", bound=Message)
ResponseT = TypeVar("ResponseT", bound=Message)
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Rpc(Generic[RequestT, ResponseT]):
    """One method of a trainerd.v1 service."""

    path: str  # "/trainerd.v1.JobService/SubmitJob", as gRPC names it on the wire
    request_type: type[RequestT]
    response_type: type[ResponseT]


_METHODS: dict[str, MethodDescriptor] = {
    method.name: method
    for module in (datasets_pb2, jobs_pb2, system_pb2)
    for service in module.DESCRIPTOR.services_by_name.values()
    for method in service.methods
}


def _rpc(name: str, request: type[RequestT], response: type[ResponseT]) -> Rpc[RequestT, ResponseT]:
    """The method ``name`` of the services, which must take ``request`` and return ``response``
    (checked against the descriptor, so that the types below cannot drift from the .proto)."""
    method = _METHODS[name]
    if (method.input_type.full_name, method.output_type.full_name) != (
        request.DESCRIPTOR.full_name,
        response.DESCRIPTOR.full_name,
    ):
        raise ImportError(f"trainerd.v1's {name} no longer takes or returns the messages expected")
    return Rpc(f"/{method.containing_service.full_name}/{method.name}", request, response)


# DatasetService
UPLOAD_DATASET = _rpc("UploadDataset", datasets_pb2.UploadDatasetRequest, datasets_pb2.Dataset)
LIST_DATASETS = _rpc(
    "ListDatasets", datasets_pb2.ListDatasetsRequest, datasets_pb2.ListDatasetsResponse
)
GET_DATASET = _rpc("GetDataset", datasets_pb2.GetDatasetRequest, datasets_pb2.Dataset)
DELETE_DATASET = _rpc(
    "DeleteDataset", datasets_pb2.DeleteDatasetRequest, datasets_pb2.DeleteDatasetResponse
)
SHARE_DATASET = _rpc("ShareDataset", datasets_pb2.ShareDatasetRequest, datasets_pb2.Dataset)
# JobService
SUBMIT_JOB = _rpc("SubmitJob", jobs_pb2.SubmitJobRequest, jobs_pb2.Job)
SUBMIT_SWEEP = _rpc("SubmitSweep", jobs_pb2.SubmitSweepRequest, jobs_pb2.SubmitSweepResponse)
GET_JOB = _rpc("GetJob", jobs_pb2.GetJobRequest, jobs_pb2.Job)
LIST_JOBS = _rpc("ListJobs", jobs_pb2.ListJobsRequest, jobs_pb2.ListJobsResponse)
CANCEL_JOB = _rpc("CancelJob", jobs_pb2.CancelJobRequest, jobs_pb2.Job)
WATCH_JOB = _rpc("WatchJob", jobs_pb2.WatchJobRequest, jobs_pb2.JobEvent)
DOWNLOAD_MODEL = _rpc("DownloadModel", jobs_pb2.DownloadModelRequest, jobs_pb2.ModelChunk)
DOWNLOAD_CHECKPOINT = _rpc(
    "DownloadCheckpoint", jobs_pb2.DownloadCheckpointRequest, jobs_pb2.ModelChunk
)
DELETE_JOB = _rpc("DeleteJob", jobs_pb2.DeleteJobRequest, jobs_pb2.DeleteJobResponse)
# SystemService
GET_VERSION = _rpc("GetVersion", system_pb2.GetVersionRequest, system_pb2.VersionInfo)
LIST_DEVICES = _rpc("ListDevices", system_pb2.ListDevicesRequest, system_pb2.ListDevicesResponse)
DIAGNOSE = _rpc("Diagnose", system_pb2.DiagnoseRequest, system_pb2.DiagnoseResponse)

# --- Steps ---------------------------------------------------------------------------------------

#: A step's ``timeout`` that means the client's deadline (``Client(timeout=...)``); None means
#: none.
CLIENT_TIMEOUT = -1.0


@dataclasses.dataclass(frozen=True)
class Unary(Generic[ResponseT]):
    """A unary call; its result is the response."""

    rpc: Rpc[Any, ResponseT]
    request: Message
    timeout: float | None = CLIENT_TIMEOUT


@dataclasses.dataclass(frozen=True)
class Many(Generic[ResponseT]):
    """Unary calls made together (the asyncio client makes them at once); the result is their
    responses in order, or the first error."""

    calls: tuple[Unary[ResponseT], ...]


@dataclasses.dataclass(frozen=True)
class Stream(Generic[ResponseT]):
    """A server-streaming call."""

    rpc: Rpc[Any, ResponseT]
    request: Message
    timeout: float | None


@dataclasses.dataclass(frozen=True)
class Drain(Generic[ResponseT]):
    """A server stream read message by message into ``each`` until it ends or ``each`` returns
    True; the call is cancelled then, and when ``each`` raises. The result is None."""

    stream: Stream[ResponseT]
    each: Callable[[ResponseT], bool]


@dataclasses.dataclass(frozen=True)
class Upload(Generic[ResponseT]):
    """A client-streaming call of the messages ``messages`` yields, each turned into bytes by
    ``serializer``. The asyncio client reads ``messages`` in a worker thread (it reads the data).
    The result is the response."""

    rpc: Rpc[Any, ResponseT]
    messages: Iterator[Any]
    serializer: Callable[[Any], bytes]
    timeout: float | None


@dataclasses.dataclass(frozen=True)
class Raw:
    """A unary call of messages encoded by hand (the health service, whose generated code the
    package does not carry); the result is the response's bytes."""

    path: str
    request: bytes
    timeout: float | None = CLIENT_TIMEOUT


@dataclasses.dataclass(frozen=True)
class Blocking(Generic[T]):
    """Work on the client's side that may take a while (reading and checking data, exporting a
    module, hashing): run as it is by the synchronous client, in a worker thread by the asyncio
    one, so that its event loop stays free. The result is ``run()``'s."""

    run: Callable[[], T]


Step = Union[Unary[Any], Many[Any], Drain[Any], Upload[Any], Raw, Blocking[Any]]
#: An operation: yields steps, is sent their results, returns its own.
Op = Generator[Step, Any, T]


def call(step: Unary[ResponseT]) -> Generator[Step, Any, ResponseT]:
    """``response = yield from call(Unary(...))``, typed."""
    response: ResponseT = yield step
    return response


class Runner(Generic[T]):
    """One operation being run, as a transport runs it::

        with Runner(op) as runner:
            for step in runner:
                with runner.answer():
                    runner.reply(perform(step))  # or await it
        return runner.result

    Iterating gives the steps the operation asks for, each after the last one's result
    (:meth:`reply`) or error (an Exception raised in the :meth:`answer` block) went back into
    it; the iteration ends when it returns (``result``). Leaving the ``with`` block early (an
    exception the operation never saw: KeyboardInterrupt, a cancelled task, its own error) ends
    the operation where it stands, its ``finally`` blocks run."""

    def __init__(self, op: Op[T]) -> None:
        self._op = op
        self._reply: Any = None
        self._error: Exception | None = None
        self.result: T

    def __iter__(self) -> Iterator[Step]:
        while True:
            try:
                if self._error is not None:
                    error, self._error = self._error, None
                    step = self._op.throw(error)
                else:
                    step = self._op.send(self._reply)
            except StopIteration as done:
                self.result = done.value
                return
            self._reply = None
            yield step

    def reply(self, value: Any) -> None:
        self._reply = value

    @contextlib.contextmanager
    def answer(self) -> Iterator[None]:
        """A step performed: an Exception raised here goes to the operation, which may catch
        it."""
        try:
            yield
        except Exception as error:
            self._error = error

    def __enter__(self) -> Runner[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self._op.close()
