"""The JobSpec of ``Client.submit`` and ``Client.sweep``, built from keyword arguments that mirror
trainctl's submit flags (client/submit_flags.cc; ``--batch-size`` is ``batch_size``) with the same
defaults and the same local checks (client/requests.cc, JobSpecFromFlags), so that a typo is an
error before anything is sent. The daemon checks the spec against the dataset at submit.
"""

from __future__ import annotations

import datetime
import io
import math
import os
import warnings
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict, Union

from trainerd._optional import import_torch
from trainerd._upload import validate_dataset_reference
from trainerd.v1 import jobs_pb2

__all__ = [
    "DEFAULTS",
    "MAX_EPOCHS",
    "MAX_SWEEP_MEMBERS",
    "MAX_TORCHSCRIPT_BYTES",
    "OPTION_NAMES",
    "SpecOptions",
    "SweepOptions",
    "build_spec",
    "is_exported_program",
    "model_argument",
    "needs_feature_shape",
]

#: trainctl's defaults (client/requests.cc and the help of client/submit_flags.cc).
#: No "loss": without one the daemon picks it by the dataset's targets (cross_entropy for int64
#: class indices, mse for float32 values).
DEFAULTS: dict[str, Any] = {
    "optimizer": "sgd",
    "lr": 0.01,
    "momentum": 0.0,
    "label_smoothing": 0.0,
    "schedule": "constant",
    "gamma": 0.1,
    "min_lr": 0.0,
    "warmup_epochs": 0,
    "clip_grad_norm": 0.0,
    "batch_size": 32,
    "epochs": 10,
    "validation_fraction": 0.0,
    "early_stop_patience": 0,
    "early_stop_min_delta": 0.0,
    "early_stop_metric": "loss",
    "model_from": "auto",
    "gradient_accumulation_steps": 1,
    "drop_last": False,
    "checkpoint_every": 0,
    "precision": "fp32",
    "priority": "normal",
    "engine": "auto",
    "shuffle": True,
}

MAX_EPOCHS = 1_000_000  # common/job_limits.h kMaxEpochs
MAX_CHECKPOINTS_PER_JOB = 1000
MAX_SWEEP_VALUES = 256
MAX_SWEEP_MEMBERS = 256
MAX_MODEL_SPEC_BYTES = 4096
MAX_LOSS_WEIGHTS = 1 << 20  # common/job_limits.h kMaxLossWeights
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
# The daemon's message limit less room for the spec (common/job_limits.h kMaxTorchScriptBytes).
MAX_TORCHSCRIPT_BYTES = (64 << 20) - (64 << 10)
_INT32_MAX = 2**31 - 1
_UINT64_MAX = 2**64 - 1

#: What ``model=`` takes: a spec string, a torch.nn.Module, a path to a TorchScript file, or the
#: bytes of one.
ModelArg = Union[str, "os.PathLike[str]", bytes, Any]


class SweepOptions(TypedDict, total=False):
    """The keyword arguments of a job's spec that a sweep applies to every member: all but
    ``dataset``, ``model`` and the swept ``lr``, ``momentum``, ``weight_decay`` and ``seed``;
    see :meth:`trainerd.Client.submit` for each one's meaning and default."""

    loss: str
    huber_delta: float
    label_smoothing: float
    class_weights: Sequence[float]
    ignore_index: int
    pos_weight: Sequence[float]
    optimizer: str
    nesterov: bool
    beta1: float
    beta2: float
    eps: float
    alpha: float
    amsgrad: bool
    centered: bool
    momentum_decay: float
    decoupled_weight_decay: bool
    lr_decay: float
    initial_accumulator_value: float
    weight_decay_exclude_bias_and_norm: bool
    schedule: str
    step_epochs: int
    gamma: float
    min_lr: float
    warmup_epochs: int
    schedule_per_step: bool
    warmup_steps: int
    milestones: Sequence[int]
    t_0: int
    t_mult: int
    pct_start: float
    anneal_strategy: str
    div_factor: float
    final_div_factor: float
    three_phase: bool
    plateau_factor: float
    plateau_patience: int
    plateau_threshold: float
    plateau_cooldown: int
    clip_grad_norm: float
    batch_size: int
    epochs: int
    validation_fraction: float
    validation_dataset: str
    early_stop_patience: int
    early_stop_min_delta: float
    early_stop_metric: str
    model_from: str
    gradient_accumulation_steps: int
    drop_last: bool
    checkpoint_every: int
    precision: str
    device: str
    priority: str
    engine: str
    max_job_time: float | datetime.timedelta
    shuffle: bool
    replicas: int
    nodes: Sequence[str] | str


class SpecOptions(SweepOptions, total=False):
    """The keyword arguments of a job's spec (all but ``dataset`` and ``model``)."""

    lr: float
    momentum: float
    weight_decay: float
    seed: int


#: Every option's name.
OPTION_NAMES = frozenset(SpecOptions.__required_keys__ | SpecOptions.__optional_keys__)

_LOSSES = {
    "mse": jobs_pb2.LOSS_MSE,
    "cross_entropy": jobs_pb2.LOSS_CROSS_ENTROPY,
    "cross-entropy": jobs_pb2.LOSS_CROSS_ENTROPY,
    "l1": jobs_pb2.LOSS_L1,
    "huber": jobs_pb2.LOSS_HUBER,
    "bce_with_logits": jobs_pb2.LOSS_BCE_WITH_LOGITS,
    "bce-with-logits": jobs_pb2.LOSS_BCE_WITH_LOGITS,
    "nll": jobs_pb2.LOSS_NLL,
}
_OPTIMIZERS = {
    "sgd": jobs_pb2.OPTIMIZER_KIND_SGD,
    "adam": jobs_pb2.OPTIMIZER_KIND_ADAM,
    "adamw": jobs_pb2.OPTIMIZER_KIND_ADAMW,
    "rmsprop": jobs_pb2.OPTIMIZER_KIND_RMSPROP,
    "nadam": jobs_pb2.OPTIMIZER_KIND_NADAM,
    "radam": jobs_pb2.OPTIMIZER_KIND_RADAM,
    "adagrad": jobs_pb2.OPTIMIZER_KIND_ADAGRAD,
}
_SCHEDULES = {
    "constant": jobs_pb2.Schedule.CONSTANT,
    "step": jobs_pb2.Schedule.STEP,
    "cosine": jobs_pb2.Schedule.COSINE,
    "cosine_restarts": jobs_pb2.Schedule.COSINE_WARM_RESTARTS,
    "multistep": jobs_pb2.Schedule.MULTI_STEP,
    "exponential": jobs_pb2.Schedule.EXPONENTIAL,
    "onecycle": jobs_pb2.Schedule.ONE_CYCLE,
    "plateau": jobs_pb2.Schedule.REDUCE_ON_PLATEAU,
}
_PRECISIONS = {
    "fp32": jobs_pb2.PRECISION_FP32,
    "bf16": jobs_pb2.PRECISION_BF16,
    "fp16": jobs_pb2.PRECISION_FP16,
}
_PRIORITIES = {
    "high": jobs_pb2.JOB_PRIORITY_HIGH,
    "normal": jobs_pb2.JOB_PRIORITY_NORMAL,
    "low": jobs_pb2.JOB_PRIORITY_LOW,
}
_EARLY_STOP_METRICS = {
    "loss": jobs_pb2.EARLY_STOP_METRIC_VALIDATION_LOSS,
    "accuracy": jobs_pb2.EARLY_STOP_METRIC_VALIDATION_ACCURACY,
}
_MODEL_FROM = {
    "auto": jobs_pb2.MODEL_FROM_UNSPECIFIED,
    "best": jobs_pb2.MODEL_FROM_BEST,
    "last": jobs_pb2.MODEL_FROM_LAST,
}
_ENGINES = {
    "auto": jobs_pb2.ENGINE_AUTO,
    "fused": jobs_pb2.ENGINE_FUSED,
    "libtorch": jobs_pb2.ENGINE_LIBTORCH,
}


def _choice(name: str, value: object, table: Mapping[str, int], what: str) -> int:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    found = table.get(value)
    if found is None:
        names = [k for k in table if "-" not in k]
        expected = ", ".join(names[:-1]) + " or " + names[-1]
        raise ValueError(f"{name}: unknown {what} {value!r} (expected {expected})")
    return found


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    result = float(value)
    if not math.isfinite(result):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return result


def _number_in(
    name: str, value: object, lo: float, lo_open: bool, hi: float, hi_open: bool
) -> float:
    """The value, which must lie between lo and hi (hi = inf: no upper bound); the error names
    the interval, as trainctl's."""
    number = _number(name, value)
    ok = (number > lo if lo_open else number >= lo) and (number < hi if hi_open else number <= hi)
    if ok:
        return number
    if math.isinf(hi):
        interval = f"{'>' if lo_open else '>='} {lo:g}"
    else:
        interval = f"in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    raise ValueError(f"{name} must be {interval}, got {number:g}")


def _integer(name: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        # numpy integers are ints here too.
        if hasattr(value, "__index__") and not isinstance(value, bool):
            value = int(value.__index__())
        else:
            raise TypeError(f"{name} must be a whole number, not {type(value).__name__}")
    assert isinstance(value, int)
    if value < lo:
        raise ValueError(f"{name} must be at least {lo}, got {value}")
    if value > hi:
        raise ValueError(f"{name} must be at most {hi}, got {value}")
    return value


def _applies(options: Mapping[str, Any], name: str, applies: bool, what: str) -> None:
    if name in options and not applies:
        raise ValueError(f"{name} applies to {what} only")


def _seconds(name: str, value: object) -> float:
    if isinstance(value, datetime.timedelta):
        seconds = value.total_seconds()
    else:
        seconds = _number(name, value)
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"{name} must be a positive duration, got {value!r}")
    return seconds


def _weights(name: str, value: object, per: str) -> list[float]:
    """A loss's weight list (class_weights, pos_weight): a sequence of positive finite numbers,
    or a 1-d tensor or array of them; its length is checked before its values are read."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()  # a torch.Tensor or a numpy array
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a sequence of numbers, one per {per}")
    if len(value) == 0:
        raise ValueError(f"{name} needs one weight per {per}; got none")
    if len(value) > MAX_LOSS_WEIGHTS:
        raise ValueError(f"{name} holds at most {MAX_LOSS_WEIGHTS} weights, got {len(value)}")
    weights = []
    for i, item in enumerate(value):
        weight = _number(f"{name}[{i}]", item)
        if weight <= 0:
            raise ValueError(f"{name} values must be positive; {name}[{i}] is {weight:g}")
        weights.append(weight)
    return weights


def check_epochs_and_checkpoints(epochs: int, checkpoint_every: int) -> None:
    """common/job_limits.h CheckEpochsAndCheckpoints, worded for Python."""
    if checkpoint_every > 0 and epochs // checkpoint_every > MAX_CHECKPOINTS_PER_JOB:
        raise ValueError(
            f"a checkpoint every {checkpoint_every} epochs over {epochs} epochs writes "
            f"{epochs // checkpoint_every} checkpoints; at most {MAX_CHECKPOINTS_PER_JOB} are "
            f"allowed (checkpoint every "
            f"{(epochs + MAX_CHECKPOINTS_PER_JOB - 1) // MAX_CHECKPOINTS_PER_JOB} epochs or more)"
        )


def build_spec(
    dataset: str, model: str, options: Mapping[str, Any], sweep: bool = False
) -> jobs_pb2.JobSpec:
    """The JobSpec for ``dataset`` and ``model`` (a spec string, or "torchscript" when the module
    travels beside it) with the options given (``options`` holds only those the caller gave, as
    trainctl's flags: an option that does not apply is an error only when given). ``sweep``:
    ``nodes`` without ``replicas`` spreads the members over the nodes."""
    unknown = sorted(set(options) - OPTION_NAMES)
    if unknown:
        raise TypeError(f"unknown job option {unknown[0]!r}")
    spec = jobs_pb2.JobSpec()
    spec.dataset = validate_dataset_reference(dataset)
    spec.model = model

    def get(name: str) -> Any:
        return options.get(name, DEFAULTS.get(name))

    loss: int = jobs_pb2.LOSS_UNSPECIFIED
    if options.get("loss") is not None:
        loss = _choice("loss", options["loss"], _LOSSES, "loss")
    spec.loss = loss  # type: ignore[assignment]

    optimizer = spec.optimizer
    kind = _choice("optimizer", get("optimizer"), _OPTIMIZERS, "optimizer")
    optimizer.kind = kind  # type: ignore[assignment]
    lr = _number("lr", get("lr"))
    if lr <= 0:
        raise ValueError(f"lr must be > 0, got {lr:g}")
    optimizer.learning_rate = lr
    sgd = kind == jobs_pb2.OPTIMIZER_KIND_SGD
    rmsprop = kind == jobs_pb2.OPTIMIZER_KIND_RMSPROP
    adam_like = kind in (jobs_pb2.OPTIMIZER_KIND_ADAM, jobs_pb2.OPTIMIZER_KIND_ADAMW)
    _applies(options, "momentum", sgd or rmsprop, "optimizer 'sgd' and 'rmsprop'")
    momentum = _number_in("momentum", get("momentum"), 0, False, 1, True)
    optimizer.momentum = momentum
    nesterov = options.get("nesterov", False)
    if not isinstance(nesterov, bool):
        raise TypeError("nesterov must be a bool")
    if nesterov:
        _applies(options, "nesterov", sgd, "optimizer 'sgd'")
        if momentum <= 0:
            raise ValueError("nesterov needs momentum above 0")
        optimizer.nesterov = True
    if "weight_decay" in options:
        optimizer.weight_decay = _number_in(
            "weight_decay", options["weight_decay"], 0, False, math.inf, True
        )
    nadam = kind == jobs_pb2.OPTIMIZER_KIND_NADAM
    radam = kind == jobs_pb2.OPTIMIZER_KIND_RADAM
    adagrad = kind == jobs_pb2.OPTIMIZER_KIND_ADAGRAD
    for name in ("beta1", "beta2"):
        _applies(
            options, name, adam_like or nadam or radam, "optimizer 'adam', 'adamw', 'nadam' and 'radam'"
        )
        if name in options:
            setattr(optimizer, name, _number_in(name, options[name], 0, False, 1, True))
    _applies(options, "eps", not sgd, "optimizers other than 'sgd'")
    if "eps" in options:
        optimizer.eps = _number_in("eps", options["eps"], 0, True, math.inf, True)
    _applies(options, "alpha", rmsprop, "optimizer 'rmsprop'")
    if "alpha" in options:
        optimizer.alpha = _number_in("alpha", options["alpha"], 0, True, 1, True)
    for name, applies, what in (
        ("amsgrad", adam_like, "optimizer 'adam' and 'adamw'"),
        ("centered", rmsprop, "optimizer 'rmsprop'"),
        ("decoupled_weight_decay", nadam or radam, "optimizer 'nadam' and 'radam'"),
        ("weight_decay_exclude_bias_and_norm", True, "every optimizer"),
    ):
        flag = options.get(name, False)
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool")
        if flag:
            _applies(options, name, applies, what)
            setattr(optimizer, name, True)
    for name, applies, what in (
        ("momentum_decay", nadam, "optimizer 'nadam'"),
        ("lr_decay", adagrad, "optimizer 'adagrad'"),
        ("initial_accumulator_value", adagrad, "optimizer 'adagrad'"),
    ):
        _applies(options, name, applies, what)
        if name in options:
            setattr(optimizer, name, _number_in(name, options[name], 0, False, math.inf, True))
    if optimizer.weight_decay_exclude_bias_and_norm:
        decay = (
            optimizer.weight_decay
            if optimizer.HasField("weight_decay")
            else (0.01 if kind == jobs_pb2.OPTIMIZER_KIND_ADAMW else 0.0)
        )
        if not decay > 0:
            raise ValueError(
                "weight_decay_exclude_bias_and_norm needs a weight decay above 0 "
                "(weight_decay; adamw's default is 0.01)"
            )

    _applies(options, "huber_delta", loss == jobs_pb2.LOSS_HUBER, "loss 'huber'")
    if "huber_delta" in options:
        spec.huber_delta = _number_in("huber_delta", options["huber_delta"], 0, True, math.inf, True)
    # Without a loss, the daemon says whether the one the targets call for takes it.
    _applies(
        options,
        "label_smoothing",
        loss in (jobs_pb2.LOSS_CROSS_ENTROPY, jobs_pb2.LOSS_UNSPECIFIED),
        "loss 'cross_entropy'",
    )
    spec.label_smoothing = _number_in("label_smoothing", get("label_smoothing"), 0, False, 1, True)
    class_loss = loss in (jobs_pb2.LOSS_CROSS_ENTROPY, jobs_pb2.LOSS_NLL, jobs_pb2.LOSS_UNSPECIFIED)
    _applies(options, "class_weights", class_loss, "loss 'cross_entropy' and 'nll'")
    if options.get("class_weights") is not None:
        spec.class_weights.extend(_weights("class_weights", options["class_weights"], "class"))
    _applies(options, "ignore_index", class_loss, "loss 'cross_entropy' and 'nll'")
    if options.get("ignore_index") is not None:
        spec.ignore_index = _integer("ignore_index", options["ignore_index"], _INT64_MIN, _INT64_MAX)
    _applies(options, "pos_weight", loss == jobs_pb2.LOSS_BCE_WITH_LOGITS, "loss 'bce_with_logits'")
    if options.get("pos_weight") is not None:
        spec.pos_weight.extend(_weights("pos_weight", options["pos_weight"], "output column"))

    schedule = spec.schedule
    schedule_kind = _choice("schedule", get("schedule"), _SCHEDULES, "schedule")
    schedule.kind = schedule_kind  # type: ignore[assignment]
    step = schedule_kind == jobs_pb2.Schedule.STEP
    cosine = schedule_kind == jobs_pb2.Schedule.COSINE
    multistep = schedule_kind == jobs_pb2.Schedule.MULTI_STEP
    exponential = schedule_kind == jobs_pb2.Schedule.EXPONENTIAL
    restarts = schedule_kind == jobs_pb2.Schedule.COSINE_WARM_RESTARTS
    onecycle = schedule_kind == jobs_pb2.Schedule.ONE_CYCLE
    plateau = schedule_kind == jobs_pb2.Schedule.REDUCE_ON_PLATEAU
    _applies(options, "step_epochs", step, "schedule 'step'")
    _applies(
        options,
        "gamma",
        step or multistep or exponential,
        "schedule 'step', 'multistep' and 'exponential'",
    )
    _applies(
        options,
        "min_lr",
        cosine or restarts or plateau,
        "schedule 'cosine', 'cosine_restarts' and 'plateau'",
    )
    _applies(options, "milestones", multistep, "schedule 'multistep'")
    for name in ("t_0", "t_mult"):
        _applies(options, name, restarts, "schedule 'cosine_restarts'")
    for name in ("pct_start", "anneal_strategy", "div_factor", "final_div_factor", "three_phase"):
        _applies(options, name, onecycle, "schedule 'onecycle'")
    for name in ("plateau_factor", "plateau_patience", "plateau_threshold", "plateau_cooldown"):
        _applies(options, name, plateau, "schedule 'plateau'")
    if step:
        if "step_epochs" not in options:
            raise ValueError("schedule 'step' needs step_epochs=N")
        schedule.step_epochs = _integer("step_epochs", options["step_epochs"], 1, _INT32_MAX)
    if step or multistep or exponential:
        schedule.gamma = _number_in("gamma", get("gamma"), 0, True, 1, False)
    if multistep:
        milestones = options.get("milestones")
        if milestones is None:
            raise ValueError("schedule 'multistep' needs milestones=[N, ...]")
        if isinstance(milestones, (str, bytes)) or not isinstance(milestones, Sequence):
            raise TypeError(
                "milestones must be a sequence of whole numbers, "
                f"not {type(milestones).__name__}"
            )
        if not milestones:
            raise ValueError("schedule 'multistep' needs at least one milestone")
        last = 1
        for milestone in milestones:
            value = _integer("milestones", milestone, 1, _INT32_MAX)
            if value < last:
                raise ValueError(f"milestones must be ascending, got {list(milestones)!r}")
            last = value
            schedule.milestones.append(value)
    if cosine or restarts:
        schedule.min_learning_rate = _number_in("min_lr", get("min_lr"), 0, False, lr, True)
    if plateau:
        schedule.min_learning_rate = _number_in("min_lr", get("min_lr"), 0, False, math.inf, True)
        if "plateau_factor" in options:
            schedule.factor = _number_in(
                "plateau_factor", options["plateau_factor"], 0, True, 1, True
            )
        if "plateau_patience" in options:
            schedule.patience = _integer(
                "plateau_patience", options["plateau_patience"], 0, _INT32_MAX
            )
        if "plateau_threshold" in options:
            schedule.threshold = _number_in(
                "plateau_threshold", options["plateau_threshold"], 0, False, 1, True
            )
        if "plateau_cooldown" in options:
            schedule.cooldown = _integer(
                "plateau_cooldown", options["plateau_cooldown"], 0, _INT32_MAX
            )
    if restarts:
        if "t_0" not in options:
            raise ValueError("schedule 'cosine_restarts' needs t_0=N")
        schedule.t_0 = _integer("t_0", options["t_0"], 1, _INT32_MAX)
        if "t_mult" in options:
            schedule.t_mult = _integer("t_mult", options["t_mult"], 1, _INT32_MAX)
    if onecycle:
        if "pct_start" in options:
            schedule.pct_start = _number_in("pct_start", options["pct_start"], 0, False, 1, False)
        if "anneal_strategy" in options:
            anneal = options["anneal_strategy"]
            if anneal not in ("cos", "linear"):
                raise ValueError(f"anneal_strategy must be 'cos' or 'linear', got {anneal!r}")
            schedule.anneal_strategy = anneal
        for name in ("div_factor", "final_div_factor"):
            if name in options:
                setattr(schedule, name, _number_in(name, options[name], 0, True, math.inf, True))
        schedule.three_phase = bool(options.get("three_phase", False))
    per_step = bool(options.get("schedule_per_step", False))
    if per_step and plateau:
        raise ValueError(
            "schedule_per_step: schedule 'plateau' steps once per epoch, on the validation loss"
        )
    schedule.per_step = per_step
    warmup_epochs = _integer("warmup_epochs", get("warmup_epochs"), 0, _INT32_MAX)
    warmup_steps = _integer("warmup_steps", options.get("warmup_steps", 0), 0, _INT32_MAX)
    if (warmup_epochs or warmup_steps) and (onecycle or plateau):
        raise ValueError(
            f"schedule {options.get('schedule')!r} takes no warmup_epochs or warmup_steps"
        )
    if warmup_epochs and per_step:
        raise ValueError("warmup_epochs: a per-step schedule warms up by steps (warmup_steps)")
    if warmup_steps and not per_step:
        raise ValueError("warmup_steps needs schedule_per_step=True")
    schedule.warmup_epochs = warmup_epochs
    schedule.warmup_steps = warmup_steps
    spec.clip_grad_norm = _number_in(
        "clip_grad_norm", get("clip_grad_norm"), 0, False, math.inf, True
    )

    spec.batch_size = _integer("batch_size", get("batch_size"), 1, 2**63 - 1)
    epochs = _integer("epochs", get("epochs"), 1, MAX_EPOCHS)
    spec.epochs = epochs

    validation_fraction = _number_in(
        "validation_fraction", get("validation_fraction"), 0, False, 1, True
    )
    if "validation_dataset" in options:
        name = options["validation_dataset"]
        if not isinstance(name, str) or not name:
            raise ValueError("validation_dataset needs a dataset name")
        if validation_fraction > 0:
            raise ValueError("give either validation_fraction or validation_dataset, not both")
        spec.validation_dataset = validate_dataset_reference(name)
    spec.validation_fraction = validation_fraction
    patience = _integer("early_stop_patience", get("early_stop_patience"), 0, _INT32_MAX)
    if patience > 0 and validation_fraction == 0 and not spec.validation_dataset:
        raise ValueError(
            "early_stop_patience watches the validation loss; add validation_fraction=F or "
            "validation_dataset=NAME"
        )
    spec.early_stop_patience = patience
    _applies(options, "early_stop_min_delta", patience > 0, "early stopping (early_stop_patience=N)")
    _applies(options, "early_stop_metric", patience > 0, "early stopping (early_stop_patience=N)")
    spec.early_stop_min_delta = _number_in(
        "early_stop_min_delta", get("early_stop_min_delta"), 0, False, math.inf, True
    )
    metric = _choice("early_stop_metric", get("early_stop_metric"), _EARLY_STOP_METRICS, "metric")
    if metric == jobs_pb2.EARLY_STOP_METRIC_VALIDATION_ACCURACY and spec.loss not in (
        jobs_pb2.LOSS_UNSPECIFIED,
        jobs_pb2.LOSS_CROSS_ENTROPY,
        jobs_pb2.LOSS_NLL,
    ):
        # Without a loss the daemon checks it, once it picked one by the targets.
        raise ValueError("early_stop_metric 'accuracy' needs a class loss ('cross_entropy' or 'nll')")
    spec.early_stop_metric = metric  # type: ignore[assignment]
    model_from = _choice("model_from", get("model_from"), _MODEL_FROM, "choice")
    validates = validation_fraction > 0 or bool(spec.validation_dataset)
    if model_from == jobs_pb2.MODEL_FROM_BEST and not validates:
        raise ValueError(
            "model_from='best' hands back the best validation epoch's weights; add "
            "validation_fraction=F or validation_dataset=NAME"
        )
    spec.model_from = model_from  # type: ignore[assignment]
    accumulation = _integer(
        "gradient_accumulation_steps", get("gradient_accumulation_steps"), 1, _INT32_MAX
    )
    if accumulation > 1:
        spec.gradient_accumulation_steps = accumulation
    drop_last = get("drop_last")
    if not isinstance(drop_last, bool):
        raise TypeError("drop_last must be a bool")
    spec.drop_last = drop_last
    checkpoint_every = _integer("checkpoint_every", get("checkpoint_every"), 0, epochs)
    check_epochs_and_checkpoints(epochs, checkpoint_every)
    spec.checkpoint_every = checkpoint_every

    spec.precision = _choice(  # type: ignore[assignment]
        "precision", get("precision"), _PRECISIONS, "precision"
    )
    spec.priority = _choice(  # type: ignore[assignment]
        "priority", get("priority"), _PRIORITIES, "priority"
    )
    spec.engine = _choice("engine", get("engine"), _ENGINES, "engine")  # type: ignore[assignment]
    shuffle = get("shuffle")
    if not isinstance(shuffle, bool):
        raise TypeError("shuffle must be a bool")
    spec.shuffle = shuffle
    if "replicas" in options:
        # The daemon bounds it (--max_replicas); 1 is a one-rank job, sent as unset.
        replicas = _integer("replicas", options["replicas"], 1, _INT32_MAX)
        if replicas > 1:
            spec.replicas = replicas
    if "nodes" in options:
        nodes = options["nodes"]
        if nodes in ("all", "*"):
            # Every peer the daemon knows (its --peers, or its cluster manager's group).
            nodes = ["*"]
        if isinstance(nodes, str) or not all(isinstance(n, str) and n for n in nodes):
            raise TypeError("nodes must be a list of peers' 'host:port' names, or 'all'")
        if spec.replicas < 2 and not sweep:
            raise ValueError("nodes places ranks on other daemons: give replicas (at least 2) too")
        spec.nodes.extend(nodes)
    if "max_job_time" in options:
        spec.max_job_seconds = _seconds("max_job_time", options["max_job_time"])
    if "seed" in options:
        spec.seed = _integer("seed", options["seed"], 0, _UINT64_MAX)
    if "device" in options:
        device = options["device"]
        if not isinstance(device, str) or not device:
            raise ValueError("device needs a device, e.g. 'cpu', 'cuda', 'cuda:0' or 'auto'")
        spec.device = device
    return spec


def model_argument(
    model: object, feature_shape: Callable[[], Sequence[int]] | None = None
) -> tuple[str, bytes]:
    """(spec text, module bytes) for ``model=``: a spec string ("linear:64,relu,linear:1") with
    no module; "exported" and the archive torch.export.save writes, of a torch.nn.Module
    (exported in training mode with an example batch of ``feature_shape()``, the dataset's rows,
    its batch dimension dynamic), of a .pt2 file (a path) or given as bytes; or "torchscript" and
    the archive of a ScriptModule, of a TorchScript file or given as bytes. Which archive bytes
    and files hold, their content says."""
    if isinstance(model, bytes):
        return _archive_kind(model), _check_module_bytes(model, "model")
    if isinstance(model, os.PathLike) or (
        isinstance(model, str)
        and (
            os.sep in model
            or model.endswith((".pt", ".pth", ".pt2", ".zip", ".ts", ".torchscript"))
            or os.path.isfile(model)
        )
    ):
        path = Path(os.fspath(model))
        try:
            data = path.read_bytes()
        except OSError as e:
            raise FileNotFoundError(f"model: cannot read '{path}': {e.strerror or e}") from e
        return _archive_kind(data), _check_module_bytes(data, f"model '{path}'")
    if isinstance(model, str):
        text = model.strip()
        if not text or text == "torchscript":
            raise ValueError(
                "model needs a spec, e.g. 'linear:64,relu,linear:1', a torch.nn.Module or a "
                "TorchScript file"
            )
        if len(text.encode()) > MAX_MODEL_SPEC_BYTES:
            raise ValueError(f"model: the spec is longer than {MAX_MODEL_SPEC_BYTES} bytes")
        return text, b""
    if _is_torch_module(model):
        torch = import_torch()
        if isinstance(model, torch.jit.ScriptModule):
            return "torchscript", _script_module(model)
        if feature_shape is None:
            raise TypeError("a torch.nn.Module trains as a job of its own: pass it to submit()")
        return "exported", _export_module(model, tuple(feature_shape()))
    raise TypeError(
        "model must be a spec string, a torch.nn.Module, a path to a TorchScript file or its "
        f"bytes, not {type(model).__name__}"
    )


def _is_torch_module(value: object) -> bool:
    for cls in type(value).__mro__:
        if cls.__module__.startswith("torch") and cls.__name__ in ("Module", "ScriptModule"):
            return True
    return False


def _script_module(module: Any) -> bytes:
    torch = import_torch()

    buffer = io.BytesIO()
    try:
        # torch.jit.script compiles some methods lazily: save is where those fail.
        scripted = module if isinstance(module, torch.jit.ScriptModule) else torch.jit.script(module)
        torch.jit.save(scripted, buffer)
    except Exception as e:  # torch raises many kinds: NotSupportedError, RuntimeError, ...
        first = next((line for line in str(e).strip().split("\n") if line.strip()), str(e))
        raise TypeError(
            f"cannot script the model ({type(module).__name__}) with torch.jit.script: "
            f"{first.strip()}. Make its forward scriptable, or pass torch.jit.trace(model, "
            "example) or a TorchScript file instead"
        ) from e
    return _check_module_bytes(buffer.getvalue(), "model")


def needs_feature_shape(model: object) -> bool:
    """Whether ``model=`` is a torch.nn.Module that submit exports (not a ScriptModule)."""
    if not _is_torch_module(model):
        return False
    return not isinstance(model, import_torch().jit.ScriptModule)


def is_exported_program(data: bytes) -> bool:
    """Whether ``data`` is an archive torch.export.save wrote: a zip holding
    ``<name>/models/model.json``."""
    if not data.startswith(b"PK"):
        return False
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return any(n.endswith("/models/model.json") for n in archive.namelist())
    except (zipfile.BadZipFile, ValueError, OSError):
        return False


def _archive_kind(data: bytes) -> str:
    return "exported" if is_exported_program(data) else "torchscript"


def _export_module(module: Any, feature_shape: tuple[int, ...]) -> bytes:
    """torch.export of ``module`` in training mode (so that trainerd can switch dropout and batch
    norm between training and evaluation), on an example batch of 2 rows of ``feature_shape``
    (zeros, on the module's device), the batch dimension dynamic; the bytes torch.export.save
    writes. The module's own training flag is restored."""
    torch = import_torch()
    parameter = next(iter(module.parameters()), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    example = torch.zeros((2, *feature_shape), dtype=torch.float32, device=device)
    was_training = module.training
    buffer = io.BytesIO()
    try:
        module.train()
        with warnings.catch_warnings():
            # nn.LSTM/GRU/RNN keep their weights in a Python list too; export warns about that
            # list, which is torch's own code and the user can do nothing about.
            warnings.filterwarnings("ignore", message=r"The tensor attributes .*_flat_weights")
            program = torch.export.export(
                module, (example,), dynamic_shapes=({0: torch.export.Dim("batch", min=1)},)
            )
        torch.export.save(program, buffer)
    except Exception as e:  # torch raises many kinds: UserError, TorchRuntimeError, ...
        first = next((line for line in str(e).strip().split("\n") if line.strip()), str(e))
        raise TypeError(
            f"cannot export the model ({type(module).__name__}) with torch.export for rows "
            f"shaped {list(feature_shape)}: {first.strip()}. Make its forward exportable "
            "(https://pytorch.org/docs/stable/export.html), or pass a .pt2 file instead"
        ) from e
    finally:
        module.train(was_training)
    return _check_module_bytes(buffer.getvalue(), "model")


def _check_module_bytes(data: bytes, what: str) -> bytes:
    if not data:
        raise ValueError(f"{what} is empty")
    if len(data) > MAX_TORCHSCRIPT_BYTES:
        raise ValueError(
            f"{what} has {len(data)} bytes; modules of at most {MAX_TORCHSCRIPT_BYTES} bytes can "
            "be sent (the daemon's message limit)"
        )
    return data


def sweep_values(name: str, values: object, *, whole: bool = False) -> list[Any]:
    """A swept option's values: one value or a non-empty sequence of at most 256."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        items: list[Any] = [values]
    else:
        items = list(values)
    if not items:
        raise ValueError(f"{name}: give at least one value")
    if len(items) > MAX_SWEEP_VALUES:
        raise ValueError(
            f"{name} has {len(items)} values; a sweep takes at most {MAX_SWEEP_VALUES} per list"
        )
    for item in items:
        if whole:
            _integer(name, item, 0, _UINT64_MAX)
        else:
            _number(name, item)
    return items
