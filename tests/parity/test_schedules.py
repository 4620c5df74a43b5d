"""Parity of the learning-rate schedules, one test per schedule (and per way of stepping it):
trainerd's losses, rates and trained parameters against the plain PyTorch loop stepping the
torch.optim.lr_scheduler class of reference_schedule.py, on both CPU engines. The regression set
has 96 rows: batches of 16 make 6 optimizer steps an epoch."""

from __future__ import annotations

import copy

import torch

import reference_loop

MLP = "linear:8,relu,linear:1"
BOTH = ("libtorch", "fused")


def test_step_per_step(parity):
    parity.check("regression", model=MLP, lr=0.05, schedule="step", step_epochs=4, gamma=0.5,
                 schedule_per_step=True, epochs=3, batch_size=16, engines=BOTH)


def test_multistep(parity):
    parity.check("regression", model=MLP, lr=0.05, schedule="multistep", milestones=[1, 3],
                 gamma=0.5, epochs=5, batch_size=32, engines=BOTH)


def test_multistep_per_step_after_warm_up_steps(parity):
    parity.check("regression", model=MLP, lr=0.05, schedule="multistep", milestones=[4, 9],
                 gamma=0.5, schedule_per_step=True, warmup_steps=3, epochs=3, batch_size=16,
                 engines=BOTH)


def test_exponential(parity):
    parity.check("regression", model=MLP, lr=0.05, schedule="exponential", gamma=0.7, epochs=4,
                 batch_size=32, engines=BOTH)


def test_exponential_per_step(parity):
    parity.check("regression", model=MLP, optimizer="adam", lr=0.02, schedule="exponential",
                 gamma=0.9, schedule_per_step=True, epochs=3, batch_size=16, engines=BOTH)


def test_cosine_per_step_after_warm_up_steps(parity):
    parity.check("regression", model=MLP, lr=0.05, schedule="cosine", min_lr=0.001,
                 schedule_per_step=True, warmup_steps=4, epochs=3, batch_size=16, engines=BOTH)


def test_constant_per_step_after_warm_up_steps(parity):
    parity.check("regression", model=MLP, lr=0.05, schedule_per_step=True, warmup_steps=5,
                 epochs=2, batch_size=16, engines=BOTH)


def test_cosine_restarts(parity):
    parity.check("regression", model=MLP, lr=0.05, schedule="cosine_restarts", t_0=2, t_mult=2,
                 min_lr=0.001, epochs=6, batch_size=32, engines=BOTH)


def test_cosine_restarts_per_step(parity):
    parity.check("regression", model=MLP, lr=0.05, schedule="cosine_restarts", t_0=5,
                 schedule_per_step=True, epochs=3, batch_size=16, engines=BOTH)


def test_onecycle(parity):
    # The momentum stays 0.9 throughout (cycle_momentum=False).
    parity.check("regression", model=MLP, optimizer="sgd", momentum=0.9, lr=0.1,
                 schedule="onecycle", epochs=3, batch_size=16, engines=BOTH)


def test_onecycle_three_phases_linear(parity):
    parity.check("regression", model=MLP, optimizer="adamw", lr=0.02, schedule="onecycle",
                 pct_start=0.25, anneal_strategy="linear", div_factor=10, final_div_factor=100,
                 three_phase=True, epochs=4, batch_size=16, engines=BOTH)


def test_plateau(parity):
    # An improvement must take a quarter off the best validation loss: the rate halves after
    # the epochs that do not (0.1 to 0.05 after epoch 4, 0.025 after 6), with a cooldown epoch
    # after each reduction, down to min_lr (0.02 from epoch 9).
    parity.check("regression", model=MLP, lr=0.1, schedule="plateau", plateau_factor=0.5,
                 plateau_patience=0, plateau_threshold=0.25, plateau_cooldown=1, min_lr=0.02,
                 validation_fraction=0.25, epochs=10, batch_size=16, engines=BOTH)


def test_onecycle_on_data_parallel_ranks(parity):
    # 3 ranks of 8 rows train as one loop on batches of 24: 4 steps an epoch, 12 in all.
    x, y = parity.data("regression")
    spec = dict(model=MLP, lr=0.1, momentum=0.9, seed=7, epochs=3, schedule="onecycle")
    job = parity.run("regression", "libtorch", dict(spec, batch_size=8, replicas=3))
    parity.compare(job, reference_loop.train(dict(spec, batch_size=24), x, y), 1e-5, "3 ranks")


def test_plateau_on_data_parallel_ranks(parity):
    x, y = parity.data("regression")
    spec = dict(model=MLP, lr=0.1, seed=7, epochs=10, schedule="plateau", plateau_factor=0.5,
                plateau_patience=0, plateau_threshold=0.25, plateau_cooldown=1, min_lr=0.02,
                validation_fraction=0.25)
    job = parity.run("regression", "libtorch", dict(spec, batch_size=8, replicas=2))
    parity.compare(job, reference_loop.train(dict(spec, batch_size=16), x, y), 1e-5, "2 ranks")


def test_per_step_cosine_in_the_torchscript_worker(parity):
    x, y = parity.data("regression")
    torch.manual_seed(3)
    module = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))
    spec = dict(lr=0.05, momentum=0.5, seed=7, epochs=3, batch_size=16, schedule="cosine",
                min_lr=0.001, schedule_per_step=True, warmup_steps=2)
    want = reference_loop.train(spec, x, y, module=copy.deepcopy(module))
    job = parity.run("regression", "auto", dict(spec, model=torch.jit.script(module)))
    parity.compare(job, want, 1e-5, "TorchScript module")


def test_onecycle_counts_optimizer_steps_under_accumulation_and_drop_last(parity):
    # 96 rows in batches of 10: 9 whole batches (drop_last), 3 optimizer steps of 3 batches each.
    (job,) = parity.check("regression", model=MLP, lr=0.05, schedule="onecycle", epochs=3,
                          batch_size=10, drop_last=True, gradient_accumulation_steps=3)
    assert job.steps == 3 * 3


def test_per_step_cosine_with_a_short_last_group_and_fp16(parity):
    # 96 rows in batches of 16: 6 batches, groups of 4 and 2: 2 optimizer steps an epoch.
    (job,) = parity.check("regression", model=MLP, optimizer="adam", lr=0.01, schedule="cosine",
                          schedule_per_step=True, min_lr=0.001, epochs=3, batch_size=16,
                          gradient_accumulation_steps=4, precision="fp16")
    assert job.steps == 3 * 2
