"""The connection both clients make to a daemon, and what they keep about it.

:class:`ClientBase` resolves the address and credentials as trainctl does
(:func:`trainerd.config.resolve_settings`) and opens the transport (the channel).
:class:`Connection` is what every operation goes through: the daemon's version, checked once on
the first call that reaches the daemon (the same major version as this client and at least
:data:`MIN_DAEMON_VERSION`, else :class:`~trainerd.IncompatibleDaemon`), kept for
:meth:`trainerd.Client.version`; the client's deadline; and the one warning, per client, about a
torch of another major.minor version than the daemon's LibTorch.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import sys
from collections.abc import Generator
from typing import Any, Generic, TypeVar

from google.protobuf.message import Message

from trainerd import _caller
from trainerd._optional import torch_mismatch
from trainerd._rpc import GET_VERSION, Op, Step, Unary, call
from trainerd._version import __version__
from trainerd.config import Settings, resolve_settings
from trainerd.errors import IncompatibleDaemon, TrainerdError, Unimplemented
from trainerd.v1 import system_pb2

__all__ = ["DEFAULT_TIMEOUT", "MIN_DAEMON_VERSION", "ClientBase", "Connection", "Version"]

#: trainctl's default call deadline (client/cli.h, kDefaultTimeout), seconds.
DEFAULT_TIMEOUT = 30.0
#: The oldest daemon this client works with. The daemon's API is package trainerd.v1; its
#: VersionInfo carries trainerd's version (no separate API version), so compatibility is judged
#: from that: the same major version, and at least this one.
MIN_DAEMON_VERSION = (0, 1, 0)

ResponseT = TypeVar("ResponseT", bound=Message)
TransportT = TypeVar("TransportT")


@dataclasses.dataclass(frozen=True)
class Version:
    """What :meth:`Client.version` reports: the daemon's versions and this package's."""

    trainerd: str
    libtorch: str
    cuda: str  # "" for a CPU-only LibTorch
    driver: str  # "" without a driver or NVML
    client: str = __version__


def _parse_version(text: str) -> tuple[int, int, int] | None:
    match = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def version_of(info: system_pb2.VersionInfo) -> Version:
    return Version(
        trainerd=info.trainerd_version,
        libtorch=info.libtorch_version,
        cuda=info.cuda_version,
        driver=info.driver_version,
    )


def not_trainerd(address: str, error: TrainerdError) -> IncompatibleDaemon:
    """The error for a server that does not implement GetVersion."""
    return IncompatibleDaemon(
        f"the server at {address} does not serve trainerd's API "
        f"(trainerd.v1.SystemService): {error.details}",
        address=address,
    )


def checked_version(info: system_pb2.VersionInfo, address: str) -> Version:
    """The daemon's version, when this client speaks its API: the same major version and at
    least MIN_DAEMON_VERSION. IncompatibleDaemon otherwise."""
    parsed = _parse_version(info.trainerd_version)
    if parsed is None:
        raise IncompatibleDaemon(
            f"trainerd at {address} reports version {info.trainerd_version!r}, which this "
            f"client ({__version__}) cannot read",
            address=address,
        )
    ours = _parse_version(__version__)
    assert ours is not None
    if parsed[0] != ours[0] or parsed < MIN_DAEMON_VERSION:
        minimum = ".".join(str(v) for v in MIN_DAEMON_VERSION)
        raise IncompatibleDaemon(
            f"trainerd at {address} is version {info.trainerd_version}; this client "
            f"({__version__}) needs a trainerd {ours[0]}.x of at least {minimum}",
            address=address,
        )
    return version_of(info)


def check_timeout(timeout: object) -> None:
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not math.isfinite(timeout)
        or not timeout > 0
    ):
        raise ValueError(f"timeout must be a positive, finite number of seconds, got {timeout!r}")


def _get_version() -> Op[system_pb2.VersionInfo]:
    return (yield from call(Unary(GET_VERSION, system_pb2.GetVersionRequest())))


class Connection:
    """What a client keeps about its daemon, and the calls every operation makes through it."""

    def __init__(self, address: str, timeout: float, check_version: bool) -> None:
        self.address = address
        self.timeout = timeout  # the client's deadline of a unary call, in seconds
        self._check_version = check_version
        self._compatible: Version | None = None
        self._torch_checked = False

    def call(self, step: Unary[ResponseT]) -> Generator[Step, Any, ResponseT]:
        """``response = yield from connection.call(Unary(...))``: the call, after the version
        check of the first call."""
        yield from self.ready()
        return (yield from call(step))

    def ready(self) -> Op[None]:
        """Checks once (on the first call) that the daemon speaks this client's API. Two calls
        at once may both ask; the answer is the same."""
        if self._check_version and self._compatible is None:
            try:
                info = yield from _get_version()
            except Unimplemented as e:
                raise not_trainerd(self.address, e) from None
            self._compatible = checked_version(info, self.address)

    def version(self) -> Op[Version]:
        """The daemon's version (GetVersion), as the check found it or asked again."""
        yield from self.ready()
        if self._compatible is not None:
            return self._compatible
        return version_of((yield from _get_version()))

    def check_torch(self) -> Op[None]:
        """Warns once (a UserWarning naming both versions, at the caller's line) when the torch
        this process imported and the daemon's LibTorch differ in major.minor version: called
        where a TorchScript module or an exported program moves between them (an archive one
        writes may not load, or load differently, in the other). Nothing without torch
        imported."""
        if self._torch_checked or "torch" not in sys.modules:
            return
        self._torch_checked = True
        version = yield from self.version()
        message = torch_mismatch(version.libtorch)
        if message is not None:
            _caller.warn(message)


class ClientBase(Generic[TransportT]):
    """What both clients are made of: the settings (resolved as trainctl resolves them), the
    transport that makes their calls and the :class:`Connection` their operations go through.
    See :class:`trainerd.Client` for the arguments."""

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
        check_timeout(timeout)
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
        self._transport: TransportT = self._connect(self.settings, float(timeout))
        self._connection = Connection(self.settings.address, float(timeout), check_version)

    def _connect(self, settings: Settings, timeout: float) -> TransportT:
        raise NotImplementedError

    @property
    def address(self) -> str:
        """The address the client talks to."""
        return self.settings.address

    @property
    def timeout(self) -> float:
        """The deadline of each unary call, in seconds."""
        return self._connection.timeout
