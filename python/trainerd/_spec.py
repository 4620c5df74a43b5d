"""The JobSpec of ``Client.submit`` and ``Client.sweep``, built from keyword arguments named after
trainctl's submit flags (client/submit_flags.cc; ``--batch-size`` is ``batch_size``).

The daemon owns the defaults and the checks. An option the caller did not give is left unset in
the message (jobs.proto says what unset means: the loss picked by the dataset's targets, a
constant schedule, fp32, normal priority, the automatic engine, shuffling, ...), and the spec the
daemon accepted, with its defaults filled in, comes back as ``job.spec``. Whether a value is in
range, whether an option applies to the optimizer, loss or schedule chosen, and how options go
together (validation for early stopping or a plateau schedule, checkpoints against epochs, ...)
is the daemon's to say: it refuses the spec with INVALID_ARGUMENT and a sentence naming the
option (:class:`~trainerd.InvalidArgument`, a ``ValueError``).

What the client still checks, before anything is sent, is what it needs to write the message:

* option names: an unknown keyword (a typo) has no field to go to (TypeError);
* types and choices: a value that is not a number, a whole number, a bool or a str where the
  field takes one, a whole number outside the field's integer type (seed is unsigned), a name
  that is not one of the enum's (``optimizer="lbfgs"``) cannot be written (TypeError,
  ValueError);
* values the message would read as unset: a 0 where jobs.proto makes 0 mean the daemon's
  default (``huber_delta``, ``gamma``, ``gradient_accumulation_steps``, ``replicas``,
  ``max_job_time``) and an empty ``device``, ``validation_dataset``, ``anneal_strategy``,
  ``class_weights`` or ``pos_weight`` would silently become that default, not what was asked
  (ValueError).

Every option the caller does not give is left unset: the daemon fills in its defaults (SGD,
learning rate 0.01, batch size 32, 10 epochs, the loss from the targets, ...), the same for every
client, and the job's spec says what it got.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict

from trainerd.v1 import jobs_pb2

__all__ = [
    "EARLY_STOP_METRICS",
    "ENGINES",
    "LOSSES",
    "OPTIMIZERS",
    "OPTION_NAMES",
    "PRECISIONS",
    "PRIORITIES",
    "SCHEDULES",
    "SpecOptions",
    "SweepOptions",
    "build_spec",
    "convert_option",
    "given_options",
]

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
    validation_split_seed: int
    validation_dataset: str
    halving_min_epochs: int
    halving_reduction_factor: int
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

LOSSES = {
    "mse": jobs_pb2.LOSS_MSE,
    "cross_entropy": jobs_pb2.LOSS_CROSS_ENTROPY,
    "cross-entropy": jobs_pb2.LOSS_CROSS_ENTROPY,
    "l1": jobs_pb2.LOSS_L1,
    "huber": jobs_pb2.LOSS_HUBER,
    "bce_with_logits": jobs_pb2.LOSS_BCE_WITH_LOGITS,
    "bce-with-logits": jobs_pb2.LOSS_BCE_WITH_LOGITS,
    "nll": jobs_pb2.LOSS_NLL,
}
OPTIMIZERS = {
    "sgd": jobs_pb2.OPTIMIZER_KIND_SGD,
    "adam": jobs_pb2.OPTIMIZER_KIND_ADAM,
    "adamw": jobs_pb2.OPTIMIZER_KIND_ADAMW,
    "rmsprop": jobs_pb2.OPTIMIZER_KIND_RMSPROP,
    "nadam": jobs_pb2.OPTIMIZER_KIND_NADAM,
    "radam": jobs_pb2.OPTIMIZER_KIND_RADAM,
    "adagrad": jobs_pb2.OPTIMIZER_KIND_ADAGRAD,
}
SCHEDULES = {
    "constant": jobs_pb2.Schedule.CONSTANT,
    "step": jobs_pb2.Schedule.STEP,
    "cosine": jobs_pb2.Schedule.COSINE,
    "cosine_restarts": jobs_pb2.Schedule.COSINE_WARM_RESTARTS,
    "multistep": jobs_pb2.Schedule.MULTI_STEP,
    "exponential": jobs_pb2.Schedule.EXPONENTIAL,
    "onecycle": jobs_pb2.Schedule.ONE_CYCLE,
    "plateau": jobs_pb2.Schedule.REDUCE_ON_PLATEAU,
}
PRECISIONS = {
    "fp32": jobs_pb2.PRECISION_FP32,
    "bf16": jobs_pb2.PRECISION_BF16,
    "fp16": jobs_pb2.PRECISION_FP16,
}
PRIORITIES = {
    "high": jobs_pb2.JOB_PRIORITY_HIGH,
    "normal": jobs_pb2.JOB_PRIORITY_NORMAL,
    "low": jobs_pb2.JOB_PRIORITY_LOW,
}
EARLY_STOP_METRICS = {
    "loss": jobs_pb2.EARLY_STOP_METRIC_VALIDATION_LOSS,
    "accuracy": jobs_pb2.EARLY_STOP_METRIC_VALIDATION_ACCURACY,
}
MODEL_FROM = {
    "auto": jobs_pb2.MODEL_FROM_UNSPECIFIED,
    "best": jobs_pb2.MODEL_FROM_BEST,
    "last": jobs_pb2.MODEL_FROM_LAST,
}
ENGINES = {
    "auto": jobs_pb2.ENGINE_AUTO,
    "fused": jobs_pb2.ENGINE_FUSED,
    "libtorch": jobs_pb2.ENGINE_LIBTORCH,
}

# --- Converters: a Python value to what its field holds -------------------------------------------

_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_UINT64 = (0, 2**64 - 1)

Converter = Callable[[str, Any], Any]


def _choice(table: Mapping[str, int], what: str) -> Converter:
    def convert(name: str, value: object) -> int:
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str, not {type(value).__name__}")
        found = table.get(value)
        if found is None:
            names = [k for k in table if "-" not in k]
            expected = ", ".join(names[:-1]) + " or " + names[-1]
            raise ValueError(f"{name}: unknown {what} {value!r} (expected {expected})")
        return found

    return convert


def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    return float(value)


def _whole(bounds: tuple[int, int]) -> Converter:
    """A whole number the field's integer type holds (numpy integers too)."""

    def convert(name: str, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            if hasattr(value, "__index__") and not isinstance(value, bool):
                value = int(value.__index__())
            else:
                raise TypeError(f"{name} must be a whole number, not {type(value).__name__}")
        assert isinstance(value, int)
        if value < bounds[0]:
            raise ValueError(f"{name} must be at least {bounds[0]}, got {value}")
        if value > bounds[1]:
            raise ValueError(f"{name} must be at most {bounds[1]}, got {value}")
        return value

    return convert


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool")
    return value


def _text(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    return value


def _not_unset(convert: Converter, becomes: str) -> Converter:
    """``convert``, refusing a value the field would carry as unset (a 0, or empty), which the
    daemon reads as ``becomes`` rather than what was asked."""

    def checked(name: str, value: object) -> Any:
        result = convert(name, value)
        if not result:
            raise ValueError(
                f"{name}={value!r} cannot be sent: the request carries it as unset, which the "
                f"daemon reads as {becomes}"
            )
        return result

    return checked


def _seconds(name: str, value: object) -> float:
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    return _real(name, value)


def _weights(name: str, value: object) -> list[float]:
    """A loss's weight list (class_weights, pos_weight): a sequence of numbers, or a 1-d tensor
    or array of them."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()  # a torch.Tensor or a numpy array
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a sequence of numbers, one per {_PER[name]}")
    return [_real(f"{name}[{i}]", item) for i, item in enumerate(value)]


_PER = {"class_weights": "class", "pos_weight": "output column"}


def _milestones(name: str, value: object) -> list[int]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a sequence of whole numbers, not {type(value).__name__}")
    return [_whole(_INT32)(name, item) for item in value]


def _nodes(name: str, value: object) -> list[str]:
    if value in ("all", "*"):
        # Every peer the daemon knows (its --peers, or its cluster manager's group).
        return ["*"]
    if isinstance(value, str) or not isinstance(value, Sequence) or not all(
        isinstance(n, str) for n in value
    ):
        raise TypeError(f"{name} must be a list of peers' 'host:port' names, or 'all'")
    return list(value)


# Each option: the JobSpec field it sets (a path through the message) and how its value is
# converted. A list value extends a repeated field.
_FIELDS: dict[str, tuple[str, Converter]] = {
    "loss": ("loss", _choice(LOSSES, "loss")),
    "huber_delta": ("huber_delta", _not_unset(_real, "its default, 1")),
    "label_smoothing": ("label_smoothing", _real),
    "class_weights": ("class_weights", _not_unset(_weights, "every class weighing 1")),
    "ignore_index": ("ignore_index", _whole(_INT64)),
    "pos_weight": ("pos_weight", _not_unset(_weights, "every output column weighing 1")),
    "optimizer": ("optimizer.kind", _choice(OPTIMIZERS, "optimizer")),
    "lr": ("optimizer.learning_rate", _not_unset(_real, "its default, 0.01")),
    "momentum": ("optimizer.momentum", _real),
    "nesterov": ("optimizer.nesterov", _flag),
    "weight_decay": ("optimizer.weight_decay", _real),
    "beta1": ("optimizer.beta1", _real),
    "beta2": ("optimizer.beta2", _real),
    "eps": ("optimizer.eps", _real),
    "alpha": ("optimizer.alpha", _real),
    "amsgrad": ("optimizer.amsgrad", _flag),
    "centered": ("optimizer.centered", _flag),
    "momentum_decay": ("optimizer.momentum_decay", _real),
    "decoupled_weight_decay": ("optimizer.decoupled_weight_decay", _flag),
    "lr_decay": ("optimizer.lr_decay", _real),
    "initial_accumulator_value": ("optimizer.initial_accumulator_value", _real),
    "weight_decay_exclude_bias_and_norm": ("optimizer.weight_decay_exclude_bias_and_norm", _flag),
    "schedule": ("schedule.kind", _choice(SCHEDULES, "schedule")),
    "step_epochs": ("schedule.step_epochs", _whole(_INT32)),
    "gamma": ("schedule.gamma", _not_unset(_real, "its default, 0.1")),
    "min_lr": ("schedule.min_learning_rate", _real),
    "warmup_epochs": ("schedule.warmup_epochs", _whole(_INT32)),
    "schedule_per_step": ("schedule.per_step", _flag),
    "warmup_steps": ("schedule.warmup_steps", _whole(_INT32)),
    "milestones": ("schedule.milestones", _milestones),
    "t_0": ("schedule.t_0", _whole(_INT32)),
    "t_mult": ("schedule.t_mult", _whole(_INT32)),
    "pct_start": ("schedule.pct_start", _real),
    "anneal_strategy": ("schedule.anneal_strategy", _not_unset(_text, "its default, 'cos'")),
    "div_factor": ("schedule.div_factor", _real),
    "final_div_factor": ("schedule.final_div_factor", _real),
    "three_phase": ("schedule.three_phase", _flag),
    "plateau_factor": ("schedule.factor", _real),
    "plateau_patience": ("schedule.patience", _whole(_INT32)),
    "plateau_threshold": ("schedule.threshold", _real),
    "plateau_cooldown": ("schedule.cooldown", _whole(_INT32)),
    "clip_grad_norm": ("clip_grad_norm", _real),
    "batch_size": ("batch_size", _not_unset(_whole(_INT64), "its default, 32")),
    "epochs": ("epochs", _not_unset(_whole(_INT32), "its default, 10")),
    "validation_fraction": ("validation_fraction", _real),
    "validation_dataset": ("validation_dataset", _not_unset(_text, "no validation dataset")),
    "early_stop_patience": ("early_stop_patience", _whole(_INT32)),
    "early_stop_min_delta": ("early_stop_min_delta", _real),
    "early_stop_metric": ("early_stop_metric", _choice(EARLY_STOP_METRICS, "metric")),
    "model_from": ("model_from", _choice(MODEL_FROM, "choice")),
    "gradient_accumulation_steps": (
        "gradient_accumulation_steps",
        _not_unset(_whole(_INT32), "1 (a step per batch)"),
    ),
    "drop_last": ("drop_last", _flag),
    "checkpoint_every": ("checkpoint_every", _whole(_INT32)),
    "precision": ("precision", _choice(PRECISIONS, "precision")),
    "device": ("device", _not_unset(_text, "its default device")),
    "priority": ("priority", _choice(PRIORITIES, "priority")),
    "engine": ("engine", _choice(ENGINES, "engine")),
    "max_job_time": ("max_job_seconds", _not_unset(_seconds, "its limit, --max_job_time")),
    "shuffle": ("shuffle", _flag),
    "replicas": ("replicas", _not_unset(_whole(_INT32), "one rank")),
    "nodes": ("nodes", _nodes),
    "seed": ("seed", _whole(_UINT64)),
    "validation_split_seed": ("validation_split_seed", _whole(_UINT64)),
    "halving_min_epochs": ("halving.min_epochs", _whole(_INT32)),
    "halving_reduction_factor": ("halving.reduction_factor", _whole(_INT32)),
}
assert set(_FIELDS) == OPTION_NAMES


def convert_option(name: str, value: object) -> Any:
    """Option ``name``'s value as its field holds it; TypeError or ValueError when it cannot be
    written there (see the module's docstring)."""
    return _FIELDS[name][1](name, value)


def given_options(options: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The options of ``options`` the caller gave: not None, and not at the signature's default
    (``defaults``), which is the daemon's default too."""
    return {
        name: value
        for name, value in options.items()
        if value is not None
        and not (
            name in defaults
            and type(value) is type(defaults[name])
            and value == defaults[name]
        )
    }


def build_spec(dataset: str, model: str, options: Mapping[str, Any]) -> jobs_pb2.JobSpec:
    """The JobSpec for ``dataset`` and ``model`` (a spec string, or "torchscript" or "exported"
    when a module travels beside it) with the options given (None: not given); the others are
    left unset for the daemon's defaults."""
    unknown = sorted(set(options) - OPTION_NAMES)
    if unknown:
        raise TypeError(f"unknown job option {unknown[0]!r}")
    if not isinstance(dataset, str):
        raise TypeError(f"a dataset name is a str, not {type(dataset).__name__}")
    spec = jobs_pb2.JobSpec(dataset=dataset, model=model)
    for name, value in options.items():
        if value is not None:
            set_option(spec, name, value)
    return spec


def option_path(name: str) -> str:
    """Option ``name``'s field in JobSpec ("optimizer.learning_rate" for ``lr``)."""
    return _FIELDS[name][0]


def set_option(spec: jobs_pb2.JobSpec, name: str, value: object) -> str:
    """Writes option ``name``'s value into ``spec`` (converted as :func:`convert_option` does) and
    returns the field's path in JobSpec ("optimizer.beta1"), as a sweep point's ``fields`` names
    it."""
    path, convert = _FIELDS[name]
    *parents, field = path.split(".")
    message: Any = spec
    for parent in parents:
        message = getattr(message, parent)
    converted = convert(name, value)
    if isinstance(converted, list):
        getattr(message, field).extend(converted)
    else:
        setattr(message, field, converted)
    return path
