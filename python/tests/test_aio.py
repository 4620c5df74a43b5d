"""trainerd.aio: the same calls on grpc.aio, against the real daemon."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

import trainerd
import trainerd.aio
from conftest import Daemon, class_data, seed_data


def test_aio_upload_submit_watch_wait_and_model(daemon: Daemon, name: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with trainerd.aio.Client(daemon.address) as client:
            assert (await client.version()).trainerd == trainerd.__version__
            assert await client.health() == "SERVING"
            assert any(d.device == "cpu" for d in await client.devices())
            x, y = class_data(120)
            ds = await client.upload(name, x, y)
            assert (ds.rows, ds.target_dtype) == (120, "int64")
            assert name in [d.name for d in await client.datasets()]
            job = await client.submit(
                ds, model="linear:3", loss="cross_entropy", lr=0.1, epochs=6, seed=1
            )
            epochs = [e.epoch async for e in job.watch()]
            assert epochs == [1, 2, 3, 4, 5, 6]
            assert job.state == trainerd.JobState.SUCCEEDED
            await job.wait()
            assert [e.epoch for e in job.history] == epochs
            assert job.report.verdict
            assert (await client.job(job.id)).final_loss == job.final_loss
            assert job.id in [j.id for j in await client.jobs(dataset=name)]
            data = await job.model_bytes()
            assert data[:2] == b"PK"
            saved = await job.save_model(tmp_path / "m.pt")
            assert saved.read_bytes() == data
            pytest.importorskip("torch")
            model = await job.model()
            assert tuple(model(__import__("torch").from_numpy(x[:4])).shape) == (4, 3)

    asyncio.run(main())


def test_aio_failures_cancel_and_sweep(daemon: Daemon, name: str) -> None:
    async def main() -> None:
        async with trainerd.aio.Client(daemon.address) as client:
            x, y = seed_data(80)
            await client.upload(name, x, y)
            failing = await client.submit(name, model="linear:1", lr=1e6, epochs=50, batch_size=16)
            with pytest.raises(trainerd.JobFailed, match="loss became"):
                await failing.wait(timeout=60)
            long = await client.submit(name, model="linear:1", epochs=1_000_000)
            with pytest.raises(TimeoutError):
                await long.wait(timeout=0.2)
            await long.cancel()
            with pytest.raises(trainerd.JobCancelled):
                await long.wait()
            await long.delete()
            with pytest.raises(trainerd.NotFound):
                await client.job(long.id)
            sweep = await client.sweep(name, model="linear:1", lr=[0.1, 0.03], seed=[1, 2], epochs=3)
            await sweep.wait(timeout=60)
            assert sweep.ended and len(sweep.succeeded) == 4
            assert sweep.best().spec.optimizer.learning_rate in (0.1, 0.03)
            again = await client.get_sweep(sweep.id)
            assert [j.id for j in again.jobs] == [j.id for j in sweep.jobs]
            assert (await again.wait()).best().id == sweep.best().id
            with pytest.raises(trainerd.NotFound, match="sweep-000000000000"):
                await client.get_sweep("sweep-000000000000")
            with pytest.raises(trainerd.InvalidArgument, match="linear:3"):
                await client.submit(name, model="linear:3")
            with pytest.raises(ValueError, match="NaN"):
                await client.upload(name + "-bad", np.array([[np.nan, 1.0]]), np.ones(1))

    asyncio.run(main())


def test_aio_unreachable_is_unavailable() -> None:
    async def main() -> None:
        client = trainerd.aio.Client("127.0.0.1:1", timeout=5)
        with pytest.raises(trainerd.Unavailable, match="127.0.0.1:1"):
            await client.datasets()
        await client.close()

    asyncio.run(main())
