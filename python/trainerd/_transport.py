"""The channel to trainerd and the calls made on it: every RPC of the client goes through
:class:`Transport`, which adds the bearer token, sets the deadline and turns a failed call into
the :class:`~trainerd.errors.TrainerdError` of its code."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from trainerd._version import __version__
from trainerd.config import Settings
from trainerd.errors import TrainerdError, error_from_rpc

__all__ = ["Transport"]

# Job lists carry every epoch of every job; let them exceed gRPC's default 4 MiB (as trainctl).
MAX_RECEIVE_MESSAGE_BYTES = 256 * 1024 * 1024
# The daemon's receive limit: one SubmitJobRequest with a TorchScript module.
MAX_SEND_MESSAGE_BYTES = 64 * 1024 * 1024

ResponseT = TypeVar("ResponseT", bound=Message)


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


def create_channel(settings: Settings) -> grpc.Channel:
    """The channel to ``settings.address``: TLS when the settings ask for it, plaintext otherwise.
    Connects lazily, on the first call."""
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", MAX_RECEIVE_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_SEND_MESSAGE_BYTES),
        ("grpc.primary_user_agent", f"trainerd-python/{__version__}"),
    ]
    if settings.use_tls:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=settings.tls_ca_pem,
            private_key=settings.tls_key_pem,
            certificate_chain=settings.tls_cert_pem,
        )
        if settings.tls_server_name:
            options.append(("grpc.ssl_target_name_override", settings.tls_server_name))
        return grpc.secure_channel(settings.address, credentials, options=options)
    return grpc.insecure_channel(settings.address, options=options)


class Transport:
    """The channel and the typed calls on it. Thread-safe (gRPC channels are)."""

    def __init__(self, settings: Settings, timeout: float) -> None:
        self.settings = settings
        self.address = settings.address
        self.timeout = timeout
        self.channel = create_channel(settings)
        # The token goes into each call's metadata rather than as call credentials, which gRPC
        # sends only over TLS: a token over plaintext is legitimate on a loopback, a Unix socket
        # or behind a proxy that ends TLS (as trainctl).
        self.metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {settings.token}"),) if settings.token else ()
        )
        self._callables: dict[str, Any] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        self.channel.close()

    def error(
        self, error: grpc.RpcError, timeout: float | None, had_replies: bool = False
    ) -> TrainerdError:
        """The exception for a failed call."""
        return error_from_rpc(
            error,
            address=self.address,
            timeout=timeout,
            uses_tls=self.settings.use_tls,
            has_token=bool(self.settings.token),
            has_certificate=self.settings.tls_cert_pem is not None,
            had_replies=had_replies,
        )

    def _callable(self, kind: str, method: str, response_type: type[Message]) -> Any:
        key = f"{kind} {method}"
        with self._lock:
            found = self._callables.get(key)
            if found is None:
                factory = getattr(self.channel, kind)
                found = factory(
                    method,
                    request_serializer=_serialize,
                    response_deserializer=response_type.FromString,
                )
                self._callables[key] = found
            return found

    def unary(
        self,
        method: str,
        request: Message,
        response_type: type[ResponseT],
        *,
        timeout: float | None = -1.0,
    ) -> ResponseT:
        """Calls unary ``method`` ("/trainerd.v1.JobService/GetJob") and returns its response.
        ``timeout`` -1 means the client's; None means no deadline."""
        deadline = self.timeout if timeout is not None and timeout < 0 else timeout
        call = self._callable("unary_unary", method, response_type)
        try:
            response = call(request, timeout=deadline, metadata=self.metadata)
        except grpc.RpcError as e:
            raise self.error(e, deadline) from None
        assert isinstance(response, response_type)
        return response

    def stream_unary(
        self,
        method: str,
        requests: Iterator[Any],
        response_type: type[ResponseT],
        *,
        timeout: float | None,
        serializer: Callable[[Any], bytes] = _serialize,
    ) -> ResponseT:
        """Calls client-streaming ``method`` with the messages ``requests`` yields, each turned
        into bytes by ``serializer``."""
        call = self.channel.stream_unary(
            method,
            request_serializer=serializer,
            response_deserializer=response_type.FromString,
        )
        try:
            response = call(requests, timeout=timeout, metadata=self.metadata)
        except grpc.RpcError as e:
            raise self.error(e, timeout) from None
        assert isinstance(response, response_type)
        return response

    def unary_stream(
        self,
        method: str,
        request: Message,
        response_type: type[ResponseT],
        *,
        timeout: float | None,
    ) -> ServerStream[ResponseT]:
        """Starts server-streaming ``method``; iterate the result for its messages."""
        call = self._callable("unary_stream", method, response_type)
        return ServerStream(self, call(request, timeout=timeout, metadata=self.metadata), timeout)

    def raw_unary(self, method: str, request: bytes, *, timeout: float | None) -> bytes:
        """A unary call with hand-encoded messages (the health service, whose generated code the
        package does not carry)."""
        key = f"raw {method}"
        with self._lock:
            call = self._callables.get(key)
            if call is None:
                call = self.channel.unary_unary(method, None, None)
                self._callables[key] = call
        try:
            response = call(request, timeout=timeout, metadata=self.metadata)
        except grpc.RpcError as e:
            raise self.error(e, timeout) from None
        assert isinstance(response, bytes)
        return response


class ServerStream(Iterator[ResponseT]):
    """The messages of a server-streaming call; a failed call raises its TrainerdError from
    ``next``. ``cancel()`` ends the call early."""

    def __init__(self, transport: Transport, call: Any, timeout: float | None) -> None:
        self._transport = transport
        self._call = call
        self._timeout = timeout
        self.had_replies = False

    def __iter__(self) -> ServerStream[ResponseT]:
        return self

    def __next__(self) -> ResponseT:
        try:
            message: ResponseT = next(self._call)
        except StopIteration:
            raise
        except grpc.RpcError as e:
            raise self._transport.error(e, self._timeout, self.had_replies) from None
        self.had_replies = True
        return message

    def cancel(self) -> None:
        self._call.cancel()

    def __enter__(self) -> ServerStream[ResponseT]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()
