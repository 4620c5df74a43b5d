"""The optional dependencies, imported when a call needs them. torch is typed as Any here: the
package works (and type-checks) whether or not torch is installed, whatever torch's version."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["import_torch"]


def import_torch() -> Any:
    """The torch module; ImportError when torch is not installed."""
    return importlib.import_module("torch")
