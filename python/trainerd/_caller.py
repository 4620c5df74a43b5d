"""Warnings that point at the caller's line: the first frame outside this package, however deep
in it the warning is raised (the clients run their operations a few frames below the public
call)."""

from __future__ import annotations

import os
import sys
import warnings

__all__ = ["warn"]

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    frame = sys._getframe(1)  # noqa: SLF001 (how far up the caller is)
    level = 2
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(
        _PACKAGE
    ):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)
