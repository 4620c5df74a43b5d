"""The best epoch kept (``model_from``) and checkpoints downloaded by their owner, against the
real daemon: the model a job hands back scores its best epoch's recorded validation loss on the
held-out rows, ``model_epoch`` says which epoch it is from, and ``job.checkpoints()`` /
``job.checkpoint()`` list and download the checkpoint files."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

import trainerd
import trainerd.aio
from trainerd.v1 import jobs_pb2
from conftest import Daemon

UNREACHABLE = "127.0.0.1:1"


def noise_data(rows: int = 48, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """4 standard-normal features and a noisy target: a wide model fits the noise, so the
    validation loss falls for a few epochs and then climbs."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 4)).astype(np.float32)
    y = (np.sin(x[:, :1]) + 0.5 * rng.standard_normal((rows, 1))).astype(np.float32)
    return x, y


WIDE = "linear:64,relu,linear:64,relu,linear:1"


def held_out_mse(job: trainerd.Job, x: np.ndarray, y: np.ndarray) -> float:
    torch = pytest.importorskip("torch")
    rows = job.validation_rows(len(x))
    with torch.no_grad():
        out = job.model()(torch.from_numpy(x[rows]))
    return float(torch.mean((out - torch.from_numpy(y[rows])) ** 2))


def test_early_stopping_hands_back_the_best_epoch(client: trainerd.Client, name: str) -> None:
    pytest.importorskip("torch")
    x, y = noise_data()
    client.upload(name, x, y)
    options = dict(
        model=WIDE, lr=0.05, momentum=0.9, batch_size=8, epochs=40, validation_fraction=0.25,
        early_stop_patience=4, seed=11,
    )
    job = client.submit(name, **options).wait(timeout=120)  # type: ignore[arg-type]
    assert job.stopped_early, "the validation loss never turned up"
    history = job.history
    assert job.best_epoch == len(history) - 4
    assert job.model_epoch == job.best_epoch
    best = history[job.best_epoch - 1].validation_loss
    last = history[-1].validation_loss
    assert best is not None and last is not None and last > best * 1.001
    assert held_out_mse(job, x, y) == pytest.approx(best, rel=1e-5)
    assert f"model_epoch={job.best_epoch}" in repr(job)
    assert "model from" in job._repr_html_()

    last_job = client.submit(name, model_from="last", **options).wait(  # type: ignore[arg-type]
        timeout=120
    )
    assert last_job.spec.model_from == jobs_pb2.MODEL_FROM_LAST
    assert last_job.model_epoch == len(last_job.history) == len(history)
    assert held_out_mse(last_job, x, y) == pytest.approx(last, rel=1e-5)

    # model_from="best" without early stopping: every epoch runs, the lowest validation loss wins.
    options.pop("early_stop_patience")
    options["epochs"] = 20
    every = client.submit(name, model_from="best", **options).wait(  # type: ignore[arg-type]
        timeout=120
    )
    losses = [e.validation_loss for e in every.history]
    assert len(losses) == 20
    lowest = min(range(20), key=lambda i: (losses[i], i)) + 1
    assert every.model_epoch == every.best_epoch == lowest < 20
    assert held_out_mse(every, x, y) == pytest.approx(losses[lowest - 1], rel=1e-5)


def test_model_from_is_checked(client: trainerd.Client, seed_dataset: trainerd.Dataset) -> None:
    # Whether it goes with the spec is the daemon's to say; its names, the client's.
    with pytest.raises(trainerd.InvalidArgument, match="model_from best hands back the best"):
        client.submit("seed", model="linear:1", model_from="best")
    offline = trainerd.Client(UNREACHABLE)
    with pytest.raises(ValueError, match="model_from: unknown choice 'first'"):
        offline.submit("seed", model="linear:1", model_from="first")
    with pytest.raises(TypeError, match="model_from must be a str"):
        offline.submit("seed", model="linear:1", model_from=2)  # type: ignore[arg-type]


def test_checkpoints_list_and_download(
    client: trainerd.Client, name: str, tmp_path: Path
) -> None:
    x, y = noise_data()
    client.upload(name, x, y)
    job = client.submit(
        name, model="linear:8,relu,linear:1", epochs=4, checkpoint_every=2,
        validation_fraction=0.25, model_from="best", seed=3,
    ).wait(timeout=60)
    listed = job.checkpoints()
    assert [c.epoch for c in listed] == [2, 4]
    assert all(c.size_bytes > 0 and c.create_time is not None for c in listed)
    newest = job.checkpoint(path=tmp_path / "newest.pt")
    assert newest.stat().st_size == listed[-1].size_bytes
    second = job.checkpoint_bytes(2)
    assert len(second) == listed[0].size_bytes and second[:2] == b"PK"
    assert job.checkpoint(2, path=tmp_path / "second.pt").read_bytes() == second
    with pytest.raises(trainerd.NotFound, match="has no checkpoint of epoch 3; it has epochs 2, 4"):
        job.checkpoint_bytes(3)
    with pytest.raises(ValueError, match="epoch must be a checkpoint's epoch"):
        job.checkpoint_bytes(0)
    with pytest.raises(trainerd.DownloadRefused, match="checkpoint of job"):
        job.checkpoint_bytes(max_bytes=10)
    # The file is LibTorch's serialize archive, which torch.jit.load opens: the loop's state under
    # "meta", the model under "model", the best epoch's weights under "best_model".
    torch = pytest.importorskip("torch")
    archive = torch.jit.load(str(newest))
    assert int(archive.meta.epoch) == 4
    assert int(archive.meta.best_epoch) == job.best_epoch
    best_weight = getattr(archive.best_model, "0")
    assert tuple(best_weight.shape) == (8, 4)


def test_aio_checkpoints(daemon: Daemon, name: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with trainerd.aio.Client(daemon.address) as client:
            x, y = noise_data()
            await client.upload(name, x, y)
            job = await client.submit(
                name, model="linear:1", epochs=2, checkpoint_every=1, seed=1
            )
            await job.wait()
            assert job.model_epoch == 2 and job.best_epoch == 0
            listed = await job.checkpoints()
            assert [c.epoch for c in listed] == [1, 2]
            data = await job.checkpoint_bytes(1)
            assert len(data) == listed[0].size_bytes
            saved = await job.checkpoint(path=tmp_path / "c.pt")
            assert saved.stat().st_size == listed[1].size_bytes
            with pytest.raises(trainerd.NotFound, match="it has epochs 1, 2"):
                await job.checkpoint_bytes(5)

    asyncio.run(main())
