"""A job's trained model as PyTorch users take it today: its state_dict (the safetensors file
DownloadModel sends with ``format=MODEL_FORMAT_SAFETENSORS``), a ready ``nn.Module``, a
``torch.export`` program (``.pt2``), and the downloaded archive loaded (TorchScript, or an
exported program switched to evaluation behaviour) or saved to a file. The safetensors file is
read by the ``safetensors`` package (``pip install trainerd[safetensors]``), which reads tensors
and never runs code; torch is needed only for tensors, modules and programs."""

from __future__ import annotations

import collections
import io
import json
import os
import struct
import tempfile
import warnings
from pathlib import Path
from typing import Any

from trainerd._model_input import is_exported_program
from trainerd._modules import build_sequential
from trainerd._optional import import_torch

__all__ = [
    "StateDict",
    "eval_exported_module",
    "export_program",
    "load_into",
    "load_model",
    "parse_state_dict",
    "write_atomically",
]


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


def load_model(data: bytes, map_location: str) -> Any:
    """The trained model from an archive's bytes: an exported program's (an exported job's .pt2)
    as a torch.fx.GraphModule in evaluation mode (eval_exported_module), a TorchScript archive's
    with torch.jit.load; the bytes themselves without torch."""
    try:
        torch = import_torch()
    except ImportError:
        return data
    if is_exported_program(data):
        with warnings.catch_warnings():
            # torch.export.load makes its tensors over the archive's read-only bytes and says
            # so; they are copied below, before anything can write to them.
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            program = torch.export.load(io.BytesIO(data))
        module = program.module()
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                tensor.data = tensor.data.clone()
        return eval_exported_module(module).to(map_location)
    return torch.jit.load(io.BytesIO(data), map_location=map_location)


# Each mode-dependent operator trainerd switches (docs/TRAINING.md): its argument, and the value
# it takes in evaluation mode.
_EVAL_ARGUMENTS = {
    "aten.dropout.default": ("train", 2, False),
    "aten.feature_dropout.default": ("train", 2, False),
    "aten.alpha_dropout.default": ("train", 2, False),
    "aten.feature_alpha_dropout.default": ("train", 2, False),
    "aten.batch_norm.default": ("training", 5, False),
    "aten.lstm.input": ("train", 6, False),
    "aten.gru.input": ("train", 6, False),
    "aten.rnn_tanh.input": ("train", 6, False),
    "aten.rnn_relu.input": ("train", 6, False),
    "aten.scaled_dot_product_attention.default": ("dropout_p", 4, 0.0),
}


def eval_exported_module(module: Any) -> Any:
    """An exported program's module (``ExportedProgram.module()``, exported in training mode)
    switched to evaluation behaviour as trainerd validates it: dropout off, batch norm on its
    running statistics (when it has them), the recurrent layers' and attention's dropout off.
    ``.eval()`` is not supported on such modules; this rewrites the nodes' mode arguments."""
    for node in module.graph.nodes:
        rule = _EVAL_ARGUMENTS.get(str(node.target)) if node.op == "call_function" else None
        if rule is None:
            continue
        name, position, value = rule
        if name == "training" and (len(node.args) <= 3 or node.args[3] is None):
            continue  # batch norm without running statistics uses the batch's in both modes
        if name in node.kwargs:
            node.update_kwarg(name, value)
        elif len(node.args) > position:
            node.update_arg(position, value)
        else:
            node.update_kwarg(name, value)
    module.recompile()
    return module


def write_atomically(path: str | os.PathLike[str], data: bytes) -> Path:
    """Writes ``data`` to a temporary file beside ``path`` and renames it over ``path``."""
    target = Path(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target
