"""Parity of the optimizers and their options, one test per option: trainerd's per-epoch losses
and trained parameters against the plain PyTorch loop of reference_loop.py with torch.optim's
optimizer of the same name (reference_optim.py). The hand-written fused path runs none of these
options (engine auto falls back to LibTorch, naming why), so they are checked on LibTorch."""

from __future__ import annotations

import pytest

MLP = "linear:8,relu,linear:1"
CLASSIFIER = "linear:8,relu,linear:3"


def test_adam_amsgrad(parity):
    parity.check("regression", model=MLP, optimizer="adam", amsgrad=True, lr=0.02, beta2=0.9,
                 epochs=3, batch_size=16)


def test_adamw_amsgrad(parity):
    parity.check("regression", model=MLP, optimizer="adamw", amsgrad=True, lr=0.02,
                 weight_decay=0.05, epochs=3, batch_size=16)


def test_rmsprop_centered(parity):
    parity.check("regression", model=MLP, optimizer="rmsprop", centered=True, lr=0.01,
                 momentum=0.5, epochs=3, batch_size=16)


def test_nadam(parity):
    parity.check("regression", model=MLP, optimizer="nadam", lr=0.01, epochs=3, batch_size=16)


def test_nadam_momentum_decay_and_l2_weight_decay(parity):
    parity.check("regression", model=MLP, optimizer="nadam", lr=0.01, momentum_decay=0.05,
                 weight_decay=0.1, beta1=0.8, epochs=3, batch_size=16)


def test_nadam_decoupled_weight_decay(parity):
    parity.check("regression", model=MLP, optimizer="nadam", lr=0.01, weight_decay=0.1,
                 decoupled_weight_decay=True, epochs=3, batch_size=16)


# 18 steps: RAdam's unrectified first steps and its rectified ones (from step 6 at beta2 0.999).
def test_radam(parity):
    parity.check("regression", model=MLP, optimizer="radam", lr=0.01, epochs=3, batch_size=16)


def test_radam_decoupled_weight_decay(parity):
    parity.check("regression", model=MLP, optimizer="radam", lr=0.01, weight_decay=0.1,
                 decoupled_weight_decay=True, beta2=0.9, epochs=3, batch_size=16)


def test_adagrad(parity):
    parity.check("classes", model=CLASSIFIER, loss="cross_entropy", optimizer="adagrad", lr=0.05,
                 epochs=3, batch_size=16)


def test_adagrad_lr_decay_accumulator_and_weight_decay(parity):
    parity.check("regression", model=MLP, optimizer="adagrad", lr=0.05, lr_decay=0.1,
                 initial_accumulator_value=0.1, weight_decay=0.01, eps=1e-8, epochs=3,
                 batch_size=16)


def test_weight_decay_exclude_bias_and_norm(parity):
    parity.check("regression", model="linear:8,layernorm,relu,linear:1",
                 optimizer="adamw", lr=0.02, weight_decay=0.5,
                 weight_decay_exclude_bias_and_norm=True, epochs=3, batch_size=16)


# (Not adam here: a bias just before batchnorm has a gradient of rounding noise only, which
# Adam's normalisation turns into full-size steps.)
def test_weight_decay_exclude_bias_and_norm_with_sgd_and_batchnorm(parity):
    parity.check("regression", model="linear:8,batchnorm,relu,linear:1", optimizer="sgd", lr=0.05, momentum=0.9,
                 weight_decay=0.1, weight_decay_exclude_bias_and_norm=True, epochs=3,
                 batch_size=16)


# fp16 on the CPU (LibTorch's CPU autocast) against torch.amp.GradScaler with the same optimizer:
# the first two steps overflow the initial scale of 2^16 and are skipped, and the optimizer's step
# count (bias corrections, Adagrad's decayed rate) counts only the steps taken.
@pytest.mark.parametrize(
    "options",
    [
        dict(optimizer="adam", lr=0.01),
        dict(optimizer="adamw", lr=0.01, amsgrad=True),
        dict(optimizer="nadam", lr=0.01),
        dict(optimizer="radam", lr=0.01),
        dict(optimizer="adagrad", lr=0.05, lr_decay=0.1),
    ],
    ids=["adam", "adamw_amsgrad", "nadam", "radam", "adagrad_lr_decay"],
)
def test_fp16_equals_grad_scaler(parity, options):
    (job,) = parity.check("regression", model=MLP, precision="fp16", epochs=3, batch_size=16,
                          **options)
    assert sum(e.skipped_steps or 0 for e in job.history) > 0  # the skips were exercised


