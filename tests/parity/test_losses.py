"""Parity of the loss options, one test per option: class weights, ignore_index and pos_weight as
torch.nn's losses take them, and the validation loss as the plain loss (without label smoothing,
class weights or pos_weight; ignored rows left out), against the plain PyTorch loop of
reference_loop.py on every engine that takes the job on the CPU. The fused path refuses class
weights, ignore_index and pos_weight (engine auto then trains on LibTorch, which these tests
check through the job's report)."""

from __future__ import annotations

import copy
import math

import torch

import reference_loop

CLASSIFIER = "linear:8,relu,linear:3"
LOG_CLASSIFIER = "linear:8,relu,linear:3,logsoftmax"
WEIGHTS = [0.5, 2.0, 1.25]


def test_validation_loss_is_plain_without_label_smoothing(parity):
    parity.check("classes", model=CLASSIFIER, loss="cross_entropy", label_smoothing=0.2, lr=0.1,
                 epochs=3, batch_size=16, validation_fraction=0.25,
                 engines=("libtorch", "fused"))


def test_class_weights_cross_entropy(parity):
    jobs = parity.check("classes", model=CLASSIFIER, loss="cross_entropy", class_weights=WEIGHTS,
                        lr=0.1, epochs=3, batch_size=16, validation_fraction=0.25,
                        engines=("libtorch", "auto"))
    assert jobs[1].report.engine == "libtorch"
    assert jobs[1].report.engine_reason == "class_weights have no fused kernel"


def test_class_weights_with_label_smoothing(parity):
    parity.check("classes", model=CLASSIFIER, loss="cross_entropy", class_weights=WEIGHTS,
                 label_smoothing=0.1, lr=0.1, epochs=3, batch_size=16, validation_fraction=0.25)


def test_class_weights_nll(parity):
    parity.check("classes", model=LOG_CLASSIFIER, loss="nll", class_weights=WEIGHTS, lr=0.1,
                 epochs=3, batch_size=16, validation_fraction=0.25)


def test_ignore_index_cross_entropy(parity):
    parity.check("classes_ignoring", model=CLASSIFIER, loss="cross_entropy", ignore_index=-100,
                 class_weights=WEIGHTS, label_smoothing=0.1, lr=0.1, epochs=3, batch_size=16,
                 validation_fraction=0.25)


def test_ignore_index_nll(parity):
    parity.check("classes_ignoring", model=LOG_CLASSIFIER, loss="nll", ignore_index=-100, lr=0.1,
                 epochs=3, batch_size=16, validation_fraction=0.25)


def test_ignore_index_batch_of_only_ignored_rows(parity):
    # Unshuffled, the first batch of each epoch is 8 ignored rows: loss 0, zero gradients, and
    # the step still taken (momentum carries on), where PyTorch's mean would be NaN.
    jobs = parity.check("classes_ignored_block", model=CLASSIFIER, loss="cross_entropy",
                        ignore_index=-100, lr=0.1, momentum=0.5, epochs=3, batch_size=8,
                        shuffle=False)
    assert all(math.isfinite(e.loss) for e in jobs[0].history)


def test_pos_weight(parity):
    jobs = parity.check("binary", model="linear:8,tanh,linear:2", loss="bce_with_logits",
                        pos_weight=[3.0, 0.5], lr=0.1, epochs=3, batch_size=16,
                        validation_fraction=0.25, engines=("libtorch", "auto"))
    assert jobs[1].report.engine_reason == "pos_weight has no fused kernel"


def test_pos_weight_data_parallel_ranks_train_as_one_loop(parity):
    x, y = parity.data("binary")
    spec = dict(model="linear:8,tanh,linear:2", loss="bce_with_logits", pos_weight=[3.0, 0.5],
                lr=0.1, momentum=0.5, seed=7, epochs=3)
    job = parity.run("binary", "libtorch", dict(spec, batch_size=8, replicas=3))
    want = reference_loop.train(dict(spec, batch_size=24), x, y)
    parity.compare(job, want, 1e-5, "3 ranks")


def test_class_weights_and_ignore_index_in_the_torchscript_worker(parity):
    x, y = parity.data("classes_ignoring")
    torch.manual_seed(3)
    module = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
    spec = dict(loss="cross_entropy", class_weights=WEIGHTS, ignore_index=-100, lr=0.1,
                seed=7, epochs=3, batch_size=16, validation_fraction=0.25)
    want = reference_loop.train(spec, x, y, module=copy.deepcopy(module))
    job = parity.run("classes_ignoring", "auto", dict(spec, model=torch.jit.script(module)))
    parity.compare(job, want, 1e-5, "TorchScript module")
