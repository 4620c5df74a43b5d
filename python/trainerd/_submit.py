"""SubmitJob and SubmitSweep: their requests, built from the arguments of ``submit`` and
``sweep`` (the model, the spec's options, a sweep's lists or points), and the operations that send
them.

The spec is :func:`trainerd._spec.build_spec`'s, and what it leaves to the daemon, this leaves to
it too: the daemon checks every member of a sweep as SubmitJob checks a job (INVALID_ARGUMENT
naming the first member that fails and its values), and bounds the sweep (256 members, 256 values
a list, 256 points). What stays here is what the request cannot express: a module in a sweep
(SubmitSweepRequest carries no module), an option given both as a swept argument and among the
options, an empty list or points (which the request reads as "no sweep over it"), a list where
points give the members, a point's key that is no swept option, and values that cannot be
converted (as the spec's).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trainerd._calls import dataset as get_dataset
from trainerd._connection import Connection
from trainerd._model_input import model_argument, needs_feature_shape
from trainerd._rpc import SUBMIT_JOB, SUBMIT_SWEEP, Blocking, Op, Unary
from trainerd._spec import OPTION_NAMES, build_spec, convert_option, option_path, set_option
from trainerd.datasets import DatasetBase, DatasetRef, dataset_name
from trainerd.v1 import jobs_pb2

__all__ = ["submit", "submit_request", "sweep", "sweep_request"]

#: What a sweep sweeps over: its arguments, and their fields in SubmitSweepRequest's lists and in
#: a SweepPoint.
_SWEPT = {
    "lr": ("learning_rates", "learning_rate"),
    "momentum": ("momenta", "momentum"),
    "weight_decay": ("weight_decays", "weight_decay"),
    "seed": ("seeds", "seed"),
}


def submit_request(
    dataset: str,
    model: object,
    options: Mapping[str, Any],
    feature_shape: Callable[[], Sequence[int]] | None = None,
) -> jobs_pb2.SubmitJobRequest:
    """``feature_shape``: the dataset's rows, asked only to export a torch.nn.Module."""
    spec_model, module = model_argument(model, feature_shape)
    request = jobs_pb2.SubmitJobRequest(spec=build_spec(dataset, spec_model, options))
    if spec_model == "exported":
        request.exported_program = module
    else:
        request.torchscript_module = module  # b"" (none) for a spec string
    return request


def submit(
    connection: Connection,
    dataset: DatasetRef,
    model: object,
    options: Mapping[str, Any],
    request_id: str | None,
) -> Op[jobs_pb2.Job]:
    """SubmitJob: the job, QUEUED. A module sent warns once when this torch's version is not the
    daemon's LibTorch's."""
    name = dataset_name(dataset)
    shape: Sequence[int] = ()
    if needs_feature_shape(model):  # a torch.nn.Module to export: the dataset's rows
        if isinstance(dataset, DatasetBase):
            shape = dataset.feature_shape
        else:
            shape = tuple((yield from get_dataset(connection, name)).feature_shape)
    request: jobs_pb2.SubmitJobRequest = yield Blocking(
        lambda: submit_request(name, model, options, lambda: shape)
    )
    if request_id is not None:
        request.request_id = request_id
    job = yield from connection.call(Unary(SUBMIT_JOB, request))
    if request.torchscript_module or request.exported_program:
        yield from connection.check_torch()
    return job


def _values(name: str, values: object) -> list[Any]:
    """A swept argument's values: one value or a non-empty sequence, each converted as its
    field takes it."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        items: list[Any] = [values]
    else:
        items = list(values)
    if not items:
        raise ValueError(f"{name}: give at least one value")
    return [convert_option(name, item) for item in items]


def sweep_request(
    dataset: DatasetRef,
    model: object,
    lr: Any,
    momentum: Any,
    weight_decay: Any,
    seed: Any,
    options: Mapping[str, Any],
    points: Any = None,
    request_id: str | None = None,
    search: Mapping[str, Any] | None = None,
    trials: int | None = None,
    search_seed: int | None = None,
) -> jobs_pb2.SubmitSweepRequest:
    """SubmitSweep's request: the product of the swept lists, or ``points``' members one by one
    (each key a point leaves out takes the single value given to that argument)."""
    if not isinstance(model, str):
        raise TypeError(
            "a sweep trains a model spec (a str such as 'linear:64,relu,linear:1'); "
            "TorchScript modules go to submit() one job at a time"
        )
    for name in _SWEPT:
        if name in options:
            raise TypeError(f"{name} is given twice")
    spec_model, module = model_argument(model)
    if module:
        raise TypeError("a sweep trains a model spec; a TorchScript file goes to submit()")
    given = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay, "seed": seed}
    members: list[dict[str, Any]] = []
    swept: dict[str, list[Any]] = {}
    if points is not None:
        spec_options, members = _points(given, options, points)
    else:
        swept = {k: _values(k, v) for k, v in given.items() if v is not None}
        # The spec takes each list's first value (members without a list take the spec's).
        spec_options = dict(options, **{k: v[0] for k, v in swept.items()})
    request = jobs_pb2.SubmitSweepRequest(
        spec=build_spec(dataset_name(dataset), spec_model, spec_options)
    )
    searching = search is not None or trials is not None
    for name, values in swept.items():
        # A search's single values (lr's default among them) are the spec's, not lists.
        if not (searching and len(values) == 1):
            getattr(request, _SWEPT[name][0]).extend(values)
    for member in members:
        point = request.points.add()
        for key, value in member.items():
            if key in _SWEPT:
                setattr(point, _SWEPT[key][1], value)
            elif key == "model":
                point.spec.model = value
                point.fields.paths.append("model")
            else:
                point.fields.paths.append(set_option(point.spec, key, value))
    if searching:
        if points is not None or any(len(v) > 1 for v in swept.values()):
            raise ValueError("a sweep takes lists, points or a search, one of them")
        _search(request, search, trials, search_seed)
    if request_id is not None:
        request.request_id = request_id
    return request


def _search(
    request: jobs_pb2.SubmitSweepRequest,
    search: Mapping[str, Any] | None,
    trials: int | None,
    seed: int | None,
) -> None:
    """SubmitSweepRequest.search from ``search``'s distributions (trainerd.search) by option name,
    ``trials`` and ``seed``."""
    from trainerd.search import Choice, Integer, LogUniform, Uniform

    if not search or trials is None:
        raise ValueError("a search needs its distributions (search={...}) and trials=N")
    space = request.search
    for what, number in (("trials", trials), ("search_seed", seed)):
        if number is not None and (not isinstance(number, int) or isinstance(number, bool)):
            raise TypeError(f"{what} must be a whole number, not {type(number).__name__}")
    if not 1 <= trials <= 256:
        raise ValueError(f"trials must be 1 to 256, got {trials}")
    space.trials = trials
    if seed is not None:
        if not 0 <= seed < 2**64:
            raise ValueError(f"search_seed must be in [0, 2**64), got {seed}")
        space.seed = seed
    for name, distribution in search.items():
        if name != "model" and name not in OPTION_NAMES:
            raise ValueError(f"search: {name!r} is no option of submit()")
        path = "model" if name == "model" else option_path(name)
        parameter = space.parameters.add(field=path)
        if isinstance(distribution, (Uniform, LogUniform)):
            target = parameter.uniform if isinstance(distribution, Uniform) else parameter.log_uniform
            target.low, target.high = float(distribution.low), float(distribution.high)
        elif isinstance(distribution, Integer):
            parameter.integer.low, parameter.integer.high = distribution.low, distribution.high
            parameter.integer.log = distribution.log
        elif isinstance(distribution, Choice):
            parameter.choice.values.extend(_choice_text(name, path, v) for v in distribution.values)
        else:
            raise TypeError(
                f"search: {name!r} takes a trainerd.search distribution (Uniform, LogUniform, "
                f"Integer, Choice), not {type(distribution).__name__}"
            )


def _choice_text(name: str, path: str, value: object) -> str:
    """A choice as the daemon reads it: the option's converted value as text (an enum's name)."""
    if name == "model":
        if not isinstance(value, str):
            raise TypeError("a model choice is a spec string such as 'linear:64,relu,linear:1'")
        return value
    converted = convert_option(name, value)
    field = _field_of(path)
    if field.enum_type is not None:
        return str(field.enum_type.values_by_number[converted].name)
    if isinstance(converted, bool):
        return "true" if converted else "false"
    return repr(converted) if isinstance(converted, float) else str(converted)


def _field_of(path: str) -> Any:
    descriptor: Any = jobs_pb2.JobSpec.DESCRIPTOR
    *parents, leaf = path.split(".")
    for parent in parents:
        descriptor = descriptor.fields_by_name[parent].message_type
    return descriptor.fields_by_name[leaf]


def _point_value(key: str, value: object) -> Any:
    """A point's value: a swept option's converted (it goes into the point's own field), any
    other's checked here and written into the point's spec by :func:`sweep_request`."""
    if key == "model":
        if not isinstance(value, str):
            raise TypeError("a point's model is a spec string such as 'linear:64,relu,linear:1'")
        return value
    if key in _SWEPT:
        return convert_option(key, value)
    convert_option(key, value)  # raises what build_spec would
    return value


def _points(
    given: dict[str, Any], options: Mapping[str, Any], points: Any
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A sweep given point by point (as ``trainctl sweep --points``): the options of its spec,
    and each member's values."""
    if isinstance(points, (str, bytes, Mapping)) or not hasattr(points, "__iter__"):
        raise TypeError("points must be a sequence of mappings such as {'lr': 0.1, 'seed': 1}")
    rows = list(points)
    if not rows:
        raise ValueError("points: give at least one member")
    base: dict[str, Any] = dict(options)
    for key, value in given.items():
        if value is None:
            continue
        if isinstance(value, (list, tuple, range)) or hasattr(value, "__len__"):
            raise ValueError(
                f"points gives each member's values: {key} takes one value with it (the "
                "members' default), not a list"
            )
        base[key] = value
    members: list[dict[str, Any]] = []
    for number, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise TypeError(f"points[{number}] must be a mapping, got {type(row).__name__}")
        unknown = sorted(
            str(k) for k in row if k not in _SWEPT and k != "model" and k not in OPTION_NAMES
        )
        if unknown:
            raise ValueError(
                f"points[{number}]: a point sets the model and submit()'s options, not "
                + ", ".join(unknown)
            )
        try:
            members.append({key: _point_value(key, value) for key, value in row.items()})
        except (TypeError, ValueError) as error:
            raise type(error)(f"points[{number}]: {error}") from None
    # The spec: the options, with the first point's value for each swept key every point sets (no
    # member takes the option's value then, and it may not suit the others: min_lr above the
    # default rate when every point gives a rate above it).
    everyone = {
        k: v for k, v in rows[0].items() if k in _SWEPT and all(k in row for row in rows)
    }
    return dict(base, **everyone), members


def sweep(
    connection: Connection, request: jobs_pb2.SubmitSweepRequest
) -> Op[jobs_pb2.SubmitSweepResponse]:
    """SubmitSweep (its request from :func:`sweep_request`): the sweep's id and its members,
    QUEUED."""
    return (yield from connection.call(Unary(SUBMIT_SWEEP, request)))
