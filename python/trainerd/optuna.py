"""Optuna drives trainerd's trials: ask and tell over the daemon's API (needs ``optuna``, the
``trainerd[optuna]`` extra).

Optuna's sampler (TPE, CMA-ES, random, a grid) chooses each trial's values; trainerd trains the
trials, a batch at a time, as the members of one sweep (those of one shape pack together on the
daemon), and every member's epochs are reported to its trial as they arrive
(``trial.report(value, epoch)``), so that Optuna's pruner can stop a poor trial: its member is
cancelled and the trial told PRUNED. Or the daemon prunes: a sweep with ``halving_min_epochs``
stops its members behind at a rung (successive halving, in the daemon), and those trials are told
PRUNED too. Every member validates on the same held-out rows (give ``validation_fraction`` or
``validation_dataset``), so trials compare fairly.

Example::

    import optuna, trainerd
    from trainerd.optuna import optimize

    client = trainerd.Client()
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0),
                                pruner=optuna.pruners.SuccessiveHalvingPruner())
    def space(trial):
        width = trial.suggest_int("width", 32, 256, log=True)
        return {"model": f"linear:{width},relu,linear:10",
                "lr": trial.suggest_float("lr", 1e-4, 1e-1, log=True),
                "batch_size": trial.suggest_categorical("batch_size", [16, 64, 256])}
    optimize(client, study, "digits", space, n_trials=64, batch=16, model="linear:64,relu,linear:10",
             loss="cross_entropy", optimizer="adam", epochs=50, validation_fraction=0.2)
    print(study.best_params, study.best_trial.user_attrs["trainerd_job"])
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from trainerd.errors import FailedPrecondition
from trainerd.jobs import Job
from trainerd.sweeps import Sweep

if TYPE_CHECKING:
    import optuna

    from trainerd.client import Client, DatasetArg

__all__ = ["optimize", "trial_value"]


def trial_value(job: Job, epoch: Any) -> float | None:
    """What a trial reports for ``epoch``: its validation loss when the job validates, else its
    training loss (lower is better; the study must minimize)."""
    if epoch.validation_loss is not None:
        return float(epoch.validation_loss)
    if job.spec.validation_fraction > 0 or job.spec.validation_dataset:
        return None
    return float(epoch.loss)


def optimize(
    client: Client,
    study: optuna.Study,
    dataset: DatasetArg,
    space: Callable[[optuna.Trial], Mapping[str, Any]],
    *,
    n_trials: int,
    model: str,
    batch: int = 8,
    poll_seconds: float = 0.2,
    timeout: float | None = None,
    **options: Any,
) -> list[Sweep]:
    """Runs ``n_trials`` trials of ``study`` on trainerd, ``batch`` at a time, and returns the
    sweeps that trained them.

    ``space(trial)`` suggests a trial's values and returns them as one member of
    :meth:`trainerd.Client.sweep`'s ``points``: ``model`` and any of submit()'s options (``lr``,
    ``batch_size``, ``epochs``, ``optimizer``, ...); ``model`` and ``options`` are what every
    trial shares (``halving_min_epochs`` lets the daemon prune by successive halving). Each trial
    records its job's id (``trial.user_attrs["trainerd_job"]``). A trial is told its last
    reported value when its job succeeded, PRUNED when Optuna's pruner or the daemon's halving
    stopped it, FAIL when its job failed. ``timeout`` bounds each batch's wait (seconds).
    """
    import optuna

    if study.direction != optuna.study.StudyDirection.MINIMIZE:
        raise ValueError("trainerd's trials report losses: create the study with direction='minimize'")
    if n_trials < 1 or batch < 1:
        raise ValueError("n_trials and batch must be at least 1")
    sweeps: list[Sweep] = []
    remaining = n_trials
    while remaining > 0:
        trials = [study.ask() for _ in range(min(batch, remaining))]
        remaining -= len(trials)
        points = [dict(space(trial)) for trial in trials]
        sweep = client.sweep(dataset, model=model, points=points, **options)
        sweeps.append(sweep)
        for trial, job in zip(trials, sweep.jobs):
            trial.set_user_attr("trainerd_job", job.id)
        _follow(study, trials, sweep, poll_seconds, timeout)
    return sweeps


def _follow(
    study: optuna.Study,
    trials: list[optuna.Trial],
    sweep: Sweep,
    poll_seconds: float,
    timeout: float | None,
) -> None:
    """Reports each member's new epochs to its trial, cancels the members Optuna prunes, and
    tells every trial its end."""
    import optuna

    reported = [0] * len(trials)
    pruned = [False] * len(trials)
    told = [False] * len(trials)
    deadline = None if timeout is None else time.monotonic() + timeout
    while not all(told):
        for index, (trial, job) in enumerate(zip(trials, sweep.jobs)):
            if told[index]:
                continue
            job.refresh()
            history = job.history
            # Each new epoch reported, and the pruner asked after each (also for epochs that
            # arrived together, or after the job ended: the decision is the same however the
            # polls fall).
            for epoch in history[reported[index] :]:
                if pruned[index]:
                    break
                value = trial_value(job, epoch)
                if value is not None:
                    trial.report(value, epoch.epoch)
                    pruned[index] = trial.should_prune()
            reported[index] = len(history)
            if pruned[index] and not job.state.ended:
                try:
                    job.cancel()
                except FailedPrecondition:
                    pass  # it ended meanwhile: pruned all the same
                job.refresh()
            if not job.state.ended:
                continue
            told[index] = True
            values = [v for e in history if (v := trial_value(job, e)) is not None]
            if pruned[index] or (job.stopped_early and "rung" in job.stop_reason):
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            elif job.state.value == "SUCCEEDED" and values:
                study.tell(trial, values[-1])
            else:
                trial.set_user_attr("trainerd_error", job.error)
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
        if not all(told):
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"sweep '{sweep.id}' did not end within {timeout} s")
            time.sleep(poll_seconds)
