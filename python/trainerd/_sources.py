"""The arrays an upload reads: numpy arrays, torch tensors (on the CPU or a GPU) and pandas
columns, each seen as rows of one logical array (:class:`Source`) and read a block of rows at a
time, so that nothing is copied whole: a C-contiguous array already of the wire's dtype is read in
place, anything else converted a few MiB at a time (:func:`convert_block`)."""

from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np

from trainerd._optional import import_torch

__all__ = [
    "FrameSource",
    "NumpySource",
    "Reshaped",
    "ScalarView",
    "Source",
    "TorchSource",
    "array_source",
    "convert_block",
    "is_frame",
    "is_path",
    "is_series",
    "rows_per_block",
    "split_columns",
]

# Rows are converted and checked in blocks of about this many bytes.
_BLOCK_BYTES = 4 << 20


class Source:
    """A 2-D-or-more array read by rows: ``shape`` is (rows, ...per-row shape), ``label`` names it
    in messages ("X", "y", "df['price']"), ``kind`` is the numpy kind of its values (f, i, u, b).
    """

    label: str
    shape: tuple[int, ...]
    kind: str
    column_offset: int = 0  # when the source is the last columns of a 2-D array

    @property
    def rows(self) -> int:
        return self.shape[0]

    def block(self, start: int, stop: int) -> np.ndarray[Any, Any]:
        """Rows [start, stop) as a numpy array shaped (stop - start, ...per-row shape)."""
        raise NotImplementedError

    def item_bytes(self) -> int:
        return 8

    def describe(self, row: int, inner: tuple[int, ...]) -> str:
        """"X[7, 2]": element ``inner`` of row ``row`` (the column counted in the whole array)."""
        if self.column_offset and inner:
            inner = (inner[0] + self.column_offset, *inner[1:])
        index = ", ".join(str(i) for i in (row, *inner))
        return f"{self.label}[{index}]"


_ALLOWED_KINDS = {"f": "floating", "i": "integer", "u": "unsigned integer", "b": "boolean"}


def _check_kind(label: str, dtype: np.dtype[Any]) -> str:
    if dtype.kind in _ALLOWED_KINDS:
        return dtype.kind
    what = {
        "O": "object",
        "U": "str",
        "S": "bytes",
        "c": "complex",
        "M": "datetime64",
        "m": "timedelta64",
        "V": "structured",
    }.get(dtype.kind, str(dtype))
    raise TypeError(
        f"{label} has dtype {dtype} ({what}); trainerd takes numbers: float32 features and "
        "float32 or int64 targets (convert the values first, e.g. with .astype('float32'))"
    )


class NumpySource(Source):
    def __init__(
        self,
        label: str,
        array: np.ndarray[Any, Any],
        columns: slice | None = None,
    ) -> None:
        self.label = label
        self.kind = _check_kind(label, array.dtype)
        self._array = array
        self._columns = columns
        if columns is None:
            self.shape = tuple(int(d) for d in array.shape)
        else:
            start, stop, _ = columns.indices(array.shape[1])
            self.shape = (int(array.shape[0]), stop - start)
            self.column_offset = start

    def item_bytes(self) -> int:
        return int(self._array.dtype.itemsize)

    def block(self, start: int, stop: int) -> np.ndarray[Any, Any]:
        if self._columns is None:
            return self._array[start:stop]
        return self._array[start:stop, self._columns]


class TorchSource(Source):
    """A torch tensor, on the CPU or a GPU: each block is copied to the CPU on its own, so a CUDA
    tensor never needs a second full copy in host memory."""

    def __init__(self, label: str, tensor: Any, columns: slice | None = None) -> None:
        torch = import_torch()

        self.label = label
        if tensor.is_complex():
            raise TypeError(f"{label} is a complex tensor ({tensor.dtype}); trainerd takes reals")
        if tensor.dtype == torch.bool:
            self.kind = "b"
        elif tensor.is_floating_point():
            self.kind = "f"
        elif tensor.dtype == torch.uint8:
            self.kind = "u"
        else:
            self.kind = "i"
        if tensor.requires_grad:
            tensor = tensor.detach()
        self._tensor = tensor
        self._columns = columns
        self._float_cast = tensor.dtype in (torch.bfloat16,) or str(tensor.dtype).startswith(
            "torch.float8"
        )
        if columns is None:
            self.shape = tuple(int(d) for d in tensor.shape)
        else:
            start, stop, _ = columns.indices(int(tensor.shape[1]))
            self.shape = (int(tensor.shape[0]), stop - start)
            self.column_offset = start

    def item_bytes(self) -> int:
        return int(self._tensor.element_size())

    def block(self, start: int, stop: int) -> np.ndarray[Any, Any]:
        part = self._tensor[start:stop]
        if self._columns is not None:
            part = part[:, self._columns]
        part = part.to("cpu")
        if self._float_cast:
            part = part.float()
        result = part.numpy()
        assert isinstance(result, np.ndarray)
        return result


class FrameSource(Source):
    """Columns of a pandas DataFrame (or a Series), converted a block of rows at a time."""

    def __init__(self, label: str, frame: Any, columns: list[Any]) -> None:
        import pandas as pd

        self.label = label
        self._frame = frame
        self._columns = columns
        kinds = set()
        self._has_na = False
        for column in columns:
            series = frame[column]
            dtype = series.dtype
            if isinstance(dtype, pd.CategoricalDtype):
                raise TypeError(
                    f"{label}: column {column!r} is categorical; upload its codes "
                    "(df[col].cat.codes) or one-hot columns"
                )
            if pd.api.types.is_bool_dtype(dtype):
                kinds.add("b")
            elif pd.api.types.is_integer_dtype(dtype):
                kinds.add("i")
            elif pd.api.types.is_float_dtype(dtype):
                kinds.add("f")
            else:
                raise TypeError(
                    f"{label}: column {column!r} has dtype {dtype}; trainerd takes numeric "
                    "columns (convert or drop it)"
                )
            if series.hasnans:
                self._has_na = True
        self.kind = "i" if kinds == {"i"} else ("b" if kinds == {"b"} else "f")
        if self._has_na and self.kind != "f":
            self.kind = "f"  # missing values become NaN, which the checks then name
        self.shape = (len(frame), len(columns))

    def item_bytes(self) -> int:
        return 8

    def block(self, start: int, stop: int) -> np.ndarray[Any, Any]:
        part = self._frame.iloc[start:stop][self._columns]
        if self.kind == "i":
            result = part.to_numpy(dtype=np.int64)
        elif self.kind == "b":
            result = part.to_numpy(dtype=np.bool_)
        else:
            result = part.to_numpy(dtype=np.float64, na_value=np.nan)
        assert isinstance(result, np.ndarray)
        return result

    def describe(self, row: int, inner: tuple[int, ...]) -> str:
        column = self._columns[inner[0]] if inner else self._columns[0]
        return f"{self.label}[{column!r}] at row {row} (index {self._frame.index[row]!r})"


class ScalarView(Source):
    """A source of shape (rows, 1) seen as (rows,): a single target column sent as one scalar
    class index per row."""

    def __init__(self, inner: Source) -> None:
        self._inner = inner
        self.label = inner.label
        self.kind = inner.kind
        self.shape = (inner.rows,)
        self.column_offset = inner.column_offset

    def item_bytes(self) -> int:
        return self._inner.item_bytes()

    def block(self, start: int, stop: int) -> np.ndarray[Any, Any]:
        return self._inner.block(start, stop).reshape(stop - start)

    def describe(self, row: int, inner: tuple[int, ...]) -> str:
        return self._inner.describe(row, (0,))


class Reshaped(Source):
    """A 1-D source seen as (rows, 1): one feature, or one float32 target, per row."""

    def __init__(self, inner: Source) -> None:
        self._inner = inner
        self.label = inner.label
        self.kind = inner.kind
        self.shape = (inner.rows, 1)

    def item_bytes(self) -> int:
        return self._inner.item_bytes()

    def block(self, start: int, stop: int) -> np.ndarray[Any, Any]:
        return self._inner.block(start, stop).reshape(stop - start, 1)

    def describe(self, row: int, inner: tuple[int, ...]) -> str:
        return self._inner.describe(row, ())


def rows_per_block(source: Source, out_item: int) -> int:
    per_row = int(np.prod(source.shape[1:], dtype=np.int64)) if len(source.shape) > 1 else 1
    row_bytes = max(1, per_row * max(out_item, source.item_bytes()))
    return max(1, _BLOCK_BYTES // row_bytes)


def convert_block(block: np.ndarray[Any, Any], out: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """The block as a C-contiguous little-endian array of ``out``: the block itself (no copy)
    when it already is one."""
    with warnings.catch_warnings(), np.errstate(over="ignore", invalid="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.ascontiguousarray(block, dtype=out)


def is_torch_tensor(value: object) -> bool:
    module = type(value).__module__
    return module.startswith("torch") and type(value).__name__ in ("Tensor", "Parameter")


def is_frame(value: object) -> bool:
    return type(value).__module__.startswith("pandas") and type(value).__name__ == "DataFrame"


def is_series(value: object) -> bool:
    return type(value).__module__.startswith("pandas") and type(value).__name__ == "Series"


def is_path(value: object) -> bool:
    return isinstance(value, (str, os.PathLike))


def array_source(label: str, value: Any, columns: slice | None = None) -> Source:
    if is_torch_tensor(value):
        return TorchSource(label, value, columns)
    if isinstance(value, np.ndarray):
        return NumpySource(label, value, columns)
    if isinstance(value, (list, tuple)) or np.isscalar(value):
        array = np.asarray(value)
        if array.dtype.kind == "O":
            raise TypeError(f"{label} holds values numpy makes objects of (ragged or mixed)")
        return NumpySource(label, array, columns)
    if hasattr(value, "__array__"):
        return NumpySource(label, np.asarray(value), columns)
    raise TypeError(
        f"{label} must be a numpy array, a torch tensor, a pandas DataFrame or a path to a "
        f".npy or .csv file, not {type(value).__name__}"
    )


def split_columns(features: Source, split: int) -> tuple[Source, Source]:
    """The first ``split`` columns and the rest of a 2-D numpy or torch source."""
    if isinstance(features, NumpySource):
        array = features._array  # noqa: SLF001
        return (
            NumpySource(features.label, array, slice(0, split)),
            NumpySource(features.label, array, slice(split, None)),
        )
    if isinstance(features, TorchSource):
        tensor = features._tensor  # noqa: SLF001
        return (
            TorchSource(features.label, tensor, slice(0, split)),
            TorchSource(features.label, tensor, slice(split, None)),
        )
    raise TypeError(f"cannot split {features.label} into features and targets")
