"""A job's trained model as PyTorch users take it today: its state_dict (the safetensors file
DownloadModel sends with ``format=MODEL_FORMAT_SAFETENSORS``), a ready ``nn.Module`` and a
``torch.export`` program (``.pt2``). The safetensors file is read by the ``safetensors`` package
(``pip install trainerd[safetensors]``), which reads tensors and never runs code; torch is needed
only for tensors, modules and programs."""

from __future__ import annotations

import collections
import json
import os
import struct
from pathlib import Path
from typing import Any

from trainerd._modules import build_sequential
from trainerd._optional import import_torch

__all__ = ["StateDict", "export_program", "load_into", "parse_state_dict"]


class StateDict(collections.OrderedDict[str, Any]):
    """A job's trained weights, name to tensor (torch tensors when torch is importable, numpy
    arrays otherwise), in the order of the module's own ``state_dict()``. ``metadata``: the file's
    ``__metadata__`` ("trainerd.job", "trainerd.model", "trainerd.feature_shape", "format")."""

    metadata: dict[str, str]

    @property
    def model(self) -> str:
        """The spec the job trained ("linear:64,relu,linear:1"), or "torchscript"."""
        return self.metadata.get("trainerd.model", "")

    @property
    def feature_shape(self) -> tuple[int, ...]:
        """One row's shape, the batch dimension left out."""
        return tuple(int(d) for d in json.loads(self.metadata.get("trainerd.feature_shape", "[]")))


def _import_safetensors(backend: str) -> Any:
    import importlib

    try:
        return importlib.import_module(f"safetensors.{backend}")
    except ImportError as e:
        raise ImportError(
            "reading a job's state_dict needs the safetensors package: "
            "pip install 'trainerd[safetensors]' (or pip install safetensors)"
        ) from e


def _header_order(data: bytes) -> tuple[list[str], dict[str, str]]:
    """The tensors' names in the order of their bytes (the module's state_dict order, as the
    daemon writes them) and the metadata. The file itself is checked by safetensors."""
    if len(data) < 8:
        raise ValueError("not a safetensors file: shorter than its header size")
    (size,) = struct.unpack("<Q", data[:8])
    if size > len(data) - 8:
        raise ValueError("not a safetensors file: its header runs past its end")
    header = json.loads(data[8 : 8 + size])
    if not isinstance(header, dict):
        raise ValueError("not a safetensors file: its header is not an object")
    metadata = header.pop("__metadata__", None) or {}
    names = sorted(header, key=lambda name: tuple(header[name]["data_offsets"]))
    return names, {str(k): str(v) for k, v in metadata.items()}


def parse_state_dict(data: bytes) -> StateDict:
    """The tensors of a safetensors file, as torch tensors when torch is importable and numpy
    arrays otherwise."""
    try:
        import_torch()
        backend = "torch"
    except ImportError:
        backend = "numpy"
    tensors = _import_safetensors(backend).load(data)
    names, metadata = _header_order(data)
    out = StateDict((name, tensors[name]) for name in names)
    out.metadata = metadata
    return out


def load_into(job_id: str, state: StateDict, module: Any | None) -> Any:
    """``module`` (or, without one, the ``nn.Sequential`` of the job's spec) with ``state``
    loaded strictly, in eval mode."""
    if module is None:
        if state.model in ("", "torchscript", "exported"):
            raise ValueError(
                f"job '{job_id}' trained its own module, not a spec: pass an instance of that "
                "module's class to load the weights into, as in job.module(MyNet())"
            )
        module = build_sequential(state.model, state.feature_shape)
    module.load_state_dict(state, strict=True)
    return module.eval()


def export_program(
    module: Any, feature_shape: tuple[int, ...], path: str | os.PathLike[str]
) -> Path:
    """Saves ``torch.export.export(module)`` (in eval mode, on an example batch of two zero rows
    of ``feature_shape``, the batch dimension dynamic) to ``path`` with ``torch.export.save``."""
    torch = import_torch()
    module = module.eval()
    example = torch.zeros((2, *feature_shape), dtype=torch.float32)
    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(module, (example,), dynamic_shapes=({0: batch},))
    target = Path(path)
    torch.export.save(program, str(target))
    return target
