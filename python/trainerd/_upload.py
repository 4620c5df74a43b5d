"""An upload as it goes to the daemon (UploadDataset): the dataset's header, the payload's chunks
(written straight from the arrays' memory) and the SHA-256 trailer, after the choice ``exist_ok``
and ``overwrite`` make for a name already taken. Reading and checking the data is
:mod:`trainerd._payload`'s.

The name is checked here, by the daemon's rule for a new dataset, before the data is read: an
upload's cost is the pass over its data, which a refused name would waste. Whether
``exist_ok`` and ``overwrite`` go together is the client's own rule (they choose what it does).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterator
from typing import Any

from google.protobuf.message import Message

from trainerd._calls import dataset, delete_dataset
from trainerd._connection import Connection
from trainerd._payload import Payload, prepare_payload
from trainerd._progress import Progress, ProgressArg, make_progress
from trainerd._rpc import UPLOAD_DATASET, Blocking, Op, Upload
from trainerd.errors import AlreadyExists, NotFound, TrainerdError
from trainerd.v1 import datasets_pb2

__all__ = ["UPLOAD_TIMEOUT", "RawChunk", "upload", "validate_dataset_name"]

#: Uploads may move gigabytes: their deadline is at least this (client/connection.h).
UPLOAD_TIMEOUT = 600.0
_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")


def validate_dataset_name(name: object) -> str:
    """The daemon's rule for the name of an upload: a bare name (the dataset is the caller's)."""
    if not isinstance(name, str):
        raise TypeError(f"a dataset name is a str, not {type(name).__name__}")
    if "/" in name:
        raise ValueError(
            f"dataset name {name!r} is not valid: a dataset is uploaded under a bare name, as one "
            "of the caller's ('OWNER/NAME' names another owner's dataset in the other calls)"
        )
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"dataset name {name!r} is not valid: use 1 to 128 letters, digits, '.', '_' or '-'"
        )
    return name


def check_replace_flags(exist_ok: object, overwrite: object) -> None:
    for flag, value in (("exist_ok", exist_ok), ("overwrite", overwrite)):
        if not isinstance(value, bool):
            raise TypeError(f"{flag} must be True or False, not {value!r}")
    if exist_ok and overwrite:
        raise ValueError(
            "give exist_ok=True (keep the dataset there when it holds the same data) or "
            "overwrite=True (replace it), not both"
        )


@dataclasses.dataclass(frozen=True)
class RawChunk:
    """One chunk of payload, serialized by hand as UploadDatasetRequest{chunk} so that the bytes
    go from the array into the message without intermediate copies."""

    data: memoryview


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _serialize(item: Message | RawChunk) -> bytes:
    """UploadDatasetRequest: the header and trailer as messages; a chunk written by hand (field 2,
    bytes) straight from the array's memory."""
    if isinstance(item, RawChunk):
        return b"".join((b"\x12", _varint(len(item.data)), item.data))
    return item.SerializeToString()


def _messages(
    name: str, payload: Payload, bar: Progress, failure: list[BaseException]
) -> Iterator[Message | RawChunk]:
    """The messages of UploadDataset: the header, the payload's chunks, the SHA-256 trailer. An
    error reading the data is kept in ``failure`` (gRPC then cancels the call)."""
    header = datasets_pb2.DatasetHeader(
        name=name,
        feature_shape=payload.feature_shape,
        target_shape=payload.target_shape,
        target_dtype=(
            datasets_pb2.DTYPE_INT64
            if payload.target_dtype == "int64"
            else datasets_pb2.DTYPE_FLOAT32
        ),
        row_count=payload.rows,
    )
    total = payload.total_bytes
    try:
        yield datasets_pb2.UploadDatasetRequest(header=header)
        digest = hashlib.sha256()
        sent = 0
        for chunk in payload.chunks(digest):
            yield RawChunk(chunk)
            sent += len(chunk)
            bar.update(sent)
        if sent != total:
            raise AssertionError(f"the payload has {sent} bytes, not {total}")
        yield datasets_pb2.UploadDatasetRequest(sha256=digest.hexdigest())
    except GeneratorExit:
        raise
    except BaseException as e:  # reported after gRPC cancels the call
        failure.append(e)
        raise


def _keep_existing(
    name: str, payload: Payload, existing: datasets_pb2.Dataset, exist_ok: bool, address: str
) -> bool:
    """For an upload with exist_ok or overwrite to a name taken by ``existing``: True when it
    holds the payload's data (the upload has nothing to do), False when it is to be replaced
    (overwrite). AlreadyExists, saying how they differ, for exist_ok and other data."""
    difference = payload.difference(existing)
    if not difference:
        return True
    if exist_ok:
        raise AlreadyExists(
            f"dataset '{name}' exists and holds other data than this upload: {difference}. "
            "Pass overwrite=True to replace it, or upload under another name",
            address=address,
        )
    return False


def upload(
    connection: Connection,
    name: str,
    X: Any,
    y: Any,
    target: Any,
    target_dtype: object,
    target_columns: int | None,
    progress: ProgressArg,
    timeout: float | None,
    exist_ok: bool,
    overwrite: bool,
) -> Op[datasets_pb2.Dataset]:
    """Checks and reads the data (every value before the first byte is sent), decides what a
    name already taken means, and streams the dataset: the daemon's record of it."""
    validate_dataset_name(name)
    check_replace_flags(exist_ok, overwrite)
    payload: Payload = yield Blocking(
        lambda: prepare_payload(
            X, y, target=target, target_dtype=target_dtype, target_columns=target_columns
        )
    )
    yield from connection.ready()
    if exist_ok or overwrite:
        try:
            existing: datasets_pb2.Dataset | None = yield from dataset(connection, name)
        except NotFound:
            existing = None
        if existing is not None:
            found = existing
            keep = yield Blocking(
                lambda: _keep_existing(name, payload, found, exist_ok, connection.address)
            )
            if keep:
                return existing
            yield from delete_dataset(connection, name)
    bar = make_progress(progress, payload.total_bytes, f"upload {name}")
    failure: list[BaseException] = []
    deadline = timeout if timeout is not None else max(UPLOAD_TIMEOUT, connection.timeout)
    messages = _messages(name, payload, bar, failure)
    try:
        response: datasets_pb2.Dataset = yield Upload(
            UPLOAD_DATASET, messages, _serialize, deadline
        )
    except TrainerdError:
        # A failure reading the data (a file that changed as it was read) cancels the call; it
        # is the error to report, not gRPC's "cancelled".
        if failure:
            raise failure[0] from None
        raise
    finally:
        bar.close()
    return response
