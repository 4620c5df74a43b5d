"""Prints the learning rates that tests/engine/optimizer_test.cc (ScheduleTest) expects, from
PyTorch's own schedulers: the rate of each epoch (or step) is the optimizer's lr before that
epoch's (step's) scheduler.step(). Run once with the torch environment and paste the output:

    . build/deps.env; $TRAINERD_TORCH_VENV/bin/python tests/engine/testdata/schedule_rates.py
"""
import warnings

import torch
from torch.optim import lr_scheduler as S

warnings.filterwarnings("ignore")


def rates(lr, make, units, metrics=None):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = make(opt)
    out = []
    for i in range(units):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        if metrics is None:
            sched.step()
        else:
            sched.step(metrics[i])
    return out


def show(name, values):
    print(f"  // {name}")
    print("  {" + ", ".join(repr(v) for v in values) + "},")


show("MultiStepLR(milestones=[2, 5], gamma=0.5), lr 1, 8 epochs",
     rates(1.0, lambda o: S.MultiStepLR(o, milestones=[2, 5], gamma=0.5), 8))
show("ExponentialLR(gamma=0.9), lr 0.5, 5 epochs",
     rates(0.5, lambda o: S.ExponentialLR(o, gamma=0.9), 5))
show("CosineAnnealingWarmRestarts(T_0=3, T_mult=2, eta_min=0.1), lr 1, 12 epochs",
     rates(1.0, lambda o: S.CosineAnnealingWarmRestarts(o, T_0=3, T_mult=2, eta_min=0.1), 12))
show("CosineAnnealingWarmRestarts(T_0=2), lr 1, 5 epochs",
     rates(1.0, lambda o: S.CosineAnnealingWarmRestarts(o, T_0=2), 5))
show("OneCycleLR(max_lr=0.1, epochs=4, steps_per_epoch=5, cycle_momentum=False), 20 steps",
     rates(0.1, lambda o: S.OneCycleLR(o, max_lr=0.1, epochs=4, steps_per_epoch=5,
                                         cycle_momentum=False), 20))
show("OneCycleLR(max_lr=1, total_steps=10, pct_start=0.25, anneal_strategy='linear', "
     "div_factor=10, final_div_factor=100, three_phase=True, cycle_momentum=False)",
     rates(1.0, lambda o: S.OneCycleLR(o, max_lr=1.0, total_steps=10, pct_start=0.25,
                                         anneal_strategy="linear", div_factor=10,
                                         final_div_factor=100, three_phase=True,
                                         cycle_momentum=False), 10))
losses = [1.0, 0.95, 0.97, 0.96, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]
show("ReduceLROnPlateau(factor=0.5, patience=2, threshold=0.1, cooldown=1, min_lr=0.2), lr 1, "
     "validation losses " + repr(losses),
     rates(1.0, lambda o: S.ReduceLROnPlateau(o, factor=0.5, patience=2, threshold=0.1,
                                                cooldown=1, min_lr=0.2), len(losses), losses))
show("ReduceLROnPlateau() defaults, lr 1, 14 epochs of validation loss 1",
     rates(1.0, lambda o: S.ReduceLROnPlateau(o), 14, [1.0] * 14))
show("SequentialLR(LinearLR(start_factor=1/4, total_iters=3), CosineAnnealingLR(T_max=7), "
     "milestones=[3]), lr 1, 10 steps",
     rates(1.0, lambda o: S.SequentialLR(o, [S.LinearLR(o, start_factor=0.25, total_iters=3),
                                             S.CosineAnnealingLR(o, T_max=7)],
                                         milestones=[3]), 10))
show("StepLR(step_size=4, gamma=0.5), lr 1, 10 steps",
     rates(1.0, lambda o: S.StepLR(o, step_size=4, gamma=0.5), 10))
