"""Downloads of a job's trained model (DownloadModel) and checkpoints (DownloadCheckpoint): their
requests, and the chunks gathered within the size the daemon declares and the caller allows."""

from __future__ import annotations

import io

from trainerd._connection import Connection
from trainerd._rpc import DOWNLOAD_CHECKPOINT, DOWNLOAD_MODEL, Drain, Op, Stream
from trainerd.errors import DownloadRefused, TrainerdError
from trainerd.v1 import jobs_pb2

__all__ = [
    "DOWNLOAD_TIMEOUT",
    "MAX_CHECKPOINT_BYTES",
    "MAX_MODEL_BYTES",
    "ModelReceiver",
    "checkpoint_bytes",
    "model_bytes",
]

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

_FORMATS = {
    "torchscript": jobs_pb2.MODEL_FORMAT_TORCHSCRIPT,
    "safetensors": jobs_pb2.MODEL_FORMAT_SAFETENSORS,
    "pt2": jobs_pb2.MODEL_FORMAT_PT2,
}


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

    def add(self, chunk: jobs_pb2.ModelChunk) -> bool:
        """Takes a chunk; False (the stream goes on to its end)."""
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
        return False

    def result(self) -> bytes:
        """The whole archive; TrainerdError when the stream ended before the declared size."""
        data = self._buffer.getvalue()
        if len(data) != self._total or not data:
            raise TrainerdError(
                f"the {self._what} of job '{self._job_id}' arrived incomplete ({len(data)} of "
                f"{max(self._total, 0)} bytes)"
            )
        return data


def _deadline(connection: Connection, timeout: float | None) -> float:
    return timeout if timeout is not None else max(DOWNLOAD_TIMEOUT, connection.timeout)


def model_bytes(
    connection: Connection, job_id: str, format: str, max_bytes: int, timeout: float | None
) -> Op[bytes]:
    """The trained model of job ``job_id`` in ``format`` ("torchscript", "safetensors" or
    "pt2"), at most ``max_bytes``; ``timeout`` None: at least DOWNLOAD_TIMEOUT."""
    if format not in _FORMATS:
        raise ValueError(f"format must be 'torchscript', 'safetensors' or 'pt2', not {format!r}")
    request = jobs_pb2.DownloadModelRequest(id=job_id, format=_FORMATS[format])
    receiver = ModelReceiver(job_id, max_bytes)
    yield from connection.ready()
    yield Drain(Stream(DOWNLOAD_MODEL, request, _deadline(connection, timeout)), receiver.add)
    return receiver.result()


def checkpoint_bytes(
    connection: Connection, job_id: str, epoch: int | None, max_bytes: int, timeout: float | None
) -> Op[bytes]:
    """Checkpoint ``epoch`` of job ``job_id`` (None: the newest), at most ``max_bytes``.
    DownloadCheckpointRequest.epoch 0 is the newest: an epoch 0, which would read as that, is
    refused here (the daemon refuses a negative one)."""
    if epoch is not None and (
        isinstance(epoch, bool)
        or not isinstance(epoch, int)
        or epoch == 0
        or not -(2**31) <= epoch < 2**31
    ):
        raise ValueError(f"epoch must be a checkpoint's epoch (>= 1) or None, not {epoch!r}")
    request = jobs_pb2.DownloadCheckpointRequest(id=job_id, epoch=epoch or 0)
    receiver = ModelReceiver(job_id, max_bytes, "checkpoint")
    yield from connection.ready()
    yield Drain(Stream(DOWNLOAD_CHECKPOINT, request, _deadline(connection, timeout)), receiver.add)
    return receiver.result()
