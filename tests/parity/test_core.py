"""Parity of the options trainerd has long had, one test per option: trainerd's per-epoch losses
(and validation figures) and trained parameters against the plain PyTorch loop of
reference_loop.py, on every engine that takes the job on the CPU."""

from __future__ import annotations

import copy

import pytest
import torch

import reference_loop

MLP = "linear:8,relu,linear:1"
CLASSIFIER = "linear:8,relu,linear:3"
BOTH = ("libtorch", "fused")


def test_sgd(parity):
    parity.check("regression", model=MLP, optimizer="sgd", lr=0.05, epochs=3, batch_size=16,
                 engines=BOTH)


def test_sgd_momentum(parity):
    parity.check("regression", model=MLP, optimizer="sgd", lr=0.02, momentum=0.9, epochs=3,
                 batch_size=16, engines=BOTH)


def test_sgd_nesterov(parity):
    parity.check("regression", model=MLP, optimizer="sgd", lr=0.02, momentum=0.9, nesterov=True,
                 epochs=3, batch_size=16, engines=BOTH)


def test_sgd_weight_decay(parity):
    parity.check("regression", model=MLP, optimizer="sgd", lr=0.05, weight_decay=0.1, epochs=3,
                 batch_size=16, engines=BOTH)


def test_adam(parity):
    parity.check("regression", model=MLP, optimizer="adam", lr=0.01, beta1=0.8, beta2=0.99,
                 eps=1e-6, epochs=3, batch_size=16, engines=BOTH)


def test_adam_weight_decay_is_l2(parity):
    parity.check("regression", model=MLP, optimizer="adam", lr=0.01, weight_decay=0.1, epochs=3,
                 batch_size=16, engines=BOTH)


def test_adamw(parity):
    parity.check("regression", model=MLP, optimizer="adamw", lr=0.01, weight_decay=0.2, epochs=3,
                 batch_size=16, engines=BOTH)


def test_rmsprop(parity):
    parity.check("regression", model=MLP, optimizer="rmsprop", lr=0.005, alpha=0.9, momentum=0.5,
                 weight_decay=0.01, epochs=3, batch_size=16, engines=BOTH)


def test_step_schedule(parity):
    parity.check("regression", model=MLP, lr=0.05, schedule="step", step_epochs=2, gamma=0.5,
                 epochs=5, batch_size=32, engines=BOTH)


def test_cosine_schedule_with_warm_up(parity):
    parity.check("regression", model=MLP, lr=0.05, schedule="cosine", min_lr=0.001,
                 warmup_epochs=2, epochs=6, batch_size=32, engines=BOTH)


def test_mse_without_shuffle(parity):
    parity.check("regression", model=MLP, lr=0.05, shuffle=False, epochs=2, batch_size=20,
                 engines=BOTH)


def test_l1(parity):
    parity.check("regression", model=MLP, loss="l1", lr=0.05, epochs=3, batch_size=16,
                 engines=BOTH)


def test_huber(parity):
    parity.check("regression", model=MLP, loss="huber", huber_delta=0.5, lr=0.05, epochs=3,
                 batch_size=16, engines=BOTH)


def test_bce_with_logits(parity):
    parity.check("binary", model="linear:8,tanh,linear:2", loss="bce_with_logits", lr=0.1,
                 epochs=3, batch_size=16, engines=BOTH)


def test_cross_entropy(parity):
    parity.check("classes", model=CLASSIFIER, loss="cross_entropy", lr=0.1, epochs=3,
                 batch_size=16, engines=BOTH)


def test_cross_entropy_label_smoothing(parity):
    parity.check("classes", model=CLASSIFIER, loss="cross_entropy", label_smoothing=0.2, lr=0.1,
                 epochs=3, batch_size=16, engines=BOTH)


def test_nll(parity):
    parity.check("classes", model="linear:8,relu,linear:3,logsoftmax", loss="nll", lr=0.1,
                 epochs=3, batch_size=16)


def test_batchnorm(parity):
    parity.check("regression", model="linear:8,batchnorm,relu,linear:1", lr=0.05, epochs=3,
                 batch_size=16, validation_fraction=0.25)


def test_layernorm_and_gelu(parity):
    parity.check("regression", model="linear:8,layernorm,gelu,linear:1", lr=0.05, epochs=3,
                 batch_size=16)


def test_conv_and_pooling(parity):
    parity.check("images", model="conv2d:3:3:1:1,relu,maxpool2d:2,conv2d:2:3,avgpool2d:1,"
                 "flatten,linear:3", loss="cross_entropy", lr=0.05, epochs=2, batch_size=16)


def test_gradient_clipping(parity):
    parity.check("regression", model=MLP, lr=0.1, clip_grad_norm=0.5, epochs=3, batch_size=16,
                 engines=BOTH)


def test_validation_fraction_in_eval_mode(parity):
    parity.check("classes", model="linear:8,relu,dropout:0.3,linear:3", loss="cross_entropy",
                 lr=0.1, epochs=3, batch_size=16, validation_fraction=0.25)


def test_validation_dataset(parity):
    parity.check("regression", model=MLP, lr=0.05, epochs=3, batch_size=16,
                 validation_dataset="regression_validation", engines=BOTH)


def test_dropout_masks_from_the_jobs_generator(parity):
    parity.check("regression", model="linear:16,relu,dropout:0.25,linear:8,tanh,dropout:0.5,"
                 "linear:1", lr=0.05, epochs=3, batch_size=16)


def test_early_stopping_stops_at_the_same_epoch(parity):
    (job,) = parity.check("classes", model=CLASSIFIER, loss="cross_entropy", lr=0.8, epochs=30,
                          batch_size=8, validation_fraction=0.3, early_stop_patience=2)
    assert job.stopped_early and len(job.history) < 30


def test_bf16_autocast(parity):
    parity.check("regression", model=MLP, lr=0.05, precision="bf16", epochs=2, batch_size=16)


@pytest.mark.parametrize("engine", ["libtorch", "fused"])
def test_sweep_members_train_as_alone(parity, engine):
    x, y = parity.data("regression")
    sweep = parity.client.sweep("regression", model=MLP, lr=[0.01, 0.05, 0.1],
                                momentum=[0.0, 0.9], seed=7, epochs=3, batch_size=16,
                                engine=engine)
    sweep.wait(timeout=300)
    assert len(sweep.jobs) == 6
    for job in sweep.jobs:
        job.refresh()
        spec = dict(model=MLP, lr=job.spec.optimizer.learning_rate,
                    momentum=job.spec.optimizer.momentum, seed=7, epochs=3, batch_size=16)
        want = reference_loop.train(spec, x, y)
        parity.compare(job, want, 1e-5, f"{engine} sweep member lr {spec['lr']} momentum {spec['momentum']}")


def test_data_parallel_ranks_train_as_one_loop_on_the_global_batch(parity):
    x, y = parity.data("regression")
    job = parity.run("regression", "libtorch", dict(model=MLP, lr=0.05, momentum=0.9, seed=7,
                                                    epochs=3, batch_size=8, replicas=3))
    want = reference_loop.train(dict(model=MLP, lr=0.05, momentum=0.9, seed=7, epochs=3,
                                     batch_size=24), x, y)
    parity.compare(job, want, 1e-5, "3 ranks")


def test_torchscript_module_in_the_worker(parity):
    x, y = parity.data("regression")
    torch.manual_seed(3)
    module = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))
    spec = dict(lr=0.05, momentum=0.5, seed=7, epochs=3, batch_size=16)
    want = reference_loop.train(spec, x, y, module=copy.deepcopy(module))
    job = parity.run("regression", "auto", dict(spec, model=torch.jit.script(module)))
    parity.compare(job, want, 1e-5, "TorchScript module")
