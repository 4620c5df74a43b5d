"""The channel to trainerd and the calls made on it, for both clients: every RPC goes through a
transport, which adds the bearer token, sets the deadline and turns a failed call into the
:class:`~trainerd.errors.TrainerdError` of its code. :class:`Transport` makes the calls on a
``grpc.Channel`` and runs an operation's steps one after another; :class:`AioTransport` makes
them on a ``grpc.aio`` channel and awaits them (see :mod:`trainerd._rpc`)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Any, TypeVar

import grpc
import grpc.aio
from google.protobuf.message import Message

from trainerd._rpc import (
    CLIENT_TIMEOUT,
    Drain,
    Many,
    Op,
    Raw,
    Rpc,
    Runner,
    Step,
    Stream,
    Unary,
    Upload,
)
from trainerd._version import __version__
from trainerd.config import Settings
from trainerd.errors import TrainerdError, error_from_rpc

__all__ = ["AioTransport", "ServerStream", "Transport"]

# Job lists carry every epoch of every job; let them exceed gRPC's default 4 MiB (as trainctl).
MAX_RECEIVE_MESSAGE_BYTES = 256 * 1024 * 1024
# The daemon's receive limit: one SubmitJobRequest with a TorchScript module.
MAX_SEND_MESSAGE_BYTES = 64 * 1024 * 1024

ResponseT = TypeVar("ResponseT", bound=Message)
T = TypeVar("T")


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


class _Channel:
    """What both transports share: the settings, the channel's options and credentials, the
    metadata every call carries, the deadline, and the errors."""

    def __init__(self, settings: Settings, timeout: float, agent: str) -> None:
        self.settings = settings
        self.address = settings.address
        self.timeout = timeout
        self.options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", MAX_RECEIVE_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_SEND_MESSAGE_BYTES),
            ("grpc.primary_user_agent", f"{agent}/{__version__}"),
        ]
        self.credentials: grpc.ChannelCredentials | None = None
        if settings.use_tls:
            self.credentials = grpc.ssl_channel_credentials(
                root_certificates=settings.tls_ca_pem,
                private_key=settings.tls_key_pem,
                certificate_chain=settings.tls_cert_pem,
            )
            if settings.tls_server_name:
                self.options.append(("grpc.ssl_target_name_override", settings.tls_server_name))
        # The token goes into each call's metadata rather than as call credentials, which gRPC
        # sends only over TLS: a token over plaintext is legitimate on a loopback, a Unix socket
        # or behind a proxy that ends TLS (as trainctl).
        self.metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {settings.token}"),) if settings.token else ()
        )

    def deadline(self, timeout: float | None) -> float | None:
        """A step's timeout in seconds: CLIENT_TIMEOUT is the client's; None, none."""
        return self.timeout if timeout == CLIENT_TIMEOUT else timeout

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


class Transport(_Channel):
    """A ``grpc.Channel`` (connected lazily, on the first call) and the calls on it. Thread-safe
    (gRPC channels are)."""

    def __init__(self, settings: Settings, timeout: float) -> None:
        super().__init__(settings, timeout, "trainerd-python")
        self.channel: grpc.Channel = (
            grpc.secure_channel(settings.address, self.credentials, options=self.options)
            if self.credentials is not None
            else grpc.insecure_channel(settings.address, options=self.options)
        )
        self._callables: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        self.channel.close()

    def run(self, op: Op[T]) -> T:
        """Runs an operation, performing its steps in turn."""
        with Runner(op) as runner:
            for step in runner:
                with runner.answer():
                    runner.reply(self.perform(step))
        return runner.result

    def perform(self, step: Step) -> Any:
        if isinstance(step, Unary):
            return self.unary(step.rpc, step.request, timeout=step.timeout)
        if isinstance(step, Many):
            return [self.unary(c.rpc, c.request, timeout=c.timeout) for c in step.calls]
        if isinstance(step, Drain):
            with self.stream(step.stream) as messages:  # leaving it cancels the call
                for message in messages:
                    if step.each(message):
                        break
            return None
        if isinstance(step, Upload):
            return self.stream_unary(step)
        if isinstance(step, Raw):
            return self.raw_unary(step)
        return step.run()

    def _callable(self, kind: str, path: str, response_type: type[Message] | None) -> Any:
        with self._lock:
            found = self._callables.get((kind, path))
            if found is None:
                factory = getattr(self.channel, kind)
                if response_type is None:  # bytes in, bytes out
                    found = factory(path, None, None)
                else:
                    found = factory(
                        path,
                        request_serializer=_serialize,
                        response_deserializer=response_type.FromString,
                    )
                self._callables[(kind, path)] = found
            return found

    def unary(
        self, rpc: Rpc[Any, ResponseT], request: Message, *, timeout: float | None
    ) -> ResponseT:
        """Calls unary ``rpc`` and returns its response."""
        deadline = self.deadline(timeout)
        call = self._callable("unary_unary", rpc.path, rpc.response_type)
        try:
            response = call(request, timeout=deadline, metadata=self.metadata)
        except grpc.RpcError as e:
            raise self.error(e, deadline) from None
        assert isinstance(response, rpc.response_type)
        return response

    def raw_unary(self, step: Raw) -> bytes:
        deadline = self.deadline(step.timeout)
        call = self._callable("unary_unary", step.path, None)
        try:
            response = call(step.request, timeout=deadline, metadata=self.metadata)
        except grpc.RpcError as e:
            raise self.error(e, deadline) from None
        assert isinstance(response, bytes)
        return response

    def stream_unary(self, step: Upload[ResponseT]) -> ResponseT:
        call = self.channel.stream_unary(
            step.rpc.path,
            request_serializer=step.serializer,
            response_deserializer=step.rpc.response_type.FromString,
        )
        deadline = self.deadline(step.timeout)
        try:
            response = call(step.messages, timeout=deadline, metadata=self.metadata)
        except grpc.RpcError as e:
            raise self.error(e, deadline) from None
        assert isinstance(response, step.rpc.response_type)
        return response

    def stream(self, stream: Stream[ResponseT]) -> ServerStream[ResponseT]:
        """Starts a server-streaming call; iterate the result for its messages."""
        call = self._callable("unary_stream", stream.rpc.path, stream.rpc.response_type)
        deadline = self.deadline(stream.timeout)
        return ServerStream(
            self, call(stream.request, timeout=deadline, metadata=self.metadata), deadline
        )


class ServerStream(Iterator[ResponseT]):
    """The messages of a server-streaming call; a failed call raises its TrainerdError from
    ``next``. ``cancel()`` (or leaving its ``with`` block) ends the call early."""

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


class AioTransport(_Channel):
    """A ``grpc.aio`` channel and the calls on it, awaited."""

    def __init__(self, settings: Settings, timeout: float) -> None:
        super().__init__(settings, timeout, "trainerd-python-aio")
        self.channel: grpc.aio.Channel = (
            grpc.aio.secure_channel(settings.address, self.credentials, options=self.options)
            if self.credentials is not None
            else grpc.aio.insecure_channel(settings.address, options=self.options)
        )

    async def close(self) -> None:
        await self.channel.close(None)

    async def run(self, op: Op[T]) -> T:
        """Runs an operation, awaiting its steps in turn."""
        with Runner(op) as runner:
            for step in runner:
                with runner.answer():
                    runner.reply(await self.perform(step))
        return runner.result

    async def perform(self, step: Step) -> Any:
        if isinstance(step, Unary):
            return await self.unary(step.rpc, step.request, timeout=step.timeout)
        if isinstance(step, Many):
            return await asyncio.gather(
                *(self.unary(c.rpc, c.request, timeout=c.timeout) for c in step.calls)
            )
        if isinstance(step, Drain):
            async with contextlib.aclosing(self.stream(step.stream)) as messages:
                async for message in messages:
                    if step.each(message):
                        break
            return None
        if isinstance(step, Upload):
            return await self.stream_unary(step)
        if isinstance(step, Raw):
            return await self.raw_unary(step)
        return await asyncio.to_thread(step.run)

    async def unary(
        self, rpc: Rpc[Any, ResponseT], request: Message, *, timeout: float | None
    ) -> ResponseT:
        deadline = self.deadline(timeout)
        call = self.channel.unary_unary(
            rpc.path,
            request_serializer=_serialize,
            response_deserializer=rpc.response_type.FromString,
        )
        try:
            response = await call(request, timeout=deadline, metadata=self.metadata)
        except grpc.RpcError as e:
            raise self.error(e, deadline) from None
        assert isinstance(response, rpc.response_type)
        return response

    async def raw_unary(self, step: Raw) -> bytes:
        deadline = self.deadline(step.timeout)
        call = self.channel.unary_unary(step.path, None, None)
        try:
            response = await call(step.request, timeout=deadline, metadata=self.metadata)
        except grpc.RpcError as e:
            raise self.error(e, deadline) from None
        assert isinstance(response, bytes)
        return response

    async def stream_unary(self, step: Upload[ResponseT]) -> ResponseT:
        call = self.channel.stream_unary(
            step.rpc.path,
            request_serializer=step.serializer,
            response_deserializer=step.rpc.response_type.FromString,
        )
        deadline = self.deadline(step.timeout)
        try:
            response = await call(
                _in_thread(step.messages), timeout=deadline, metadata=self.metadata
            )
        except grpc.RpcError as e:
            raise self.error(e, deadline) from None
        assert isinstance(response, step.rpc.response_type)
        return response

    async def stream(self, stream: Stream[ResponseT]) -> AsyncGenerator[ResponseT, None]:
        """The messages of a server-streaming call; the call ends when the iteration does."""
        call = self.channel.unary_stream(
            stream.rpc.path,
            request_serializer=_serialize,
            response_deserializer=stream.rpc.response_type.FromString,
        )(stream.request, timeout=self.deadline(stream.timeout), metadata=self.metadata)
        had_replies = False
        try:
            async for message in call:
                had_replies = True
                yield message
        except grpc.RpcError as e:
            raise self.error(e, self.deadline(stream.timeout), had_replies) from None
        finally:
            call.cancel()


async def _in_thread(items: Iterator[Any]) -> AsyncIterator[Any]:
    """``items``, each taken in a worker thread (taking one reads data)."""
    done = object()
    while True:
        item = await asyncio.to_thread(_next_or, items, done)
        if item is done:
            return
        yield item


def _next_or(items: Iterator[Any], default: object) -> Any:
    return next(items, default)

