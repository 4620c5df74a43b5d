"""trainerd.optuna against the real daemon: Optuna's TPE sampler chooses the trials, trainerd
trains them as sweeps, each trial is told its job's last validation loss, and both pruners work:
Optuna's (the member is cancelled, the trial PRUNED) and the daemon's successive halving (the
member stops at a rung, the trial PRUNED)."""

from __future__ import annotations

from typing import Any

import pytest

import trainerd
from conftest import seed_data

optuna = pytest.importorskip("optuna")
from trainerd.optuna import optimize  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)


def space(trial: Any) -> dict[str, Any]:
    width = trial.suggest_int("width", 2, 16, log=True)
    return {
        "model": f"linear:{width},relu,linear:1",
        "lr": trial.suggest_float("lr", 1e-4, 1e-1, log=True),
        "batch_size": trial.suggest_categorical("batch_size", [16, 64]),
    }


def test_tpe_trials_train_on_trainerd_and_are_told_their_validation_loss(
    client: trainerd.Client, name: str
) -> None:
    x, y = seed_data(400, seed=3)
    client.upload(name, x, y)
    study = optuna.create_study(
        sampler=optuna.samplers.TPESampler(seed=0), pruner=optuna.pruners.NopPruner()
    )
    sweeps = optimize(
        client, study, name, space, n_trials=8, batch=4, model="linear:1", epochs=6,
        validation_fraction=0.25, seed=5, timeout=120,
    )
    assert len(sweeps) == 2 and len(study.trials) == 8
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    best = client.job(study.best_trial.user_attrs["trainerd_job"])
    assert study.best_value == pytest.approx(best.history[-1].validation_loss)
    assert best.spec.model == f"linear:{study.best_params['width']},relu,linear:1"
    assert best.spec.batch_size == study.best_params["batch_size"]
    assert study.best_trial.intermediate_values == {
        e.epoch: pytest.approx(e.validation_loss) for e in best.history
    }


class _PruneOddTrials(optuna.pruners.BasePruner):  # type: ignore[misc]
    def prune(self, study: Any, trial: Any) -> bool:
        return bool(trial.number % 2 == 1 and trial.last_step is not None and trial.last_step >= 1)


def test_optunas_pruner_and_the_daemons_halving_both_prune(
    client: trainerd.Client, name: str
) -> None:
    x, y = seed_data(400, seed=4)
    client.upload(name, x, y)
    study = optuna.create_study(pruner=_PruneOddTrials(), sampler=optuna.samplers.RandomSampler(0))
    optimize(
        client, study, name, space, n_trials=4, batch=4, model="linear:1", epochs=200,
        validation_fraction=0.25, seed=5, timeout=120,
    )
    states = [t.state for t in study.trials]
    assert states[1] == states[3] == optuna.trial.TrialState.PRUNED
    assert states[0] == states[2] == optuna.trial.TrialState.COMPLETE

    halving = optuna.create_study(
        sampler=optuna.samplers.RandomSampler(1), pruner=optuna.pruners.NopPruner()
    )
    optimize(
        client, halving, name,
        lambda t: {"lr": t.suggest_float("lr", 1e-7, 1e-1, log=True)},
        n_trials=8, batch=8, model="linear:1", epochs=8, validation_fraction=0.25, seed=5,
        halving_min_epochs=1, halving_reduction_factor=2, timeout=120,
    )
    pruned = [t for t in halving.trials if t.state == optuna.trial.TrialState.PRUNED]
    assert pruned
    for trial in pruned:
        job = client.job(trial.user_attrs["trainerd_job"])
        assert job.stopped_early and "rung of epoch" in job.stop_reason
    with pytest.raises(ValueError, match="direction='minimize'"):
        optimize(client, optuna.create_study(direction="maximize"), name, space, n_trials=1,
                 model="linear:1")
