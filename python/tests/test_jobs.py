"""Jobs against the real daemon: submit, wait and watch to SUCCEEDED, FAILED and CANCELLED, the
history, the report, the trained model in torch, listing, what the client refuses before sending
(what a request cannot carry) and what the daemon refuses (the spec's checks)."""

from __future__ import annotations

import io
import uuid
import zipfile
from pathlib import Path

import pytest

import trainerd
from trainerd._display import report_rows
from trainerd.v1 import jobs_pb2
from conftest import class_data, seed_data

UNREACHABLE = "127.0.0.1:1"


def test_submit_wait_succeeds_with_history(
    client: trainerd.Client, seed_dataset: trainerd.Dataset
) -> None:
    job = client.submit(seed_dataset, model="linear:1", lr=0.1, batch_size=16, epochs=30, seed=7)
    assert job.id.startswith("job-")
    assert job.proto.state in (1, 2, 3)  # queued, running or (already) succeeded
    assert job.wait(timeout=60) is job
    assert job.state == trainerd.JobState.SUCCEEDED
    assert job.ended
    assert job.seed == 7
    assert job.spec.optimizer.learning_rate == 0.1
    assert job.spec.batch_size == 16
    history = job.history
    assert [e.epoch for e in history] == list(range(1, 31))
    assert history[-1].loss < history[0].loss
    assert history[-1].loss == pytest.approx(job.final_loss)
    assert history[-1].validation_loss is None
    assert job.report.verdict
    assert job.report.host_syncs == job.proto.host_syncs
    weights = job.parameters
    assert weights["0.weight"].shape == (1, 1)
    assert weights["0.weight"][0, 0] == pytest.approx(2.0, abs=0.3)
    assert weights["0.bias"][0] == pytest.approx(1.0, abs=0.3)
    assert "SUCCEEDED" in repr(job)


def test_history_frame(client: trainerd.Client, seed_dataset: trainerd.Dataset) -> None:
    pytest.importorskip("pandas")
    job = client.submit(
        "seed", model="linear:1", lr=0.1, epochs=4, validation_fraction=0.25, seed=1
    ).wait()
    frame = job.history_frame()
    assert list(frame.index) == [1, 2, 3, 4]
    assert {"loss", "validation_loss", "learning_rate"} <= set(frame.columns)
    assert frame["validation_loss"].notna().all()


def test_watch_yields_every_epoch_once(
    client: trainerd.Client, seed_dataset: trainerd.Dataset
) -> None:
    job = client.submit("seed", model="linear:1", lr=0.1, epochs=12, seed=3)
    epochs = list(job.watch())
    assert [e.epoch for e in epochs] == list(range(1, 13))
    assert job.state == trainerd.JobState.SUCCEEDED
    # A late watcher gets the whole history.
    assert [e.epoch for e in job.watch()] == list(range(1, 13))
    assert [e.loss for e in job.watch()] == [e.loss for e in job.history]


def test_diverging_job_fails_with_the_daemons_reason(
    client: trainerd.Client, seed_dataset: trainerd.Dataset
) -> None:
    job = client.submit("seed", model="linear:1", lr=1e6, epochs=50, batch_size=16)
    with pytest.raises(trainerd.JobFailed, match="loss became") as failure:
        job.wait(timeout=60)
    assert failure.value.job is job
    assert "loss became" in failure.value.reason
    assert job.state == trainerd.JobState.FAILED
    assert job.error == failure.value.reason
    # watch ends too, without raising; wait(check=False) returns the job.
    list(job.watch())
    assert job.wait(check=False).state == trainerd.JobState.FAILED
    with pytest.raises(trainerd.FailedPrecondition):
        job.model()


def test_cancelled_job(client: trainerd.Client, seed_dataset: trainerd.Dataset) -> None:
    job = client.submit("seed", model="linear:1", lr=0.01, epochs=1_000_000)
    job.cancel()
    with pytest.raises(trainerd.JobCancelled):
        job.wait(timeout=60)
    assert job.state == trainerd.JobState.CANCELLED
    with pytest.raises(trainerd.FailedPrecondition):
        job.cancel()
    job.delete()
    with pytest.raises(trainerd.NotFound):
        client.job(job.id)


def test_wait_times_out(client: trainerd.Client, seed_dataset: trainerd.Dataset) -> None:
    job = client.submit("seed", model="linear:1", lr=0.01, epochs=1_000_000)
    try:
        with pytest.raises(TimeoutError):
            job.wait(timeout=0.3)
        with pytest.raises(trainerd.FailedPrecondition):
            job.delete()  # still running
    finally:
        job.cancel()
        job.wait(check=False)


def test_model_predicts_what_the_daemon_reported(
    client: trainerd.Client, name: str, tmp_path: Path
) -> None:
    torch = pytest.importorskip("torch")
    x, y = seed_data(300, seed=5)
    xv, yv = seed_data(100, seed=6)
    client.upload(name, x, y)
    client.upload(name + "-val", xv, yv)
    job = client.submit(
        name,
        model="linear:8,relu,linear:1",
        optimizer="adam",
        lr=0.01,
        epochs=15,
        validation_dataset=name + "-val",
        seed=11,
    ).wait()
    model = job.model()
    with torch.no_grad():
        predictions = model(torch.from_numpy(xv))
    mse = float(torch.mean((predictions - torch.from_numpy(yv)) ** 2))
    reported = job.history[-1].validation_loss
    assert reported is not None
    assert mse == pytest.approx(reported, rel=1e-5)

    saved = job.save_model(tmp_path / "model.pt")
    assert saved.read_bytes() == job.model_bytes()
    loaded = torch.jit.load(str(saved))
    with torch.no_grad():
        assert torch.equal(loaded(torch.from_numpy(xv)), predictions)


def test_classifier_accuracy_matches_the_daemons(client: trainerd.Client, name: str) -> None:
    torch = pytest.importorskip("torch")
    x, y = class_data(300)
    xv, yv = class_data(90, seed=4)
    client.upload(name, x, y)
    client.upload(name + "-val", xv, yv)
    job = client.submit(
        name,
        model="linear:16,relu,linear:3",
        loss="cross_entropy",
        optimizer="adam",
        lr=0.02,
        epochs=10,
        validation_dataset=name + "-val",
        seed=2,
    ).wait()
    last = job.history[-1]
    with torch.no_grad():
        logits = job.model()(torch.from_numpy(xv))
    accuracy = float((logits.argmax(dim=1) == torch.from_numpy(yv)).float().mean())
    assert last.validation_accuracy == pytest.approx(accuracy, abs=1e-6)
    loss = float(torch.nn.functional.cross_entropy(logits, torch.from_numpy(yv)))
    assert last.validation_loss == pytest.approx(loss, rel=1e-5)


def test_model_without_torch_is_bytes(
    client: trainerd.Client, seed_dataset: trainerd.Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = client.submit("seed", model="linear:1", epochs=1).wait()
    monkeypatch.setitem(__import__("sys").modules, "torch", None)  # import torch fails
    data = job.model()
    assert isinstance(data, bytes)
    assert data[:2] == b"PK"  # a TorchScript archive is a ZIP file


def test_torch_module_is_exported_and_trained(
    client: trainerd.Client, seed_dataset: trainerd.Dataset, tmp_path: Path
) -> None:
    torch = pytest.importorskip("torch")

    class Affine(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(1, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(x)

    # An nn.Module goes as an exported program (torch.export), a ScriptModule as TorchScript.
    job = client.submit("seed", model=Affine(), lr=0.1, epochs=20, seed=1).wait(timeout=120)
    assert job.spec.model.startswith("exported (")
    # Its worker's sandbox, as measured before the module reached it, in the report and its view.
    sandbox = job.report.worker_sandbox
    assert sandbox.program == "trainerd-worker"
    assert sandbox.seccomp and sandbox.no_new_privileges and sandbox.not_dumpable
    shown = dict(report_rows(job))["sandbox"]
    assert "seccomp, no new privileges, not dumpable" in shown
    trained = job.model()
    with torch.no_grad():
        out = trained(torch.tensor([[0.0], [1.0]]))
    assert float(out[1] - out[0]) == pytest.approx(2.0, abs=0.4)

    # The same module from a file, by path: TorchScript, and an exported program.
    path = tmp_path / "affine.pt"
    torch.jit.script(Affine()).save(str(path))
    job2 = client.submit("seed", model=path, lr=0.1, epochs=2)
    assert job2.wait(timeout=120).state == trainerd.JobState.SUCCEEDED
    assert job2.spec.model.startswith("torchscript (")
    exported = tmp_path / "affine.pt2"
    torch.export.save(
        torch.export.export(
            Affine(), (torch.zeros(2, 1),),
            dynamic_shapes=({0: torch.export.Dim("batch", min=1)},),
        ),
        str(exported),
    )
    job3 = client.submit("seed", model=exported, lr=0.1, epochs=2)
    assert job3.wait(timeout=120).state == trainerd.JobState.SUCCEEDED
    assert job3.spec.model.startswith("exported (")
    # Its download is the .pt2 with the trained weights, which torch.export.load reads.
    program = torch.export.load(io.BytesIO(job3.model_bytes()))
    assert set(program.state_dict) == {"linear.weight", "linear.bias"}
    assert torch.equal(program.state_dict["linear.weight"],
                       torch.from_numpy(job3.parameters["linear.weight"]))


def test_unexportable_module_is_a_clear_error() -> None:
    torch = pytest.importorskip("torch")
    from trainerd._model_input import model_argument

    class Dynamic(torch.nn.Module):  # type: ignore[misc]
        def forward(self, x):  # type: ignore[no-untyped-def]
            if x.sum() > 0:  # data-dependent control flow: torch.export refuses it
                return x
            return -x

    module = Dynamic()
    module.eval()
    with pytest.raises(TypeError, match="cannot export the model"):
        model_argument(module, lambda: (3,))
    assert not module.training  # its own mode is given back


def test_jobs_lists_filters_and_pages(
    client: trainerd.Client, seed_dataset: trainerd.Dataset, name: str
) -> None:
    x, y = seed_data(20)
    client.upload(name, x, y)
    ids = [client.submit(name, model="linear:1", epochs=1, seed=i).id for i in range(5)]
    for job_id in ids:
        client.job(job_id).wait()
    listed = client.jobs(dataset=name)
    assert [j.id for j in listed] == ids  # oldest first
    newest = client.jobs(dataset=name, limit=2)
    assert [j.id for j in newest] == ids[-2:]
    assert all(j.dataset == name for j in client.jobs(state="succeeded", dataset=name))
    assert client.jobs(state=trainerd.JobState.FAILED, dataset=name) == []
    # Pages: three of 2 jobs' worth, followed to the end.
    request_pages: list[int] = []
    original = client._transport.unary  # noqa: SLF001

    def counting(rpc, request, **kwargs):  # type: ignore[no-untyped-def]
        if rpc.path.endswith("/ListJobs"):
            request_pages.append(request.page_size)
        return original(rpc, request, **kwargs)

    client._transport.unary = counting  # type: ignore[method-assign]  # noqa: SLF001
    try:
        import trainerd._calls as module

        old_page = module.LIST_PAGE
        module.LIST_PAGE = 2
        try:
            assert [j.id for j in client.jobs(dataset=name)] == ids
        finally:
            module.LIST_PAGE = old_page
    finally:
        del client._transport.unary  # noqa: SLF001
    assert request_pages == [2, 2, 2]
    with pytest.raises(ValueError, match="state"):
        client.jobs(state="done")


# --- The spec -------------------------------------------------------------------------------


def test_spec_defaults_are_the_daemons(
    client: trainerd.Client, seed_dataset: trainerd.Dataset
) -> None:
    # The request leaves every default to the daemon, which fills in trainctl's values (SGD at
    # 0.01, batches of 32, 10 epochs) and reports them. An argument given at its default is not
    # sent either.
    sent: list[jobs_pb2.SubmitJobRequest] = []
    original = client._transport.unary  # noqa: SLF001

    def recording(rpc, request, **kwargs):  # type: ignore[no-untyped-def]
        if rpc.path.endswith("/SubmitJob"):
            sent.append(request)
        return original(rpc, request, **kwargs)

    client._transport.unary = recording  # type: ignore[method-assign]  # noqa: SLF001
    try:
        job = client.submit("seed", model="linear:1", shuffle=True, precision="fp32", lr=0.01)
    finally:
        del client._transport.unary  # noqa: SLF001
    assert sent[0].spec == jobs_pb2.JobSpec(dataset="seed", model="linear:1")
    spec = job.spec
    assert spec.loss == "mse"
    assert spec.optimizer.kind == "sgd"
    assert spec.optimizer.learning_rate == 0.01
    assert spec.batch_size == 32
    assert spec.epochs == 10
    assert spec.shuffle is True
    assert spec.seed != 0 or spec.HasField("seed")  # picked by the daemon and reported
    job.wait()


def test_spec_options_reach_the_daemon(
    client: trainerd.Client, seed_dataset: trainerd.Dataset
) -> None:
    job = client.submit(
        "seed",
        model="linear:4,tanh,linear:1",
        loss="huber",
        huber_delta=0.5,
        optimizer="rmsprop",
        lr=0.003,
        momentum=0.5,
        alpha=0.9,
        eps=1e-7,
        weight_decay=0.01,
        schedule="step",
        step_epochs=2,
        gamma=0.5,
        warmup_epochs=1,
        clip_grad_norm=1.0,
        batch_size=8,
        epochs=4,
        validation_fraction=0.2,
        early_stop_patience=3,
        checkpoint_every=2,
        precision="fp32",
        priority="high",
        engine="libtorch",
        seed=5,
        device="cpu",
        shuffle=False,
    ).wait()
    spec = job.spec
    assert spec.huber_delta == 0.5
    assert spec.optimizer.alpha == pytest.approx(0.9)
    assert spec.optimizer.momentum == 0.5
    assert spec.schedule.step_epochs == 2
    assert spec.schedule.gamma == 0.5
    assert spec.validation_fraction == pytest.approx(0.2)
    assert spec.checkpoint_every == 2
    assert spec.shuffle is False
    assert job.report.engine == "libtorch"
    assert len(job.proto.checkpoints) == 2
    assert [e.learning_rate for e in job.history][:2] == pytest.approx([0.0015, 0.003])


def test_new_optimizer_options_reach_the_daemon(
    client: trainerd.Client, seed_dataset: trainerd.Dataset
) -> None:
    job = client.submit(
        "seed",
        model="linear:4,layernorm,tanh,linear:1",
        optimizer="nadam",
        lr=0.01,
        momentum_decay=0.01,
        decoupled_weight_decay=True,
        weight_decay=0.1,
        weight_decay_exclude_bias_and_norm=True,
        epochs=2,
        batch_size=8,
        engine="auto",
        seed=5,
        device="cpu",
    ).wait()
    assert job.state == trainerd.JobState.SUCCEEDED, job.error
    optimizer = job.spec.optimizer
    assert optimizer.kind == "nadam"
    assert optimizer.momentum_decay == pytest.approx(0.01)
    assert optimizer.decoupled_weight_decay is True
    assert optimizer.weight_decay_exclude_bias_and_norm is True
    assert job.report.engine == "libtorch"  # the fused path runs no nadam
    adagrad = client.submit(
        "seed", model="linear:1", optimizer="adagrad", lr=0.05, lr_decay=0.1,
        initial_accumulator_value=0.2, epochs=1, batch_size=8, seed=5, device="cpu",
        precision="fp16",
    ).wait()
    assert adagrad.state == trainerd.JobState.SUCCEEDED, adagrad.error
    assert adagrad.spec.optimizer.lr_decay == pytest.approx(0.1)
    assert adagrad.spec.optimizer.initial_accumulator_value == pytest.approx(0.2)


# What a request cannot carry: refused before anything is sent.
@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"loss": "hinge"}, "unknown loss 'hinge'"),
        ({"optimizer": "lbfgs"}, "unknown optimizer"),
        ({"class_weights": []}, r"class_weights=\[\] cannot be sent: .*every class weighing 1"),
        ({"precision": "int8"}, "unknown precision"),
        ({"priority": "urgent"}, "unknown priority"),
        ({"engine": "cuda"}, "unknown engine"),
        ({"seed": -1}, "seed must be at least 0"),
        ({"epochs": 2**31}, "epochs must be at most 2147483647"),
        ({"max_job_time": 0}, "max_job_time=0 cannot be sent: .*--max_job_time"),
        ({"lr": 0}, "lr=0 cannot be sent: .*its default, 0.01"),
        ({"epochs": 0}, "epochs=0 cannot be sent: .*its default, 10"),
        ({"batch_size": 0}, "batch_size=0 cannot be sent: .*its default, 32"),
        ({"device": ""}, "device='' cannot be sent: .*its default device"),
        ({"loss": "huber", "huber_delta": 0.0}, "huber_delta=0.0 cannot be sent: .*1"),
        (
            {"validation_fraction": 0.2, "early_stop_patience": 2, "early_stop_metric": "f1"},
            "unknown metric 'f1' \\(expected loss or accuracy\\)",
        ),
        ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps=0 cannot be sent"),
    ],
)
def test_what_a_request_cannot_carry_is_refused_before_sending(
    options: dict[str, object], error: str
) -> None:
    offline = trainerd.Client(UNREACHABLE)
    with pytest.raises(ValueError, match=error):
        offline.submit("seed", model="linear:1", **options)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def classes(client: trainerd.Client) -> trainerd.Dataset:
    """Three classes of int64 labels, for the checks of a class loss."""
    x, y = class_data(90)
    return client.upload("spec-checks-classes", x, y, exist_ok=True)


# The daemon checks the spec: InvalidArgument (a ValueError) with its sentence.
@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"lr": -0.5}, r"learning rate must be a positive number; got -0.5"),
        ({"lr": -1.0}, r"learning rate must be a positive number; got -1"),
        ({"momentum": 1.0}, r"momentum must be in \[0, 1\); got 1"),
        (
            {"optimizer": "adam", "momentum": 0.9},
            "momentum applies to sgd and rmsprop; optimizer adam does not take it",
        ),
        ({"nesterov": True}, "nesterov needs a momentum above 0"),
        ({"beta1": 0.9}, "beta1 applies to adam, adamw, nadam and radam; optimizer sgd"),
        ({"alpha": 0.9}, "alpha applies to rmsprop only"),
        ({"amsgrad": True}, "amsgrad applies to adam and adamw"),
        ({"optimizer": "adam", "centered": True}, "centered applies to rmsprop only"),
        ({"optimizer": "radam", "momentum_decay": 0.1}, "momentum decay applies to nadam only"),
        (
            {"optimizer": "adamw", "decoupled_weight_decay": True},
            "decoupled weight decay applies to nadam and radam; optimizer adamw",
        ),
        ({"optimizer": "adam", "lr_decay": 0.1}, "lr decay applies to adagrad only"),
        ({"initial_accumulator_value": 0.1}, "initial accumulator value applies to adagrad"),
        ({"optimizer": "adagrad", "lr_decay": -1.0}, "lr decay must be 0 or more; got -1"),
        ({"optimizer": "nadam", "momentum_decay": -1.0}, "momentum decay must be 0 or more"),
        ({"weight_decay_exclude_bias_and_norm": True}, "needs a weight decay above 0"),
        ({"eps": 1e-8}, "eps applies to every optimizer but sgd"),
        ({"huber_delta": 2.0}, "huber delta applies to loss huber only; loss mse"),
        (
            {"label_smoothing": 0.1, "loss": "mse"},
            "label smoothing applies to loss cross_entropy only",
        ),
        (
            {"class_weights": [1.0, 2.0], "loss": "mse"},
            "class_weights apply to losses cross_entropy and nll only",
        ),
        (
            {"ignore_index": -100, "loss": "l1"},
            "ignore_index applies to losses cross_entropy and nll only",
        ),
        ({"pos_weight": [2.0], "loss": "nll"}, "pos_weight applies to loss bce_with_logits only"),
        (
            {"class_weights": [1.0] * ((1 << 20) + 1)},
            "class_weights and pos_weight hold at most 1048576 values",
        ),
        (
            {"loss": "bce_with_logits", "pos_weight": [float("nan")]},
            "pos_weight values must be positive finite numbers; value 0 is nan",
        ),
        ({"schedule": "step"}, "schedule step needs step epochs of at least 1"),
        ({"gamma": 0.5}, "gamma applies to schedules step, multistep and exponential"),
        (
            {"schedule": "cosine", "min_lr": 0.5},
            r"needs a minimum learning rate in \[0, learning rate 0.01\); got 0.5",
        ),
        ({"epochs": -1}, "epochs must be between 1 and 1000000; got -1"),
        ({"batch_size": -4}, "batch size must be at least 1; got -4"),
        ({"validation_fraction": 1.0}, r"validation fraction must be in \[0, 1\)"),
        ({"early_stop_patience": 2}, r"early stopping \(patience 2\) watches the validation loss"),
        ({"validation_fraction": 0.1, "validation_dataset": "seed"}, "not both"),
        ({"checkpoint_every": 11}, r"between 1 and the epochs \(10\); got 11"),
        ({"epochs": 5000, "checkpoint_every": 1}, "at most 1000 are allowed"),
        ({"early_stop_min_delta": 0.1}, "early stop min_delta .* applies to early stopping"),
        ({"early_stop_metric": "accuracy"}, "early stop metric accuracy applies to early stopping"),
        (
            {"validation_fraction": 0.2, "early_stop_patience": 2, "early_stop_min_delta": -1.0},
            "early stop min_delta must be a finite number >= 0",
        ),
        (
            {
                "validation_fraction": 0.2,
                "early_stop_patience": 2,
                "early_stop_metric": "accuracy",
                "loss": "mse",
            },
            r"early stop metric accuracy needs a class loss \(cross_entropy or nll\), not mse",
        ),
        ({"gradient_accumulation_steps": -1}, "gradient_accumulation_steps must be at least 1"),
        ({"max_job_time": -1}, "max_job_seconds must be a finite number of seconds >= 0"),
    ],
)
def test_the_daemon_checks_the_spec(
    client: trainerd.Client,
    seed_dataset: trainerd.Dataset,
    options: dict[str, object],
    error: str,
) -> None:
    with pytest.raises(trainerd.InvalidArgument, match=error):
        client.submit("seed", model="linear:1", **options)  # type: ignore[arg-type]


def test_the_daemon_checks_class_weights(
    client: trainerd.Client, classes: trainerd.Dataset
) -> None:
    with pytest.raises(
        trainerd.InvalidArgument, match="class_weights values must be positive finite numbers"
    ):
        client.submit(
            classes, model="linear:3", loss="cross_entropy", class_weights=[1.0, 0.0, 1.0]
        )


def test_loss_weights_reach_the_spec() -> None:
    from trainerd._spec import build_spec

    spec = build_spec(
        "seed", "linear:3", {"loss": "nll", "class_weights": (0.5, 2, 1.25), "ignore_index": -100}
    )
    assert list(spec.class_weights) == [0.5, 2.0, 1.25]
    assert spec.HasField("ignore_index") and spec.ignore_index == -100
    assert not build_spec("seed", "linear:3", {"loss": "nll"}).HasField("ignore_index")
    spec = build_spec("seed", "linear:2", {"loss": "bce_with_logits", "pos_weight": [3.0, 0.5]})
    assert list(spec.pos_weight) == [3.0, 0.5]
    with pytest.raises(TypeError, match="class_weights must be a sequence of numbers"):
        build_spec("seed", "linear:3", {"class_weights": "1,2,3"})
def test_loop_options_reach_the_daemon(
    client: trainerd.Client, seed_dataset: trainerd.Dataset
) -> None:
    # 300 of the 400 rows train: batches of 64 are 4 whole ones and 44 rows, which drop_last drops;
    # accumulating 2 batches a step makes 2 optimizer steps an epoch.
    job = client.submit(
        seed_dataset,
        model="linear:1",
        batch_size=64,
        epochs=3,
        validation_fraction=0.25,
        gradient_accumulation_steps=2,
        drop_last=True,
        early_stop_patience=2,
        early_stop_min_delta=0.001,
        seed=3,
    ).wait(timeout=60)
    assert job.state == trainerd.JobState.SUCCEEDED, job.error
    spec = job.spec
    assert spec.gradient_accumulation_steps == 2
    assert spec.drop_last is True
    assert spec.early_stop_min_delta == 0.001
    assert spec.early_stop_metric == "loss"
    assert job.steps == 3 * 2
    assert job.report.engine == "libtorch"  # accumulation is LibTorch's
    assert len(job.history) == 3


def test_early_stopping_on_validation_accuracy(client: trainerd.Client) -> None:
    x, y = class_data()
    job = client.submit(
        client.upload(f"acc-{uuid.uuid4().hex[:8]}", x, y),
        model="linear:3",
        loss="cross_entropy",
        lr=0.05,
        batch_size=32,
        epochs=40,
        validation_fraction=0.2,
        early_stop_patience=2,
        early_stop_metric="accuracy",
        seed=1,
    ).wait(timeout=60)
    assert job.state == trainerd.JobState.SUCCEEDED, job.error
    assert job.spec.early_stop_metric == "accuracy"
    # Keras' rule on the reported accuracies: the job ran until 2 epochs in a row did not beat
    # the best.
    best, wait, stop = -1.0, 0, len(job.history)
    for e in job.history:
        assert e.validation_accuracy is not None
        if e.validation_accuracy > best:
            best, wait = e.validation_accuracy, 0
        else:
            wait += 1
            if wait >= 2:
                stop = e.epoch
                break
    assert len(job.history) == stop
    assert job.stopped_early == (stop < 40)


def test_spec_type_errors_before_sending() -> None:
    offline = trainerd.Client(UNREACHABLE)
    with pytest.raises(TypeError, match="drop_last must be a bool"):
        offline.submit("seed", model="linear:1", drop_last="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="lr must be a number"):
        offline.submit("seed", model="linear:1", lr="fast")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="epochs must be a whole number"):
        offline.submit("seed", model="linear:1", epochs=2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="model must be"):
        offline.submit("seed", model=42)
    with pytest.raises(ValueError, match="model needs a spec"):
        offline.submit("seed", model="")


def test_daemon_refusals_carry_its_sentence(
    client: trainerd.Client, seed_dataset: trainerd.Dataset
) -> None:
    with pytest.raises(trainerd.InvalidArgument) as refused:
        client.submit("seed", model="linear:3", loss="mse")
    assert "linear:3" in str(refused.value) and "mse" in str(refused.value)
    assert refused.value.code.name == "INVALID_ARGUMENT"
    assert isinstance(refused.value, ValueError)
    with pytest.raises(trainerd.InvalidArgument):
        client.submit("seed", model="linear:1,bogus:3")
    with pytest.raises(trainerd.NotFound, match="nosuchdataset"):
        client.submit("nosuchdataset", model="linear:1")
    with pytest.raises(trainerd.NotFound):
        client.job("job-000000000000")
    with pytest.raises(trainerd.InvalidArgument):
        client.submit("seed", model="linear:1", loss="cross_entropy")  # float32 targets
    # Dataset names are the daemon's to check.
    with pytest.raises(trainerd.InvalidArgument, match="dataset name 'no such name' is invalid"):
        client.submit("no such name", model="linear:1")
    with pytest.raises(trainerd.InvalidArgument, match="dataset name 'bad name' is invalid"):
        client.submit("alice/bad name", model="linear:1")
    with pytest.raises(trainerd.InvalidArgument, match=r"the model spec has \d+ characters"):
        client.submit("seed", model="linear:1," * 500 + "linear:1")


def test_model_argument_forms() -> None:
    # The bytes given as model= go to the daemon as they are.
    from trainerd._model_input import model_argument

    assert model_argument(b"PK-archive") == ("torchscript", b"PK-archive")
    # A .pt2 archive (torch.export.save) is told apart by its content.
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("m/models/model.json", "{}")
    assert model_argument(buffer.getvalue()) == ("exported", buffer.getvalue())
    assert model_argument("linear:1") == ("linear:1", b"")
    with pytest.raises(ValueError, match="empty"):
        model_argument(b"")


def test_a_request_id_makes_a_retried_submit_or_sweep_return_what_it_queued(
    client: trainerd.Client, seed_dataset: trainerd.Dataset
) -> None:
    request_id = str(uuid.uuid4())

    def submit(request_id: str | None, epochs: int = 2) -> trainerd.Job:
        return client.submit(
            seed_dataset,
            model="linear:1",
            lr=0.1,
            batch_size=16,
            epochs=epochs,
            seed=3,
            request_id=request_id,
        )

    first = submit(request_id)
    again = submit(request_id)
    assert again.id == first.id
    assert again.request_id == request_id
    assert submit(None).request_id == ""
    with pytest.raises(trainerd.AlreadyExists, match=first.id):
        submit(request_id, epochs=3)
    with pytest.raises(trainerd.InvalidArgument, match="1 to 128 characters"):
        submit("not an id")
    sweep_id = request_id + "-s"
    sweep = client.sweep(seed_dataset, model="linear:1", lr=[0.1, 0.2], request_id=sweep_id)
    repeated = client.sweep(seed_dataset, model="linear:1", lr=[0.1, 0.2], request_id=sweep_id)
    assert repeated.id == sweep.id
    assert [j.id for j in repeated.jobs] == [j.id for j in sweep.jobs]
    assert first.wait(timeout=60).state == trainerd.JobState.SUCCEEDED
