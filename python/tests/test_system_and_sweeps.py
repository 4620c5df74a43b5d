"""System calls (version, devices, diagnose, health) and sweeps against the real daemon."""

from __future__ import annotations

import numpy as np
import pytest

import trainerd
from trainerd._display import report_rows
from conftest import Daemon, run_trainctl, seed_data

UNREACHABLE = "127.0.0.1:1"


def test_version_matches_trainctls(client: trainerd.Client, daemon: Daemon) -> None:
    version = client.version()
    assert version.trainerd == trainerd.__version__
    assert version.client == trainerd.__version__
    assert version.libtorch.startswith("2.")
    ctl = run_trainctl("--addr", daemon.address, "version", "-o", "name")
    assert ctl.returncode == 0, ctl.stderr
    assert ctl.stdout.strip() == version.trainerd


def test_devices_show_the_cpu_and_resident_datasets(
    client: trainerd.Client, seed_dataset: trainerd.Dataset
) -> None:
    devices = client.devices()
    cpu = next(d for d in devices if d.device == "cpu")
    assert cpu.is_default
    assert cpu.memory_total_bytes > 0
    client.submit("seed", model="linear:1", epochs=1).wait()  # makes the dataset resident
    assert "seed" in next(d for d in client.devices() if d.device == "cpu").datasets


def test_diagnose_measures_the_cpu(client: trainerd.Client) -> None:
    result = client.diagnose()
    cpu = next(d for d in result.devices if d.device == "cpu")
    assert cpu.matmul_flops_per_second > 0
    assert result.libtorch_version.startswith("2.")
    assert client.diagnose().cached


def test_health(client: trainerd.Client) -> None:
    assert client.health() == "SERVING"
    assert client.health("no.such.Service") == "SERVICE_UNKNOWN"


def test_sweep_ranks_its_members(client: trainerd.Client, seed_dataset: trainerd.Dataset) -> None:
    pd = pytest.importorskip("pandas")
    sweep = client.sweep(
        "seed", model="linear:1", lr=[0.1, 0.03, 1e6], seed=[1, 2], epochs=30, batch_size=16
    )
    assert sweep.id.startswith("sweep-")
    assert len(sweep) == 6
    assert [j.spec.optimizer.learning_rate for j in sweep.jobs] == [0.1, 0.1, 0.03, 0.03, 1e6, 1e6]
    assert [j.spec.seed for j in sweep.jobs] == [1, 2, 1, 2, 1, 2]
    assert all(j.sweep_id == sweep.id for j in sweep.jobs)
    assert sweep.wait(timeout=120) is sweep
    assert sweep.ended
    assert len(sweep.failed) == 2  # the diverging rate fails alone
    assert all("loss became" in j.error for j in sweep.failed)
    assert sweep.best_metric == "loss"
    best = sweep.best()
    assert best.spec.optimizer.learning_rate == 0.1
    assert best.final_loss == min(j.final_loss for j in sweep.succeeded)
    frame = sweep.frame()
    assert isinstance(frame, pd.DataFrame)
    assert list(frame["state"]).count("FAILED") == 2
    assert frame.loc[best.id, "loss"] == pytest.approx(best.final_loss)


def test_sweep_with_validation_ranks_by_validation_loss(
    client: trainerd.Client, name: str
) -> None:
    x, y = seed_data(200, seed=9)
    client.upload(name, x, y)
    sweep = client.sweep(
        name, model="linear:1", lr=[0.1, 0.01], momentum=[0.0, 0.9], epochs=5,
        validation_fraction=0.25, seed=4,
    ).wait()
    assert sweep.best_metric == "validation_loss"
    best = sweep.best()
    scores = {j.id: j.history[-1].validation_loss for j in sweep.jobs}
    assert scores[best.id] == min(s for s in scores.values() if s is not None)
    assert len({j.spec.seed for j in sweep.jobs}) == 1


def test_sweep_checks(client: trainerd.Client, seed_dataset: trainerd.Dataset) -> None:
    # The daemon checks every member as it checks a job alone, and bounds the sweep.
    with pytest.raises(
        trainerd.InvalidArgument,
        match=r"sweep member 2 \(learning rate -1, .*learning rate must be a positive number",
    ):
        client.sweep("seed", model="linear:1", lr=[0.1, -1])
    with pytest.raises(trainerd.InvalidArgument, match="the sweep has more than 256 members"):
        client.sweep("seed", model="linear:1", lr=list(np.linspace(0.01, 0.1, 20)), seed=range(20))
    with pytest.raises(
        trainerd.InvalidArgument, match=r"sweep member 2 \(.*\): nesterov needs a momentum above 0"
    ):
        client.sweep("seed", model="linear:1", momentum=[0.9, 0.0], nesterov=True)
    # What the request cannot carry, before anything is sent.
    offline = trainerd.Client(UNREACHABLE)
    with pytest.raises(ValueError, match="at least one value"):
        offline.sweep("seed", model="linear:1", lr=[])
    with pytest.raises(TypeError, match="model spec"):
        offline.sweep("seed", model=b"PK")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="seed must be a whole number"):
        offline.sweep("seed", model="linear:1", seed=[1.5])  # type: ignore[list-item]


def test_sweep_points_are_the_members_in_order(
    client: trainerd.Client, seed_dataset: trainerd.Dataset
) -> None:
    sweep = client.sweep(
        "seed", model="linear:1", lr=0.05, seed=7, epochs=5, batch_size=16,
        points=[{"lr": 0.1, "seed": 1}, {"seed": 2}, {"lr": 0.03}],
    )
    assert len(sweep) == 3
    # A key left out takes the argument's single value.
    assert [j.spec.optimizer.learning_rate for j in sweep.jobs] == [0.1, 0.05, 0.03]
    assert [j.spec.seed for j in sweep.jobs] == [1, 2, 7]
    sweep.wait(timeout=120)
    assert len(sweep.succeeded) == 3
    assert all(j.proto.report.packed_members == 3 for j in sweep.jobs)
    assert [j.sweep_member for j in sweep.jobs] == [1, 2, 3]
    # On the CPU every member is its job alone to the last bit, and says so.
    for member in sweep.jobs:
        assert member.report.packed_bitwise
        assert member.report.packed_numerics.startswith("bitwise the job alone")
        assert ("numerics", member.report.packed_numerics) in report_rows(member)
    alone = client.submit(
        "seed", model="linear:1", lr=0.1, seed=1, epochs=5, batch_size=16
    ).wait(timeout=120)
    assert not alone.report.packed_bitwise and alone.report.packed_numerics == ""
    assert [e.loss for e in alone.history] == [e.loss for e in sweep.jobs[0].history]
    ours, theirs = alone.parameters, sweep.jobs[0].parameters
    assert ours.keys() == theirs.keys()
    assert all(np.array_equal(ours[name], theirs[name]) for name in ours)


def test_sweep_points_are_checked(
    client: trainerd.Client, seed_dataset: trainerd.Dataset
) -> None:
    with pytest.raises(
        trainerd.InvalidArgument,
        match=r"sweep member 2 \(learning rate -1, .*learning rate must be a positive number",
    ):
        client.sweep("seed", model="linear:1", points=[{"lr": 0.1}, {"lr": -1}])
    with pytest.raises(trainerd.InvalidArgument, match=r"sweep member 1 \(learning rate nan"):
        client.sweep("seed", model="linear:1", points=[{"lr": float("nan")}])
    with pytest.raises(trainerd.InvalidArgument, match="the sweep has 257 points; at most 256"):
        client.sweep("seed", model="linear:1", points=[{"seed": i} for i in range(257)])
    offline = trainerd.Client(UNREACHABLE)
    with pytest.raises(ValueError, match="the model and submit\\(\\)'s options, not widht"):
        offline.sweep("seed", model="linear:1", points=[{"widht": 3}])
    with pytest.raises(TypeError, match=r"points\[0\]: batch_size must be a whole number"):
        offline.sweep("seed", model="linear:1", points=[{"batch_size": 1.5}])
    with pytest.raises(TypeError, match=r"points\[0\]: a point's model is a spec string"):
        offline.sweep("seed", model="linear:1", points=[{"model": 3}])
    with pytest.raises(ValueError, match="seed takes one value with it"):
        offline.sweep("seed", model="linear:1", seed=[1, 2], points=[{"lr": 0.1}])
    with pytest.raises(ValueError, match="at least one member"):
        offline.sweep("seed", model="linear:1", points=[])
    with pytest.raises(TypeError, match="sequence of mappings"):
        offline.sweep("seed", model="linear:1", points={"lr": 0.1})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"points\[0\]: seed must be a whole number"):
        offline.sweep("seed", model="linear:1", points=[{"seed": 1.5}])
    # min_lr above the default rate is fine when every point gives a rate above it.
    from trainerd._submit import sweep_request

    request = sweep_request(
        "seed", "linear:1", 0.01, None, None, None, {"schedule": "cosine", "min_lr": 0.05},
        [{"lr": 0.1}, {"lr": 0.2}],
    )
    assert request.spec.optimizer.learning_rate == 0.1
    assert [p.learning_rate for p in request.points] == [0.1, 0.2]
    assert not request.points[0].HasField("seed")


def test_a_sweep_is_picked_up_again_by_its_id(
    client: trainerd.Client, seed_dataset: trainerd.Dataset
) -> None:
    submitted = client.sweep("seed", model="linear:1", lr=[0.1, 0.03], seed=[1, 2], epochs=4,
                             batch_size=16)
    # A new session (another client) knows only the id.
    with trainerd.Client(client.address) as other:
        sweep = other.get_sweep(submitted.id)
        assert sweep.id == submitted.id
        assert [j.id for j in sweep.jobs] == [j.id for j in submitted.jobs]
        assert [j.sweep_member for j in sweep.jobs] == [1, 2, 3, 4]
        sweep.wait(timeout=120)
        assert len(sweep.succeeded) == 4
        assert sweep.best().id in {j.id for j in submitted.jobs}
        assert [j.id for j in other.jobs(sweep=submitted.id, state="succeeded")] == [
            j.id for j in submitted.jobs
        ]
        assert other.jobs(sweep=submitted.id, state="failed") == []
        with pytest.raises(trainerd.NotFound, match="sweep 'sweep-000000000000' not found"):
            other.get_sweep("sweep-000000000000")
        with pytest.raises(trainerd.InvalidArgument, match="sweep_id must be at most 64 letters"):
            other.jobs(sweep="sweep 1")
        with pytest.raises(ValueError, match="sweep must be a sweep's id"):
            other.jobs(sweep="")  # would list every job


def test_sweep_points_vary_the_model_and_any_option(
    client: trainerd.Client, seed_dataset: trainerd.Dataset
) -> None:
    # Widths and batch sizes as points: each member's spec has them, members of one shape pack
    # together, and every member keeps the sweep's seed and held-out rows.
    points = [
        {"model": f"linear:{w},relu,linear:1", "batch_size": b, "lr": lr}
        for w in (4, 8)
        for b in (16, 32)
        for lr in (0.05, 0.01)
    ]
    sweep = client.sweep(
        seed_dataset, model="linear:1", epochs=2, validation_fraction=0.25, seed=3,
        optimizer="adam", points=points,
    ).wait(timeout=120)
    assert len(sweep.jobs) == 8 and not sweep.failed
    for job, point in zip(sweep.jobs, points):
        assert job.spec.model == point["model"]
        assert job.spec.batch_size == point["batch_size"]
        assert job.spec.optimizer.learning_rate == point["lr"]
        assert job.spec.optimizer.kind == "adam"
        assert job.seed == 3 and job.split_seed == 3
        assert job.report.packed_members == 2  # the two rates of one width and batch size
    # An option of the data is the sweep's: the daemon refuses a point that varies it.
    with pytest.raises(trainerd.InvalidArgument, match="it varies its validation fraction"):
        client.sweep(
            seed_dataset, model="linear:1", validation_fraction=0.25,
            points=[{"lr": 0.1}, {"lr": 0.1, "validation_fraction": 0.5}],
        )


def test_sweep_halving_stops_the_members_behind_and_says_what_it_saved(
    client: trainerd.Client, seed_dataset: trainerd.Dataset
) -> None:
    sweep = client.sweep(
        seed_dataset, model="linear:1", lr=[0.1, 1e-5, 0.05, 1e-6, 0.02, 1e-7], epochs=8,
        validation_fraction=0.25, seed=2, halving_min_epochs=1, halving_reduction_factor=2,
    ).wait(timeout=120)
    assert not sweep.failed
    stopped = [job for job in sweep.jobs if job.stopped_early]
    assert len(stopped) >= 3
    for job in stopped:
        assert job.epochs_completed in (1, 2, 4)
        assert f"rung of epoch {job.epochs_completed}: validation loss" in job.stop_reason
    assert sweep.epochs_saved() == sum(8 - job.epochs_completed for job in stopped)
    assert sweep.best().epochs_completed == 8
    frame = sweep.frame()
    assert list(frame["stop_reason"]).count("") == len(sweep.jobs) - len(stopped)
    with pytest.raises(TypeError):
        client.submit(seed_dataset, model="linear:1", halving_min_epochs=1)  # type: ignore[call-arg]


def test_a_random_search_is_drawn_by_the_daemon_from_its_seed(
    client: trainerd.Client, seed_dataset: trainerd.Dataset
) -> None:
    from trainerd.search import Choice, Integer, LogUniform

    space = {
        "lr": LogUniform(1e-3, 1e-1),
        "batch_size": Integer(8, 64, log=True),
        "model": Choice("linear:1", "linear:4,relu,linear:1"),
        "optimizer": Choice("sgd", "adam"),
        "clip_grad_norm": Choice(0.0, 1.0),
    }
    sweep = client.sweep(
        seed_dataset, model="linear:1", epochs=2, validation_fraction=0.25,
        search=space, trials=6, search_seed=11,
    ).wait(timeout=120)
    assert len(sweep.jobs) == 6 and not sweep.failed
    for job in sweep.jobs:
        assert 1e-3 <= job.spec.optimizer.learning_rate <= 1e-1
        assert 8 <= job.spec.batch_size <= 64
        assert job.spec.model in ("linear:1", "linear:4,relu,linear:1")
        assert job.spec.optimizer.kind in ("sgd", "adam")
        assert job.spec.clip_grad_norm in (0.0, 1.0)
    again = client.sweep(
        seed_dataset, model="linear:1", epochs=2, validation_fraction=0.25,
        search=space, trials=6, search_seed=11,
    ).wait(timeout=120)
    assert [j.spec.proto for j in again.jobs][0].batch_size == sweep.jobs[0].spec.batch_size
    assert [j.spec.optimizer.learning_rate for j in again.jobs] == [
        j.spec.optimizer.learning_rate for j in sweep.jobs
    ]
    offline = trainerd.Client(UNREACHABLE)
    with pytest.raises(ValueError, match="lists, points or a search"):
        offline.sweep("seed", model="linear:1", points=[{"lr": 0.1}], search=space, trials=2)
    with pytest.raises(ValueError, match="'widht' is no option"):
        offline.sweep("seed", model="linear:1", search={"widht": Choice(1)}, trials=2)
    with pytest.raises(TypeError, match="takes a trainerd.search distribution"):
        offline.sweep("seed", model="linear:1", search={"lr": (0.1, 0.2)}, trials=2)
