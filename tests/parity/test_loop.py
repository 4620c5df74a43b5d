"""Parity of the epoch loop's rules and options, one test per rule or option: the order of the
rows without shuffling, the held-out count's rounding, the epoch loss's reduction, dropout's
draws, gradient accumulation, drop_last and early stopping's min_delta and accuracy metric,
against the plain PyTorch loop of reference_loop.py on every engine that takes the job."""

from __future__ import annotations

import copy

import reference_loop

MLP = "linear:8,relu,linear:1"
CLASSIFIER = "linear:8,relu,linear:3"
BOTH = ("libtorch", "fused")


def test_no_shuffle_with_validation_trains_the_rows_in_dataset_order(parity):
    # 96 rows, 24 held out: the 72 training rows in ascending row index, batches of 20.
    parity.check("regression", model=MLP, lr=0.05, shuffle=False, validation_fraction=0.25,
                 epochs=3, batch_size=20, engines=BOTH)


def test_held_out_rows_round_halves_away_from_zero(parity):
    # 96 rows at 0.234375 are 22.5 rows: 23 are held out, where Python's round() gives 22.
    assert reference_loop.held_out_rows(0.234375, 96) == 23
    assert reference_loop.held_out_rows(0.25, 10) == 3
    (job,) = parity.check("regression", model=MLP, lr=0.05, validation_fraction=0.234375,
                          epochs=2, batch_size=73)
    # 73 training rows in one batch a step: one step an epoch.
    assert job.steps == 2
    assert len(job.validation_rows()) == 23


def test_epoch_loss_is_the_mean_over_rows(parity):
    # 96 rows in batches of 40: 40, 40 and 16; the mean over rows weighs the last batch by 16.
    parity.check("regression", model=MLP, lr=0.05, epochs=2, batch_size=40, engines=BOTH)


def test_dropout_draws_after_the_permutation_step_by_step(parity):
    parity.check("classes", model="linear:16,relu,dropout:0.4,linear:8,relu,dropout:0.2,linear:3",
                 loss="cross_entropy", lr=0.1, epochs=3, batch_size=12, validation_fraction=0.2)


def test_gradient_accumulation(parity):
    # 96 rows in batches of 10: 10 batches, groups of 3 (the last group of 1 divides by 3 too).
    (job,) = parity.check("regression", model=MLP, lr=0.05, momentum=0.9, epochs=3,
                          batch_size=10, gradient_accumulation_steps=3)
    assert job.steps == 3 * 4


def test_gradient_accumulation_with_clipping_and_dropout(parity):
    parity.check("classes", model="linear:8,relu,dropout:0.3,linear:3", loss="cross_entropy",
                 optimizer="adam", lr=0.01, clip_grad_norm=0.5, epochs=3, batch_size=16,
                 gradient_accumulation_steps=2, validation_fraction=0.25)


def test_drop_last(parity):
    # 96 rows in batches of 40: the last 16 rows of each epoch's order are dropped.
    (job, fused) = parity.check("regression", model=MLP, lr=0.05, epochs=3, batch_size=40,
                                drop_last=True, engines=BOTH)
    assert job.steps == fused.steps == 3 * 2


def test_drop_last_with_accumulation(parity):
    parity.check("regression", model=MLP, lr=0.05, epochs=3, batch_size=12, drop_last=True,
                 gradient_accumulation_steps=3)


def test_early_stopping_min_delta(parity):
    (job,) = parity.check("classes", model=CLASSIFIER, loss="cross_entropy", lr=0.3, epochs=30,
                          batch_size=8, validation_fraction=0.3, early_stop_patience=2,
                          early_stop_min_delta=0.01)
    assert job.stopped_early


def test_early_stopping_on_validation_accuracy(parity):
    (job,) = parity.check("classes", model=CLASSIFIER, loss="cross_entropy", lr=0.3, epochs=30,
                          batch_size=8, validation_fraction=0.3, early_stop_patience=3,
                          early_stop_metric="accuracy")
    assert job.stopped_early


def test_early_stopping_on_accuracy_with_min_delta_on_the_fused_path(parity):
    parity.check("classes", model=CLASSIFIER, loss="cross_entropy", lr=0.3, epochs=20,
                 batch_size=8, validation_fraction=0.3, early_stop_patience=2,
                 early_stop_metric="accuracy", early_stop_min_delta=0.02, engines=BOTH)


def test_data_parallel_drop_last_drops_the_short_global_batch(parity):
    x, y = parity.data("regression")
    job = parity.run("regression", "libtorch", dict(model=MLP, lr=0.05, momentum=0.9, seed=7,
                                                    epochs=3, batch_size=10, replicas=3,
                                                    drop_last=True))
    want = reference_loop.train(dict(model=MLP, lr=0.05, momentum=0.9, seed=7, epochs=3,
                                     batch_size=30, drop_last=True), x, y)
    assert want.steps == 3 * 3
    parity.compare(job, want, 1e-5, "3 ranks, drop_last")


def test_sweep_members_accumulate_as_alone(parity):
    x, y = parity.data("regression")
    sweep = parity.client.sweep("regression", model=MLP, lr=[0.01, 0.05], seed=7, epochs=2,
                                batch_size=16, gradient_accumulation_steps=2, drop_last=True)
    sweep.wait(timeout=300)
    assert len(sweep.jobs) == 2
    for job in sweep.jobs:
        job.refresh()
        spec = dict(model=MLP, lr=job.spec.optimizer.learning_rate, seed=7, epochs=2,
                    batch_size=16, gradient_accumulation_steps=2, drop_last=True)
        parity.compare(job, reference_loop.train(copy.deepcopy(spec), x, y), 1e-5,
                       f"sweep member lr {spec['lr']}")
