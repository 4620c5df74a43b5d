"""Model downloads from a hostile daemon: a real gRPC server in the test (grpcio) whose
DownloadModel lies about the model's size. The client keeps at most the size the daemon declared,
refuses a declared size above ``max_bytes``, and stops the call at once (the server sees it
cancelled long before it ran out of chunks to send)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

import trainerd
import trainerd.aio
from trainerd.jobs import MAX_MODEL_BYTES
from trainerd.v1 import jobs_pb2

CHUNK = 1 << 20
# What the server would send if nobody stopped it: 256 chunks of 1 MiB.
BUDGET = 256
# The chunks a server may have queued before it sees a cancel (gRPC's flow-control window): far
# below the budget.
SEEN_BEFORE_CANCEL = 64


class HostileDaemon:
    """GetJob answers a succeeded job; DownloadModel declares ``declared`` bytes on its first
    chunk and then sends ``chunks`` chunks of ``chunk_bytes``, whatever it declared."""

    def __init__(self, declared: int, chunks: int = BUDGET, chunk_bytes: int = CHUNK) -> None:
        self.declared = declared
        self.chunks = chunks
        self.chunk_bytes = chunk_bytes
        self.sent = 0
        self.ended = threading.Event()
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4),
            options=[("grpc.max_send_message_length", 64 << 20)],
        )
        handlers = {
            "GetJob": grpc.unary_unary_rpc_method_handler(
                self.get_job,
                request_deserializer=jobs_pb2.GetJobRequest.FromString,
                response_serializer=jobs_pb2.Job.SerializeToString,
            ),
            "DownloadModel": grpc.unary_stream_rpc_method_handler(
                self.download_model,
                request_deserializer=jobs_pb2.DownloadModelRequest.FromString,
                response_serializer=jobs_pb2.ModelChunk.SerializeToString,
            ),
        }
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("trainerd.v1.JobService", handlers),)
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def get_job(self, request: jobs_pb2.GetJobRequest, context: Any) -> jobs_pb2.Job:
        return jobs_pb2.Job(id=request.id, state=jobs_pb2.JOB_STATE_SUCCEEDED)

    def download_model(
        self, request: jobs_pb2.DownloadModelRequest, context: Any
    ) -> Iterator[jobs_pb2.ModelChunk]:
        try:
            data = b"\x50" * self.chunk_bytes
            for i in range(self.chunks):
                if not context.is_active():
                    return
                yield jobs_pb2.ModelChunk(data=data, total_bytes=self.declared if i == 0 else 0)
                self.sent += 1
        finally:
            self.ended.set()

    def stop(self) -> None:
        self.server.stop(grace=None)


@pytest.fixture
def hostile() -> Iterator[Any]:
    daemons: list[HostileDaemon] = []

    def start(declared: int, **kwargs: int) -> HostileDaemon:
        daemons.append(HostileDaemon(declared, **kwargs))
        return daemons[-1]

    yield start
    for daemon in daemons:
        daemon.stop()


def stopped_early(daemon: HostileDaemon) -> bool:
    """The server's stream ended (the client cancelled it) before the budget was spent."""
    return daemon.ended.wait(30) and daemon.sent < SEEN_BEFORE_CANCEL


def test_more_than_declared_is_refused_and_reading_stops(hostile: Any) -> None:
    daemon = hostile(declared=100)
    with trainerd.Client(daemon.address, check_version=False) as client:
        job = client.job("job-0123456789ab")
        with pytest.raises(trainerd.DownloadRefused, match="more than the 100 bytes it declared"):
            job.model_bytes()
    assert stopped_early(daemon), daemon.sent


def test_the_last_chunk_past_the_declared_size_is_refused(hostile: Any) -> None:
    # 2.5 chunks declared: the third chunk goes past it.
    daemon = hostile(declared=2 * CHUNK + CHUNK // 2)
    with trainerd.Client(daemon.address, check_version=False) as client:
        with pytest.raises(trainerd.DownloadRefused, match=f"{3 * CHUNK} so far"):
            client.job("job-0123456789ab").model_bytes()
    assert stopped_early(daemon), daemon.sent


def test_a_declared_size_above_the_maximum_is_refused_before_reading(hostile: Any) -> None:
    daemon = hostile(declared=MAX_MODEL_BYTES + 1)
    with trainerd.Client(daemon.address, check_version=False) as client:
        job = client.job("job-0123456789ab")
        with pytest.raises(trainerd.DownloadRefused, match="pass a larger max_bytes"):
            job.model_bytes()
        small = hostile(declared=2000, chunks=1, chunk_bytes=2000)
    with trainerd.Client(small.address, check_version=False) as client:
        with pytest.raises(trainerd.DownloadRefused, match=r"max_bytes=1000\)"):
            client.job("job-0123456789ab").model_bytes(max_bytes=1000)
        assert len(client.job("job-0123456789ab").model_bytes(max_bytes=2000)) == 2000
    assert stopped_early(daemon), daemon.sent
    negative = hostile(declared=-5)
    with trainerd.Client(negative.address, check_version=False) as client:
        with pytest.raises(trainerd.DownloadRefused, match="which is no size"):
            client.job("job-0123456789ab").model_bytes()


def test_an_honest_daemon_is_downloaded_whole(hostile: Any, tmp_path: Path) -> None:
    daemon = hostile(declared=3 * CHUNK, chunks=3)
    with trainerd.Client(daemon.address, check_version=False) as client:
        job = client.job("job-0123456789ab")
        assert job.model_bytes() == b"\x50" * (3 * CHUNK)
        path = job.save_model(tmp_path / "model.pt", max_bytes=3 * CHUNK)
        assert path.read_bytes() == b"\x50" * (3 * CHUNK)
    # Fewer bytes than declared: incomplete, as before.
    short = hostile(declared=3 * CHUNK, chunks=2)
    with trainerd.Client(short.address, check_version=False) as client:
        with pytest.raises(trainerd.TrainerdError, match="arrived incomplete"):
            client.job("job-0123456789ab").model_bytes()


def test_save_model_writes_nothing_when_refused(hostile: Any, tmp_path: Path) -> None:
    daemon = hostile(declared=100)
    with trainerd.Client(daemon.address, check_version=False) as client:
        with pytest.raises(trainerd.DownloadRefused):
            client.job("job-0123456789ab").save_model(tmp_path / "model.pt")
    assert list(tmp_path.iterdir()) == []
    assert stopped_early(daemon), daemon.sent


def test_max_bytes_is_checked_before_any_call() -> None:
    client = trainerd.Client("127.0.0.1:1", check_version=False)
    job = trainerd.Job(client, jobs_pb2.Job(id="job-0123456789ab"))
    for bad in (0, -1, 1.5, True, "1GiB"):
        with pytest.raises(ValueError, match="max_bytes must be"):
            job.model_bytes(max_bytes=bad)  # type: ignore[arg-type]


def test_the_asyncio_client_is_bounded_too(hostile: Any) -> None:
    daemon = hostile(declared=100)

    async def main() -> None:
        async with trainerd.aio.Client(daemon.address, check_version=False) as client:
            job = await client.job("job-0123456789ab")
            with pytest.raises(trainerd.DownloadRefused, match="more than the 100 bytes"):
                await job.model_bytes()
            with pytest.raises(trainerd.DownloadRefused, match="max_bytes=10\\)"):
                await job.model_bytes(max_bytes=10)

    asyncio.run(main())
    assert stopped_early(daemon), daemon.sent
