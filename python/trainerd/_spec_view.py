"""A job's spec as users read it: every field of trainerd.v1.JobSpec as the message has it, except
the choices, which read as the names ``Client.submit`` takes (``spec.loss == "cross_entropy"``,
``spec.optimizer.kind == "adam"``, ``spec.schedule.kind == "cosine_restarts"``) rather than the
enum's numbers. The message itself stays at ``spec.proto`` (and ``job.proto.spec``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf.message import Message

from trainerd._spec import (
    EARLY_STOP_METRICS,
    ENGINES,
    LOSSES,
    OPTIMIZERS,
    PRECISIONS,
    PRIORITIES,
    SCHEDULES,
)
from trainerd.v1 import jobs_pb2

__all__ = ["JobSpecView"]


def _names(table: Mapping[str, int], unspecified: str | None) -> dict[int, str | None]:
    """The enum's numbers to submit's names (the spelling with '_', not the '-' alias); 0 (the
    enum's UNSPECIFIED) to what the daemon takes it as."""
    names: dict[int, str | None] = {0: unspecified}
    for name, number in table.items():
        if "-" not in name:
            names[int(number)] = name
    return names


# What UNSPECIFIED means for each (jobs.proto): the loss has none until the daemon picks it from
# the dataset's targets (a spec it accepted always has one).
_JOB_CHOICES: dict[str, dict[int, str | None]] = {
    "loss": _names(LOSSES, None),
    "precision": _names(PRECISIONS, "fp32"),
    "priority": _names(PRIORITIES, "normal"),
    "engine": _names(ENGINES, "auto"),
    "early_stop_metric": _names(EARLY_STOP_METRICS, "loss"),
}
_OPTIMIZER_KINDS = _names(OPTIMIZERS, "sgd")
_SCHEDULE_KINDS = _names(SCHEDULES, "constant")


def _name_of(names: dict[int, str | None], number: int) -> str | None:
    # A number this client does not know (a newer daemon's choice): the number, as text.
    return names.get(int(number), str(int(number)))


class _View:
    """A message whose fields read through, with ``_choices`` read as names."""

    _choices: dict[str, dict[int, str | None]] = {}

    def __init__(self, proto: Message) -> None:
        object.__setattr__(self, "_proto", proto)

    @property
    def proto(self) -> Any:
        """The message itself, enum numbers included."""
        return self._proto

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        value = getattr(self._proto, name)
        names = self._choices.get(name)
        if names is not None:
            return _name_of(names, value)
        return value

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a job's spec is read-only ({name!r})")

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | {f.name for f in self._proto.DESCRIPTOR.fields})

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _View):
            return bool(self._proto == other._proto)
        return bool(self._proto == other)

    def __hash__(self) -> int:
        return hash(self._proto.SerializeToString(deterministic=True))

    def __repr__(self) -> str:
        fields = []
        for field, value in self._proto.ListFields():
            shown = getattr(self, field.name)
            if isinstance(shown, _View):
                shown = repr(shown)
            elif hasattr(value, "extend"):  # a repeated field
                shown = list(value)
            else:
                shown = repr(shown)
            fields.append(f"{field.name}={shown}")
        return f"{type(self).__name__}({', '.join(fields)})"


class OptimizerView(_View):
    """JobSpec.optimizer: ``kind`` is "sgd", "adam", ...; the other fields as the message."""

    _choices = {"kind": _OPTIMIZER_KINDS}


class ScheduleView(_View):
    """JobSpec.schedule: ``kind`` is "constant", "step", "cosine", ...; the rest as the message."""

    _choices = {"kind": _SCHEDULE_KINDS}


class JobSpecView(_View):
    """The spec a job was accepted with. ``loss``, ``precision``, ``priority``, ``engine`` and
    ``early_stop_metric`` read as submit's names ("cross_entropy", "bf16", "high", "fused",
    "accuracy"); ``optimizer`` and ``schedule`` are views whose ``kind`` is a name too. Every
    other field reads as the message's (``spec.optimizer.learning_rate``, ``spec.seed``,
    ``spec.HasField("seed")``); ``proto`` is the message."""

    _choices = _JOB_CHOICES

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name == "optimizer":
            return OptimizerView(self._proto.optimizer)
        if name == "schedule":
            return ScheduleView(self._proto.schedule)
        return super().__getattr__(name)


def spec_view(proto: jobs_pb2.JobSpec) -> JobSpecView:
    return JobSpecView(proto)
