"""Progress bars for uploads and downloads (and the decision, shared with the epoch bars of
trainerd._display, of whether to draw one): tqdm when it is installed and stderr is a terminal or
the code runs in Jupyter; off otherwise (logs and CI get no bar)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any, Protocol, Union

__all__ = ["Progress", "ProgressArg", "in_jupyter", "make_progress", "tqdm_class"]

#: What ``progress=`` takes: None (automatic), True or False, or a callable given
#: (bytes done, bytes in all) after each chunk.
ProgressArg = Union[bool, None, Callable[[int, int], object]]


class Progress(Protocol):
    def update(self, done: int) -> None: ...

    def close(self) -> None: ...


class _Off:
    def update(self, done: int) -> None:
        pass

    def close(self) -> None:
        pass


class _Callback:
    def __init__(self, callback: Callable[[int, int], object], total: int) -> None:
        self._callback = callback
        self._total = total

    def update(self, done: int) -> None:
        self._callback(done, self._total)

    def close(self) -> None:
        pass


class _Tqdm:
    def __init__(self, bar: Any) -> None:
        self._bar = bar
        self._done = 0

    def update(self, done: int) -> None:
        self._bar.update(done - self._done)
        self._done = done

    def close(self) -> None:
        self._bar.close()


def in_jupyter() -> bool:
    """Whether the code runs in a Jupyter kernel (IPython's ZMQ shell)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    get_ipython = getattr(ipython, "get_ipython", None)
    shell = get_ipython() if callable(get_ipython) else None
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def tqdm_class(progress: bool | None) -> Any:
    """The tqdm class a bar should be drawn with, or None for no bar: ``progress`` None draws one
    in Jupyter (tqdm.auto, a widget there) or when stderr is a terminal (plain tqdm), True draws
    one anyway, False never; None too when tqdm is not installed."""
    if progress is False:
        return None
    jupyter = in_jupyter()
    if progress is None and not (jupyter or sys.stderr.isatty()):
        return None
    try:
        return importlib.import_module("tqdm.auto" if jupyter else "tqdm").tqdm
    except ImportError:
        return None


def make_progress(progress: ProgressArg, total: int, description: str) -> Progress:
    """The progress display ``progress=`` asks for, over ``total`` bytes."""
    if callable(progress):
        return _Callback(progress, total)
    tqdm = tqdm_class(progress)
    if tqdm is None:
        return _Off()
    bar = tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=description,
        leave=False,
    )
    return _Tqdm(bar)
