"""A data-parallel job (``replicas=``) from Python against the real daemon: it trains as one rank
with the global batch does, says where its ranks ran, and its downloaded model loads in torch and
predicts what the daemon reported."""

from __future__ import annotations

import pytest

import trainerd
from conftest import seed_data

UNREACHABLE = "127.0.0.1:1"


def test_replicas_train_as_the_global_batch_and_the_model_loads(
    client: trainerd.Client, name: str
) -> None:
    torch = pytest.importorskip("torch")
    x, y = seed_data(320, seed=8)
    client.upload(name, x, y)
    common = dict(
        model="linear:8,tanh,linear:1",
        optimizer="adam",
        lr=0.01,
        epochs=5,
        seed=13,
        validation_fraction=0.25,
        engine="libtorch",
    )
    one = client.submit(name, batch_size=30, **common).wait()  # type: ignore[arg-type]
    ranks = client.submit(name, batch_size=10, replicas=3, **common).wait()  # type: ignore[arg-type]

    assert ranks.replicas == 3
    assert ranks.global_batch_size == 30
    assert one.replicas == 1 and one.ranks == []
    assert [(r, device) for r, device, _ in ranks.ranks] == [(0, "cpu"), (1, "cpu"), (2, "cpu")]
    assert ranks.report.collective_seconds > 0
    html = ranks._repr_html_()
    assert "10 per rank, 30 global" in html and "2: cpu on " in html
    for mine, reference in zip(ranks.history, one.history, strict=True):
        assert mine.loss == pytest.approx(reference.loss, rel=1e-5)
        assert mine.validation_loss == pytest.approx(reference.validation_loss, rel=1e-5)

    # The model rank 0 exported predicts, on the held-out rows, the validation loss reported.
    model = ranks.model()
    held_out = torch.from_numpy(ranks.validation_rows())
    with torch.no_grad():
        predictions = model(torch.from_numpy(x)[held_out])
    mse = float(torch.mean((predictions - torch.from_numpy(y)[held_out]) ** 2))
    assert mse == pytest.approx(ranks.history[-1].validation_loss, rel=1e-5)


def test_replicas_are_refused_with_the_daemons_reason(
    client: trainerd.Client, seed_dataset: trainerd.Dataset
) -> None:
    offline = trainerd.Client(UNREACHABLE)
    # 0 is how the request says "one rank": not what replicas=0 asks.
    with pytest.raises(ValueError, match="replicas=0 cannot be sent: .*one rank"):
        offline.submit("seed", model="linear:1", replicas=0)
    with pytest.raises(TypeError, match="nodes must be a list"):
        offline.submit("seed", model="linear:1", replicas=2, nodes="127.0.0.1:1")
    with pytest.raises(trainerd.InvalidArgument, match=r"replicas must be >= 1 .*got -1"):
        client.submit("seed", model="linear:1", replicas=-1)
    with pytest.raises(trainerd.InvalidArgument, match=r"give replicas \(at least 2\) too"):
        client.submit("seed", model="linear:1", nodes=["127.0.0.1:1"])
    # The test daemon has no --peers.
    with pytest.raises(trainerd.FailedPrecondition, match="has no peers"):
        client.submit("seed", model="linear:1", replicas=2, nodes=["127.0.0.1:1"])
    # "all" is every peer the daemon knows: sent as "*", and this one knows none.
    with pytest.raises(trainerd.FailedPrecondition, match=r"cannot run ranks on \*"):
        client.submit("seed", model="linear:1", replicas=2, nodes="all")
    # A sweep's nodes without replicas spread its members: sent, and refused by this daemon.
    with pytest.raises(trainerd.FailedPrecondition, match="has no peers"):
        client.sweep("seed", model="linear:1", lr=[0.1, 0.01], nodes=["127.0.0.1:1"])
    with pytest.raises(trainerd.InvalidArgument, match="ranks train in float32"):
        client.submit("seed", model="linear:1", replicas=2, precision="bf16")
