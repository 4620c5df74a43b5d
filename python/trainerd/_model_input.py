"""What ``model=`` sends with a job: a spec string as it is, or a module's archive: a
``torch.nn.Module`` exported with ``torch.export`` in training mode (trained as an exported
program), a ``torch.jit.ScriptModule``'s TorchScript, a ``.pt2`` or TorchScript file, or such a
file's bytes. Which archive a file or bytes hold, their content says. An archive larger than the
daemon's message limit allows is refused here, since no request could carry it."""

from __future__ import annotations

import io
import os
import warnings
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Union

from trainerd._optional import import_torch

__all__ = [
    "MAX_TORCHSCRIPT_BYTES",
    "ModelArg",
    "is_exported_program",
    "model_argument",
    "needs_feature_shape",
]

# The daemon's message limit less room for the spec (common/job_limits.h kMaxTorchScriptBytes).
MAX_TORCHSCRIPT_BYTES = (64 << 20) - (64 << 10)

#: What ``model=`` takes: a spec string, a torch.nn.Module, a path to a TorchScript file, or the
#: bytes of one.
ModelArg = Union[str, "os.PathLike[str]", bytes, Any]


def model_argument(
    model: object, feature_shape: Callable[[], Sequence[int]] | None = None
) -> tuple[str, bytes]:
    """(spec text, module bytes) for ``model=``: a spec string ("linear:64,relu,linear:1") with
    no module; "exported" and the archive torch.export.save writes, of a torch.nn.Module
    (exported in training mode with an example batch of ``feature_shape()``, the dataset's rows,
    its batch dimension dynamic), of a .pt2 file (a path) or given as bytes; or "torchscript" and
    the archive of a ScriptModule, of a TorchScript file or given as bytes. Which archive bytes
    and files hold, their content says."""
    if isinstance(model, bytes):
        return _archive_kind(model), _check_module_bytes(model, "model")
    if isinstance(model, os.PathLike) or (
        isinstance(model, str)
        and (
            os.sep in model
            or model.endswith((".pt", ".pth", ".pt2", ".zip", ".ts", ".torchscript"))
            or os.path.isfile(model)
        )
    ):
        path = Path(os.fspath(model))
        try:
            data = path.read_bytes()
        except OSError as e:
            raise FileNotFoundError(f"model: cannot read '{path}': {e.strerror or e}") from e
        return _archive_kind(data), _check_module_bytes(data, f"model '{path}'")
    if isinstance(model, str):
        text = model.strip()
        if not text or text == "torchscript":  # what a spec says when a module comes with it
            raise ValueError(
                "model needs a spec, e.g. 'linear:64,relu,linear:1', a torch.nn.Module or a "
                "TorchScript file"
            )
        return text, b""
    if _is_torch_module(model):
        torch = import_torch()
        if isinstance(model, torch.jit.ScriptModule):
            return "torchscript", _script_module(model)
        if feature_shape is None:
            raise TypeError("a torch.nn.Module trains as a job of its own: pass it to submit()")
        return "exported", _export_module(model, tuple(feature_shape()))
    raise TypeError(
        "model must be a spec string, a torch.nn.Module, a path to a TorchScript file or its "
        f"bytes, not {type(model).__name__}"
    )


def _is_torch_module(value: object) -> bool:
    for cls in type(value).__mro__:
        if cls.__module__.startswith("torch") and cls.__name__ in ("Module", "ScriptModule"):
            return True
    return False


def _script_module(module: Any) -> bytes:
    torch = import_torch()

    buffer = io.BytesIO()
    try:
        # torch.jit.script compiles some methods lazily: save is where those fail.
        scripted = module if isinstance(module, torch.jit.ScriptModule) else torch.jit.script(module)
        torch.jit.save(scripted, buffer)
    except Exception as e:  # torch raises many kinds: NotSupportedError, RuntimeError, ...
        what = f"script the model ({type(module).__name__}) with torch.jit.script"
        advice = "Make its forward scriptable, or pass torch.jit.trace(model, example) or a "
        raise _refused(what, e, advice + "TorchScript file instead") from e
    return _check_module_bytes(buffer.getvalue(), "model")


def needs_feature_shape(model: object) -> bool:
    """Whether ``model=`` is a torch.nn.Module that submit exports (not a ScriptModule)."""
    if not _is_torch_module(model):
        return False
    return not isinstance(model, import_torch().jit.ScriptModule)


def is_exported_program(data: bytes) -> bool:
    """Whether ``data`` is an archive torch.export.save wrote: a zip holding
    ``<name>/models/model.json``."""
    if not data.startswith(b"PK"):
        return False
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return any(n.endswith("/models/model.json") for n in archive.namelist())
    except (zipfile.BadZipFile, ValueError, OSError):
        return False


def _archive_kind(data: bytes) -> str:
    return "exported" if is_exported_program(data) else "torchscript"


def _export_module(module: Any, feature_shape: tuple[int, ...]) -> bytes:
    """torch.export of ``module`` in training mode (so that trainerd can switch dropout and batch
    norm between training and evaluation), on an example batch of 2 rows of ``feature_shape``
    (zeros, on the module's device), the batch dimension dynamic; the bytes torch.export.save
    writes. The module's own training flag is restored."""
    torch = import_torch()
    parameter = next(iter(module.parameters()), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    example = torch.zeros((2, *feature_shape), dtype=torch.float32, device=device)
    was_training = module.training
    buffer = io.BytesIO()
    try:
        module.train()
        with warnings.catch_warnings():
            # nn.LSTM/GRU/RNN keep their weights in a Python list too; export warns about that
            # list, which is torch's own code and the user can do nothing about.
            warnings.filterwarnings("ignore", message=r"The tensor attributes .*_flat_weights")
            program = torch.export.export(
                module, (example,), dynamic_shapes=({0: torch.export.Dim("batch", min=1)},)
            )
        torch.export.save(program, buffer)
    except Exception as e:  # torch raises many kinds: UserError, TorchRuntimeError, ...
        what = (
            f"export the model ({type(module).__name__}) with torch.export for rows shaped "
            f"{list(feature_shape)}"
        )
        advice = "Make its forward exportable (https://pytorch.org/docs/stable/export.html), "
        raise _refused(what, e, advice + "or pass a .pt2 file instead") from e
    finally:
        module.train(was_training)
    return _check_module_bytes(buffer.getvalue(), "model")


def _refused(what: str, error: Exception, advice: str) -> TypeError:
    """The error for a module torch could not script or export: the first line of torch's
    message that says something, and what to do."""
    text = str(error)
    first = next((line for line in text.strip().split("\n") if line.strip()), text).strip()
    return TypeError(f"cannot {what}: {first}. {advice}")


def _check_module_bytes(data: bytes, what: str) -> bytes:
    if not data:
        raise ValueError(f"{what} is empty")
    if len(data) > MAX_TORCHSCRIPT_BYTES:
        raise ValueError(
            f"{what} has {len(data)} bytes; modules of at most {MAX_TORCHSCRIPT_BYTES} bytes can "
            "be sent (the daemon's message limit)"
        )
    return data
