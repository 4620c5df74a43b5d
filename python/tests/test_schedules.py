"""The learning-rate schedules through the Python client: the options reach the daemon, each
epoch reports the rate of its first step as PyTorch's scheduler gives it, and the checks refuse
what a schedule does not take before anything is sent."""

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
        ({"schedule": "multistep"}, "needs milestones"),
        ({"schedule": "multistep", "milestones": [3, 2]}, "milestones must be ascending"),
        ({"milestones": [2]}, "milestones applies to schedule 'multistep'"),
        ({"schedule": "cosine", "gamma": 0.5}, "gamma applies to schedule 'step'"),
        ({"schedule": "exponential", "gamma": 1.5}, r"gamma must be in \(0, 1\]"),
        ({"schedule": "cosine_restarts"}, "needs t_0"),
        ({"schedule": "cosine", "t_0": 2}, "t_0 applies to schedule 'cosine_restarts'"),
        ({"schedule": "onecycle", "pct_start": 1.5}, r"pct_start must be in \[0, 1\]"),
        ({"schedule": "onecycle", "anneal_strategy": "exp"}, "anneal_strategy must be"),
        ({"schedule": "step", "step_epochs": 1, "three_phase": True}, "three_phase applies"),
        ({"schedule": "plateau", "plateau_factor": 1.0}, r"plateau_factor must be in \(0, 1\)"),
        ({"plateau_patience": 3}, "plateau_patience applies to schedule 'plateau'"),
        ({"schedule": "plateau", "schedule_per_step": True}, "steps once per epoch"),
        ({"schedule": "onecycle", "warmup_epochs": 1}, "takes no warmup_epochs"),
        ({"warmup_steps": 2}, "warmup_steps needs schedule_per_step=True"),
        (
            {"schedule": "cosine", "schedule_per_step": True, "warmup_epochs": 1},
            "warms up by steps",
        ),
        ({"schedule": "hyperbolic"}, "unknown schedule"),
    ],
)
def test_schedule_checks_before_sending(options: dict[str, object], error: str) -> None:
    offline = trainerd.Client(UNREACHABLE)
    with pytest.raises(ValueError, match=error):
        offline.submit("seed", model="linear:1", **options)  # type: ignore[arg-type]
