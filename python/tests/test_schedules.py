"""The learning-rate schedules through the Python client: the options reach the daemon, each
epoch reports the rate of its first step as PyTorch's scheduler gives it, and the daemon refuses
what a schedule does not take, with its sentence."""

from __future__ import annotations

import pytest

import trainerd

UNREACHABLE = "127.0.0.1:1"


def torch_rates(make: object, steps: int, lr: float) -> list[float]:
    """The rate before each of `steps` scheduler steps of PyTorch's scheduler `make(optimizer)`."""
    torch = pytest.importorskip("torch")
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    scheduler = make(optimizer)  # type: ignore[operator]
    rates = []
    for _ in range(steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


def test_onecycle_reports_each_epochs_first_step_rate(
    client: trainerd.Client, seed_dataset: trainerd.Dataset
) -> None:
    torch = pytest.importorskip("torch")
    # 400 rows in batches of 100: 4 steps an epoch.
    job = client.submit(
        "seed",
        model="linear:1",
        lr=0.1,
        schedule="onecycle",
        pct_start=0.25,
        anneal_strategy="linear",
        div_factor=10,
        final_div_factor=100,
        three_phase=True,
        batch_size=100,
        epochs=3,
        device="cpu",
        seed=1,
    ).wait()
    assert job.state == trainerd.JobState.SUCCEEDED, job.error
    schedule = job.spec.schedule
    assert schedule.pct_start == pytest.approx(0.25)
    assert schedule.anneal_strategy == "linear"
    assert schedule.three_phase
    want = torch_rates(
        lambda o: torch.optim.lr_scheduler.OneCycleLR(
            o,
            max_lr=0.1,
            total_steps=12,
            pct_start=0.25,
            anneal_strategy="linear",
            div_factor=10,
            final_div_factor=100,
            three_phase=True,
            cycle_momentum=False,
        ),
        12,
        0.1,
    )
    assert [e.learning_rate for e in job.history] == pytest.approx(want[::4], rel=1e-12)


def test_per_step_multistep_with_warm_up_steps(
    client: trainerd.Client, seed_dataset: trainerd.Dataset
) -> None:
    job = client.submit(
        "seed",
        model="linear:1",
        lr=0.2,
        schedule="multistep",
        milestones=[2, 5],
        gamma=0.5,
        schedule_per_step=True,
        warmup_steps=3,
        batch_size=100,
        epochs=3,
        device="cpu",
        seed=1,
    ).wait()
    assert job.state == trainerd.JobState.SUCCEEDED, job.error
    assert list(job.spec.schedule.milestones) == [2, 5]
    assert job.spec.schedule.per_step
    # Steps 0, 4 and 8: warm-up 1/4; then 1 step into the schedule; 5 steps in (both milestones).
    assert [e.learning_rate for e in job.history] == pytest.approx([0.05, 0.2, 0.05])


def test_plateau_needs_validation_and_keeps_its_options(
    client: trainerd.Client, seed_dataset: trainerd.Dataset
) -> None:
    with pytest.raises(trainerd.InvalidArgument, match="needs a validation fraction"):
        client.submit("seed", model="linear:1", schedule="plateau", epochs=2)
    torch = pytest.importorskip("torch")
    job = client.submit(
        "seed",
        model="linear:1",
        schedule="plateau",
        plateau_factor=0.5,
        plateau_patience=0,
        plateau_threshold=0.5,
        plateau_cooldown=1,
        min_lr=0.001,
        validation_fraction=0.25,
        epochs=6,
        device="cpu",
        seed=1,
    ).wait()
    assert job.state == trainerd.JobState.SUCCEEDED, job.error
    schedule = job.spec.schedule
    assert schedule.factor == 0.5 and schedule.patience == 0 and schedule.threshold == 0.5
    assert schedule.cooldown == 1 and schedule.min_learning_rate == 0.001
    # PyTorch's ReduceLROnPlateau fed the validation losses the epochs reported.
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.01)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
        optimizer, factor=0.5, patience=0, threshold=0.5, cooldown=1, min_lr=0.001
    )
    want = []
    for epoch in job.history:
        want.append(optimizer.param_groups[0]["lr"])
        plateau.step(epoch.validation_loss)
    assert [e.learning_rate for e in job.history] == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"schedule": "multistep"}, "schedule multistep needs milestones"),
        (
            {"schedule": "multistep", "milestones": [3, 2]},
            "milestones must be at least 1 and in ascending order; got 2 at position 2",
        ),
        ({"milestones": [2]}, "milestones applies to schedule multistep only"),
        (
            {"schedule": "cosine", "gamma": 0.5},
            "gamma applies to schedules step, multistep and exponential; schedule cosine",
        ),
        ({"schedule": "exponential", "gamma": 1.5}, r"needs gamma in \(0, 1\]; got 1.5"),
        ({"schedule": "cosine_restarts"}, "schedule cosine_restarts needs t_0 of at least 1"),
        ({"schedule": "cosine", "t_0": 2}, "t_0 applies to schedule cosine_restarts only"),
        ({"schedule": "onecycle", "pct_start": 1.5}, r"pct_start must be in \[0, 1\]; got 1.5"),
        (
            {"schedule": "onecycle", "anneal_strategy": "exp"},
            "anneal_strategy must be cos or linear; got 'exp'",
        ),
        (
            {"schedule": "step", "step_epochs": 1, "three_phase": True},
            "three_phase applies to schedule onecycle only",
        ),
        ({"schedule": "plateau", "plateau_factor": 1.0}, r"plateau factor must be in \(0, 1\)"),
        ({"plateau_patience": 3}, "plateau patience applies to schedule plateau only"),
        (
            {"schedule": "plateau", "schedule_per_step": True, "validation_fraction": 0.25},
            "schedule plateau steps once per epoch",
        ),
        ({"schedule": "onecycle", "warmup_epochs": 1}, "schedule onecycle takes no warm-up"),
        ({"warmup_steps": 2}, "warm-up steps need a per-step schedule"),
        (
            {"schedule": "cosine", "schedule_per_step": True, "warmup_epochs": 1},
            "a per-step schedule warms up by steps",
        ),
    ],
)
def test_the_daemon_checks_the_schedule(
    client: trainerd.Client, seed_dataset: trainerd.Dataset, options: dict[str, object], error: str
) -> None:
    with pytest.raises(trainerd.InvalidArgument, match=error):
        client.submit("seed", model="linear:1", **options)  # type: ignore[arg-type]


def test_what_a_schedule_request_cannot_carry_is_refused_before_sending() -> None:
    offline = trainerd.Client(UNREACHABLE)
    with pytest.raises(ValueError, match="unknown schedule"):
        offline.submit("seed", model="linear:1", schedule="hyperbolic")
    with pytest.raises(ValueError, match="gamma=0 cannot be sent: .*0.1"):
        offline.submit("seed", model="linear:1", schedule="step", step_epochs=1, gamma=0)
    with pytest.raises(ValueError, match="anneal_strategy='' cannot be sent: .*'cos'"):
        offline.submit("seed", model="linear:1", schedule="onecycle", anneal_strategy="")
    with pytest.raises(TypeError, match="milestones must be a sequence of whole numbers"):
        offline.submit(
            "seed", model="linear:1", schedule="multistep", milestones=3  # type: ignore[arg-type]
        )
