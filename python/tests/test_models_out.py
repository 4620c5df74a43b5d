"""A job's trained model as PyTorch takes it today, against the real daemon: the state_dict
(safetensors) loads into the nn.Sequential a user writes for the spec and predicts what the job's
TorchScript model predicts; job.module() and job.export() (.pt2) give the same model; without
torch the state_dict is numpy; a TorchScript job's names are its module's; trainctl writes the
same file; none of it warns."""

from __future__ import annotations

import io
import json
import sys
import zipfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import trainerd
from conftest import Daemon, class_data, run_trainctl

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
nn = torch.nn


def image_data(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """1x6x6 images whose target is a weighted sum of their pixels (float32)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 1, 6, 6)).astype(np.float32)
    y = (x.reshape(rows, -1) @ rng.standard_normal((36, 2)).astype(np.float32)).astype(np.float32)
    return x, y


@pytest.fixture(scope="module")
def mlp_job(client: trainerd.Client) -> trainerd.Job:
    x, y = class_data(240, seed=8)
    client.upload("models-out-mlp", x, y)
    return client.submit(
        "models-out-mlp",
        model="linear:16,batchnorm,relu,dropout:0.2,linear:8,layernorm,tanh,linear:3",
        loss="cross_entropy",
        optimizer="adam",
        lr=0.01,
        batch_size=32,
        epochs=4,
        seed=5,
    ).wait(timeout=120)


def test_state_dict_loads_into_the_users_sequential_and_predicts_as_torchscript(
    mlp_job: trainerd.Job,
) -> None:
    assert mlp_job.state == trainerd.JobState.SUCCEEDED
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        state = mlp_job.state_dict()
    # What a user writes for that spec, by hand.
    mine = nn.Sequential(
        nn.Linear(2, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 8),
        nn.LayerNorm([8]), nn.Tanh(), nn.Linear(8, 3),
    )
    assert list(state.keys()) == list(mine.state_dict().keys())
    assert state["1.num_batches_tracked"].dtype == torch.int64
    assert int(state["1.num_batches_tracked"]) == mlp_job.steps  # one per training batch
    assert all(state[k].dtype == torch.float32 for k in state if "num_batches" not in k)
    mine.load_state_dict(state)
    mine.eval()
    assert state.metadata["trainerd.job"] == mlp_job.id
    assert state.model == "linear:16,batchnorm,relu,dropout:0.2,linear:8,layernorm,tanh,linear:3"
    assert state.feature_shape == (2,)

    xv, _ = class_data(50, seed=9)
    scripted = mlp_job.model()
    with torch.no_grad():
        expected = scripted(torch.from_numpy(xv))
        actual = mine(torch.from_numpy(xv))
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6)
    # The TorchScript archive has the same names (and values).
    assert list(scripted.state_dict().keys()) == list(state.keys())
    for k, v in scripted.state_dict().items():
        assert torch.equal(v, state[k]), k


def test_module_and_export_give_the_same_model(mlp_job: trainerd.Job, tmp_path: Path) -> None:
    xv, _ = class_data(50, seed=9)
    with torch.no_grad():
        expected = mlp_job.model()(torch.from_numpy(xv))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module = mlp_job.module()
        path = mlp_job.export(tmp_path / "mlp.pt2")
    # torch.export.load's own reader warns about a read-only buffer in torch 2.11: not ours.
    program = torch.export.load(str(path))
    assert isinstance(module, nn.Sequential)
    assert not module.training
    with torch.no_grad():
        torch.testing.assert_close(module(torch.from_numpy(xv)), expected, rtol=1e-6, atol=1e-6)
        exported = program.module()
        # The batch dimension is dynamic: one row, and fifty.
        torch.testing.assert_close(exported(torch.from_numpy(xv)), expected, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(
            exported(torch.from_numpy(xv[:1])), expected[:1], rtol=1e-6, atol=1e-6
        )
    # Into the user's own instance.
    mine = nn.Sequential(
        nn.Linear(2, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 8),
        nn.LayerNorm([8]), nn.Tanh(), nn.Linear(8, 3),
    )
    assert mlp_job.module(mine) is mine
    with torch.no_grad():
        torch.testing.assert_close(mine(torch.from_numpy(xv)), expected, rtol=1e-6, atol=1e-6)


def test_cnn_state_dict_names_and_predictions(client: trainerd.Client, tmp_path: Path) -> None:
    x, y = image_data(120, seed=1)
    client.upload("models-out-cnn", x, y)
    spec = "conv2d:4:3:1:1,batchnorm,relu,maxpool2d:2,conv2d:3:2,avgpool2d:2,flatten,linear:2"
    job = client.submit("models-out-cnn", model=spec, lr=0.01, epochs=2, seed=3).wait(timeout=120)
    assert job.state == trainerd.JobState.SUCCEEDED, job.error
    mine = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(4, 3, 2), nn.AvgPool2d(2), nn.Flatten(), nn.Linear(3, 2),
    )
    state = job.state_dict()
    assert list(state.keys()) == list(mine.state_dict().keys())
    mine.load_state_dict(state)
    mine.eval()
    xv, _ = image_data(10, seed=2)
    with torch.no_grad():
        expected = job.model()(torch.from_numpy(xv))
        torch.testing.assert_close(mine(torch.from_numpy(xv)), expected, rtol=1e-5, atol=1e-6)
        program = torch.export.load(str(job.export(tmp_path / "cnn.pt2")))
        torch.testing.assert_close(
            program.module()(torch.from_numpy(xv)), expected, rtol=1e-5, atol=1e-6
        )


def test_state_dict_without_torch_is_numpy(
    mlp_job: trainerd.Job, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_torch = mlp_job.state_dict()
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch fails
    state = mlp_job.state_dict()
    assert list(state.keys()) == list(with_torch.keys())
    for k, v in state.items():
        assert isinstance(v, np.ndarray), k
        np.testing.assert_array_equal(v, with_torch[k].numpy())
    assert state["1.num_batches_tracked"].dtype == np.int64


def test_users_module_jobs_have_its_modules_names(client: trainerd.Client) -> None:
    class Block(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(2, 8)
            self.norm = nn.BatchNorm1d(8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.norm(self.fc(x)))

    class Net(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.block = Block()
            self.head = nn.Linear(8, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.block(x))

    x, y = class_data(120, seed=10)
    client.upload("models-out-ts", x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.script's deprecation
        scripted = torch.jit.script(Net())
    # An nn.Module goes as a torch.export program, a ScriptModule as TorchScript: either way the
    # state_dict has the module's own keys in its own order.
    for model, kind in ((Net(), "exported"), (scripted, "torchscript")):
        job = client.submit(
            "models-out-ts", model=model, loss="cross_entropy", lr=0.05, epochs=2, seed=4
        ).wait(timeout=120)
        assert job.state == trainerd.JobState.SUCCEEDED, job.error
        state = job.state_dict()
        assert list(state.keys()) == list(Net().state_dict().keys())
        assert state.model == kind
        if kind == "exported":
            # The trained program as a .pt2, which torch.export.load reads.
            pt2 = job.model_bytes(format="pt2")
            assert pt2 == job.model_bytes()
            loaded = torch.export.load(io.BytesIO(pt2))
            assert set(loaded.state_dict) == set(state)
            torch.testing.assert_close(loaded.state_dict["head.weight"], state["head.weight"])
        with pytest.raises(ValueError, match=r"job.module\(MyNet\(\)\)"):
            job.module()
        mine = job.module(Net())
        xv, _ = class_data(20, seed=11)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.jit.load's, for TorchScript
            torch.testing.assert_close(
                mine(torch.from_numpy(xv)), job.model()(torch.from_numpy(xv)), rtol=1e-6,
                atol=1e-6
            )


def test_trainctl_writes_the_same_safetensors(
    daemon: Daemon, mlp_job: trainerd.Job, tmp_path: Path
) -> None:
    path = tmp_path / "model.safetensors"
    ctl = run_trainctl(
        "--addr", daemon.address, "job", "model", mlp_job.id, "--format", "safetensors",
        "-f", str(path),
    )
    assert ctl.returncode == 0, ctl.stderr
    assert f"wrote model of {mlp_job.id} to {path} (safetensors," in ctl.stdout
    assert path.read_bytes() == mlp_job.model_bytes(format="safetensors")
    loaded = safetensors_torch.load_file(str(path))
    state = mlp_job.state_dict()
    assert sorted(loaded) == sorted(state)
    for k, v in loaded.items():
        assert torch.equal(v, state[k]), k
    # The default stays TorchScript.
    default = run_trainctl("--addr", daemon.address, "job", "model", mlp_job.id, "-f",
                           str(tmp_path / "model.pt"))
    assert default.returncode == 0, default.stderr
    assert (tmp_path / "model.pt").read_bytes()[:2] == b"PK"
    bad = run_trainctl("--addr", daemon.address, "job", "model", mlp_job.id, "--format", "onnx",
                       "-f", str(tmp_path / "x"))
    assert bad.returncode == 2
    assert "--format takes torchscript, safetensors or pt2, not 'onnx'" in bad.stderr


def test_a_format_the_daemon_does_not_know_is_refused(mlp_job: trainerd.Job) -> None:
    with pytest.raises(ValueError, match="format must be 'torchscript', 'safetensors' or 'pt2'"):
        mlp_job.model_bytes(format="onnx")


def _targets(program: Any) -> list[str]:
    return [str(n.target) for n in program.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize(
    ("name", "spec"),
    [
        ("mlp", None),
        ("cnn", "conv2d:4:3:1:1,batchnorm,gelu,maxpool2d:2,conv2d:3:2,avgpool2d:2,flatten,"
                "dropout:0.3,linear:4,sigmoid,linear:2,softmax"),
    ],
)
def test_the_daemons_pt2_of_a_spec_job_is_torch_exports_own(
    daemon: Daemon, client: trainerd.Client, mlp_job: trainerd.Job, name: str, spec: str | None,
    tmp_path: Path,
) -> None:
    """The daemon writes a spec job's .pt2 (no Python there): torch.export.load of the pinned
    torch reads it, its graph is the one torch.export makes of the same nn.Sequential in eval
    mode, and it predicts as the job's module for any batch size."""
    if spec is None:
        job, xv = mlp_job, class_data(50, seed=9)[0]
    else:
        x, y = image_data(120, seed=4)
        client.upload("models-out-pt2-cnn", x, y)
        job = client.submit("models-out-pt2-cnn", model=spec, lr=0.01, epochs=2, seed=3).wait(
            timeout=120
        )
        assert job.state == trainerd.JobState.SUCCEEDED, job.error
        xv = image_data(10, seed=5)[0]
    pt2 = job.model_bytes(format="pt2")
    assert job.model_bytes(format="pt2") == pt2  # made once, kept
    program = torch.export.load(io.BytesIO(pt2))
    module = job.module()
    ours = torch.export.export(
        module, (torch.from_numpy(xv[:2]),),
        dynamic_shapes=({0: torch.export.Dim("batch")},),
    )
    assert _targets(program) == _targets(ours)
    assert program.graph_signature.parameters == ours.graph_signature.parameters
    assert program.graph_signature.buffers == ours.graph_signature.buffers
    for key, value in ours.state_dict.items():
        assert torch.equal(program.state_dict[key], value), key
    # The example input (AOTInductor compiles with it): two rows of the feature shape.
    (example,), kwargs = program.example_inputs
    assert example.shape == (2, *xv.shape[1:]) and kwargs == {}
    # The schema version is this torch's (the daemon writes the pinned torch's).
    from torch._export.serde.schema import SCHEMA_VERSION

    archive = zipfile.ZipFile(io.BytesIO(pt2))
    written = json.loads(archive.read("archive/models/model.json"))
    version = written["schema_version"]
    assert (version["major"], version["minor"]) == tuple(SCHEMA_VERSION)
    with torch.no_grad():
        expected = module(torch.from_numpy(xv))
        run = program.module()
        torch.testing.assert_close(run(torch.from_numpy(xv)), expected, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(
            run(torch.from_numpy(xv[:1])), expected[:1], rtol=1e-5, atol=1e-6
        )
    # trainctl writes the same bytes.
    path = tmp_path / f"{name}.pt2"
    done = run_trainctl("--addr", daemon.address, "job", "model", job.id, "--format", "pt2",
                        "-f", str(path))
    assert done.returncode == 0, done.stderr
    assert path.read_bytes() == pt2


def test_aio_state_dict_module_and_export(
    daemon: Daemon, mlp_job: trainerd.Job, tmp_path: Path
) -> None:
    import asyncio

    import trainerd.aio

    xv, _ = class_data(20, seed=9)
    with torch.no_grad():
        expected = mlp_job.module()(torch.from_numpy(xv))

    async def main() -> None:
        async with trainerd.aio.Client(daemon.address) as client:
            job = await client.job(mlp_job.id)
            state = await job.state_dict()
            assert list(state.keys()) == list(mlp_job.state_dict().keys())
            module = await job.module()
            path = await job.export(tmp_path / "aio.pt2")
            with torch.no_grad():
                torch.testing.assert_close(module(torch.from_numpy(xv)), expected)
                torch.testing.assert_close(
                    torch.export.load(str(path)).module()(torch.from_numpy(xv)), expected
                )
            assert (await job.model_bytes(format="safetensors")) == mlp_job.model_bytes(
                format="safetensors"
            )

    asyncio.run(main())
