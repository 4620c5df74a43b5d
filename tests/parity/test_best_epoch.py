"""Parity of the model a job hands back (``model_from``): with early stopping, or when asked, the
weights of the best validation epoch, as a PyTorch loop that copies the model's state_dict at each
improvement (Keras' restore_best_weights, Lightning's ModelCheckpoint) and loads it at the end;
the last epoch's otherwise. The parameters compared are the handed-back model's."""

from __future__ import annotations

CLASSIFIER = "linear:8,relu,linear:3"
BOTH = ("libtorch", "fused")
STOPPING = dict(dataset="classes", model=CLASSIFIER, loss="cross_entropy", lr=0.3, epochs=30,
                batch_size=8, validation_fraction=0.3, early_stop_patience=2)


def test_early_stopping_hands_back_the_best_epoch(parity):
    for job in parity.check(**STOPPING, engines=BOTH):
        assert job.stopped_early
        assert job.model_epoch == job.best_epoch == len(job.history) - 2


def test_early_stopping_on_accuracy_hands_back_the_best_accuracy_epoch(parity):
    for job in parity.check(**dict(STOPPING, early_stop_patience=3), early_stop_metric="accuracy",
                            early_stop_min_delta=0.02, engines=BOTH):
        assert job.stopped_early
        assert job.model_epoch == job.best_epoch == len(job.history) - 3


def test_model_from_last_with_early_stopping(parity):
    for job in parity.check(**STOPPING, model_from="last", engines=BOTH):
        assert job.stopped_early
        assert job.model_epoch == len(job.history) > job.best_epoch


def test_model_from_best_without_early_stopping(parity):
    spec = dict(STOPPING, epochs=12)
    del spec["early_stop_patience"]
    for job in parity.check(**spec, model_from="best", engines=BOTH):
        assert len(job.history) == 12
        losses = [e.validation_loss for e in job.history]
        assert job.model_epoch == job.best_epoch == losses.index(min(losses)) + 1


def test_model_from_best_on_a_validation_dataset(parity):
    parity.check("regression", model="linear:8,relu,linear:1", lr=0.05, epochs=15, batch_size=16,
                 validation_dataset="regression_validation", model_from="best", engines=BOTH)
