"""The exceptions of the trainerd client: one hierarchy under :class:`TrainerdError`.

A call the daemon refused raises the subclass of its gRPC status code, with the daemon's own
sentence as the message::

    try:
        client.dataset("nope")
    except trainerd.NotFound as e:
        print(e)          # dataset 'nope' not found
        print(e.code)     # StatusCode.NOT_FOUND

Checks the client makes before it sends anything raise :class:`ValueError` or :class:`TypeError`
(:class:`InvalidArgument` is a ``ValueError`` too, so one ``except ValueError`` catches both).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

if TYPE_CHECKING:
    from trainerd._jobbase import JobBase

__all__ = [
    "Aborted",
    "AlreadyExists",
    "Cancelled",
    "ConfigError",
    "DataLoss",
    "DeadlineExceeded",
    "DownloadRefused",
    "FailedPrecondition",
    "IncompatibleDaemon",
    "Internal",
    "InvalidArgument",
    "JobCancelled",
    "JobFailed",
    "NotFound",
    "OutOfRange",
    "PermissionDenied",
    "ResourceExhausted",
    "TrainerdError",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "Unknown",
    "error_from_rpc",
]


class TrainerdError(Exception):
    """Base of every error this package raises about the daemon.

    Attributes:
        code: the gRPC status code of the call that failed (None for errors that are not a
            call's, such as :class:`ConfigError` or :class:`JobFailed`).
        details: the daemon's (or gRPC's) message, as it came.
        address: the daemon's address, when the error is about a call.
    """

    code: grpc.StatusCode | None = None

    def __init__(
        self,
        message: str,
        *,
        code: grpc.StatusCode | None = None,
        details: str = "",
        address: str = "",
    ) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.details = details or message
        self.address = address

    @property
    def message(self) -> str:
        """The sentence, as str(error) gives it."""
        return str(self.args[0]) if self.args else ""


class Cancelled(TrainerdError):
    """The call was cancelled (CANCELLED)."""

    code = grpc.StatusCode.CANCELLED


class Unknown(TrainerdError):
    """UNKNOWN: an error gRPC could not classify."""

    code = grpc.StatusCode.UNKNOWN


class InvalidArgument(TrainerdError, ValueError):
    """The daemon refused a value (INVALID_ARGUMENT), e.g. a model spec that does not fit the
    dataset; the message is the daemon's sentence."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(TrainerdError):
    """The call did not end within its timeout (DEADLINE_EXCEEDED)."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(TrainerdError, LookupError):
    """No such dataset or job, or one of another tenant's (NOT_FOUND)."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(TrainerdError):
    """A dataset of that name exists or is being uploaded (ALREADY_EXISTS)."""

    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(TrainerdError):
    """The caller may not do this (PERMISSION_DENIED), e.g. change another tenant's dataset or
    submit a TorchScript module that uses a forbidden operator."""

    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(TrainerdError):
    """A limit of the daemon (RESOURCE_EXHAUSTED): dataset size, queue length, quota, memory."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(TrainerdError):
    """The object is not in a state that allows the call (FAILED_PRECONDITION), e.g. deleting a
    running job or downloading the model of a job that did not succeed."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(TrainerdError):
    """ABORTED, e.g. the dataset was replaced while a submitted module was checked."""

    code = grpc.StatusCode.ABORTED


class OutOfRange(TrainerdError):
    """OUT_OF_RANGE."""

    code = grpc.StatusCode.OUT_OF_RANGE


class Unimplemented(TrainerdError):
    """The daemon does not implement the call (UNIMPLEMENTED): an older daemon."""

    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(TrainerdError):
    """INTERNAL: a bug or an unexpected failure in the daemon."""

    code = grpc.StatusCode.INTERNAL


class Unavailable(TrainerdError):
    """The daemon could not be reached, or lost the connection (UNAVAILABLE). The message names
    the address tried."""

    code = grpc.StatusCode.UNAVAILABLE


class DataLoss(TrainerdError):
    """DATA_LOSS: an upload did not match its checksum, or a stored model no longer matches the
    one written."""

    code = grpc.StatusCode.DATA_LOSS


class Unauthenticated(TrainerdError):
    """The daemon wants a token or a client certificate (UNAUTHENTICATED); the message says which
    setting to give."""

    code = grpc.StatusCode.UNAUTHENTICATED


class ConfigError(TrainerdError, ValueError):
    """The client's settings are wrong: trainctl's contexts file does not parse, the context named
    is not in it, a token or TLS file cannot be read."""


class IncompatibleDaemon(TrainerdError):
    """The daemon at the address does not speak the API version this client was built for."""


class DownloadRefused(TrainerdError):
    """The client stopped a model download: the daemon declared a model larger than the
    download's ``max_bytes``, or sent more bytes than it declared. Nothing was kept."""


class JobFailed(TrainerdError):
    """A job this client waited for ended FAILED; the message is the daemon's reason
    (``Job.error``), e.g. "loss became NaN at epoch 3". ``job`` is the ended job."""

    def __init__(self, job: JobBase) -> None:
        reason = job.error or "no reason given"
        super().__init__(f"job '{job.id}' failed: {reason}", details=job.error)
        self.job = job
        self.reason = job.error


class JobCancelled(TrainerdError):
    """A job this client waited for ended CANCELLED. ``job`` is the ended job."""

    def __init__(self, job: JobBase) -> None:
        super().__init__(f"job '{job.id}' was cancelled")
        self.job = job
        self.reason = job.error


_BY_CODE: dict[grpc.StatusCode, type[TrainerdError]] = {
    cls.code: cls
    for cls in (
        Cancelled,
        Unknown,
        InvalidArgument,
        DeadlineExceeded,
        NotFound,
        AlreadyExists,
        PermissionDenied,
        ResourceExhausted,
        FailedPrecondition,
        Aborted,
        OutOfRange,
        Unimplemented,
        Internal,
        Unavailable,
        DataLoss,
        Unauthenticated,
    )
    if cls.code is not None
}

# Words of gRPC's messages for a connection that a TLS handshake ended (or that a TLS server
# closed on a plaintext client: "Socket closed").
_HANDSHAKE_WORDS = ("ssl", "handshake", "tls", "certificate", "verification", "socket closed")
_MAX_MESSAGE_CHARS = 1000


def _one_line(text: str) -> str:
    line = " ".join(text.replace("\r\n", "\n").split("\n")).strip()
    if len(line) > _MAX_MESSAGE_CHARS:
        line = line[:_MAX_MESSAGE_CHARS] + "..."
    return line


def error_from_rpc(
    error: grpc.RpcError,
    *,
    address: str,
    timeout: float | None = None,
    uses_tls: bool = False,
    has_token: bool = False,
    has_certificate: bool = False,
    had_replies: bool = False,
) -> TrainerdError:
    """The :class:`TrainerdError` for a failed call, worded as trainctl words it: the daemon's own
    sentence for the errors it reports, the address for a daemon that could not be reached, and
    which setting to give when it wants credentials."""
    code_method = getattr(error, "code", None)
    details_method = getattr(error, "details", None)
    code = code_method() if callable(code_method) else grpc.StatusCode.UNKNOWN
    details = details_method() if callable(details_method) else str(error)
    if not isinstance(code, grpc.StatusCode):
        code = grpc.StatusCode.UNKNOWN
    details = details if isinstance(details, str) else ""
    message = _one_line(details)
    cls = _BY_CODE.get(code, TrainerdError)
    if code == grpc.StatusCode.UNAVAILABLE:
        lower = message.lower()
        hint = ""
        if not had_replies and any(word in lower for word in _HANDSHAKE_WORDS):
            hint = (
                " (check tls_ca, tls_server_name and, for mutual TLS, tls_cert and tls_key)"
                if uses_tls
                else " (if trainerd serves TLS, give tls_ca)"
            )
        lead = "lost connection to trainerd at " if had_replies else "cannot reach trainerd at "
        text = f"{lead}{address}: {message or 'unavailable'}{hint}"
    elif code == grpc.StatusCode.UNAUTHENTICATED:
        if not has_token and not has_certificate:
            hint = (
                "give token= or token_file=, or set $TRAINERD_TOKEN (or tls_cert and tls_key "
                "for a client certificate)"
            )
        elif has_token:
            hint = "check the token (token=, token_file= or $TRAINERD_TOKEN)"
        else:
            hint = "check the client certificate (tls_cert, tls_key), or give a token"
        text = f"trainerd at {address} refused the call: {message or 'unauthenticated'}; {hint}"
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED and timeout is not None and not message:
        text = f"trainerd at {address} did not answer within {timeout:g} s"
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED and timeout is not None:
        text = f"trainerd at {address} did not answer within {timeout:g} s ({message})"
    elif code == grpc.StatusCode.UNIMPLEMENTED:
        text = (
            f"trainerd at {address} does not implement this call (is it an older version?)"
            + (f": {message}" if message else "")
        )
    elif code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN):
        name = "internal error" if code == grpc.StatusCode.INTERNAL else "unknown error"
        text = f"trainerd {name}" + (f": {message}" if message else "")
    else:
        text = message or f"trainerd: {code.name.lower().replace('_', ' ')}"
    return cls(text, code=code, details=details, address=address)
