"""The optional dependencies, imported when a call needs them. torch is typed as Any here: the
package works (and type-checks) whether or not torch is installed, whatever torch's version.
Nothing in the package imports torch until a call needs it (a tensor to upload, a module to
send, a model to load), and then it is the torch the user has: the package never requires one.
"""

from __future__ import annotations

import importlib
import re
import sys
from typing import Any

__all__ = ["import_extra", "import_torch", "torch_mismatch"]


def import_torch() -> Any:
    """The torch module; ImportError when torch is not installed."""
    return importlib.import_module("torch")


def import_extra(module: str, extra: str, what: str) -> Any:
    """``module`` (e.g. "tensorboard.compat.proto.event_pb2"), which the package's ``extra``
    installs; an ImportError naming the extra when it is not installed. ``what``: the call that
    needs it, for the message."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"{what} needs {module.split('.', 1)[0]}: pip install 'trainerd[{extra}]' ({e})"
        ) from e


def _major_minor(version: str) -> tuple[int, int] | None:
    match = re.match(r"\s*v?(\d+)\.(\d+)", version)
    return None if match is None else (int(match.group(1)), int(match.group(2)))


def torch_mismatch(libtorch_version: str) -> str | None:
    """The warning to give when the torch this process has imported and the daemon's LibTorch
    (``libtorch_version``, from GetVersion) differ in major.minor version, else None (also when
    torch is not imported or a version cannot be read)."""
    torch = sys.modules.get("torch")
    ours = getattr(torch, "__version__", None) if torch is not None else None
    if not isinstance(ours, str):
        return None
    mine, theirs = _major_minor(ours), _major_minor(libtorch_version)
    if mine is None or theirs is None or mine == theirs:
        return None
    return (
        f"this process's torch is {ours} and the daemon's LibTorch is {libtorch_version}: "
        "TorchScript written by one minor version may not load, or may load differently, in "
        f"the other (modules sent with submit(model=...), models loaded by job.model()); "
        f"torch {theirs[0]}.{theirs[1]} beside the client matches the daemon"
    )

