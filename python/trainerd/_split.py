"""The rows a job held out for validation (``validation_fraction``), as the daemon chose them."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from trainerd._optional import import_torch

if TYPE_CHECKING:
    import numpy

__all__ = ["held_out_rows", "held_out_count"]


def held_out_count(rows: int, fraction: float) -> int:
    """The rows held out: fraction * rows (float64) rounded to the nearest integer with halves
    away from zero, as the daemon's llround (not Python's round(), which rounds halves to even:
    10 rows at 0.25 hold out 3, not 2)."""
    if not fraction > 0:
        return 0
    if fraction >= 1:
        return rows
    value = fraction * rows
    whole = math.floor(value)
    return int(whole) + (1 if value - whole >= 0.5 else 0)


def held_out_rows(rows: int, fraction: float, seed: int) -> numpy.ndarray[Any, numpy.dtype[numpy.int64]]:
    """The indices (int64, in the split's order) of the rows a job with this ``seed`` held out of
    a dataset of ``rows`` rows: the last :func:`held_out_count` of
    ``torch.randperm(rows, generator=torch.Generator().manual_seed(seed))``, drawn on the CPU
    whatever the job's device (jobs.proto, JobSpec.validation_fraction). Needs torch, the same
    version as the daemon's LibTorch for the same permutation (``client.version()`` names it).

    Example::

        rows = held_out_rows(len(X), job.spec.validation_fraction, job.seed)
        model(torch.from_numpy(X[rows]))   # the rows the daemon validated on
    """
    torch = import_torch()
    count = held_out_count(rows, fraction)
    generator = torch.Generator().manual_seed(seed)
    permutation = torch.randperm(rows, generator=generator, dtype=torch.int64)
    result: numpy.ndarray[Any, numpy.dtype[numpy.int64]] = permutation[rows - count :].numpy()
    return result
