"""A random search's distributions, for :meth:`trainerd.Client.sweep`'s ``search``: the daemon
draws ``trials`` members from them with ``search_seed`` (SubmitSweepRequest.search), the same
members for the same space and seed.

Example::

    from trainerd.search import Choice, Integer, LogUniform

    sweep = client.sweep("digits", model="linear:64,relu,linear:10", epochs=50,
                         validation_fraction=0.2, trials=64, search_seed=0, search={
                             "lr": LogUniform(1e-4, 1e-1),
                             "batch_size": Choice(16, 64, 256),
                             "model": Choice("linear:32,relu,linear:10", "linear:128,relu,linear:10"),
                             "epochs": Integer(10, 50),
                         })
"""

from __future__ import annotations

import dataclasses
from typing import Any, Union

__all__ = ["Choice", "Distribution", "Integer", "LogUniform", "Uniform"]


@dataclasses.dataclass(frozen=True)
class Uniform:
    """A float between ``low`` and ``high``, each value as likely."""

    low: float
    high: float


@dataclasses.dataclass(frozen=True)
class LogUniform:
    """A float between ``low`` > 0 and ``high`` whose logarithm is uniform (rates, decays)."""

    low: float
    high: float


@dataclasses.dataclass(frozen=True)
class Integer:
    """A whole number from ``low`` to ``high``, both included; ``log``: its logarithm uniform
    (widths), ``low`` >= 1."""

    low: int
    high: int
    log: bool = False


class Choice:
    """One of ``values``, each as likely: numbers, model specs, names (``"adam"``), booleans."""

    def __init__(self, *values: Any) -> None:
        if not values:
            raise ValueError("Choice needs at least one value")
        self.values = values

    def __repr__(self) -> str:
        return f"Choice{self.values!r}"


Distribution = Union[Uniform, LogUniform, Integer, Choice]
