"""What ``Client.upload`` sends: the dataset's header and its payload, read from numpy arrays,
torch tensors, pandas DataFrames or .npy / .csv files, checked whole before the first byte is
sent, then streamed in chunks of at most 1 MiB without a second copy of the data.

The payload is what trainctl sends for the same data (proto/trainerd/v1/datasets.proto): every
row's float32 features in C order, then every row's targets (float32, or int64 class indices),
little-endian. Shapes follow trainctl's rules (client/requests.h): a 1-D features array is one
feature per row; a 1-D targets array is one scalar class index per row for int64 and shape (1,)
for float32; without separate targets, the last ``target_columns`` columns of a 2-D array are the
targets.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Union

import numpy as np

from trainerd._optional import import_torch
from trainerd.v1 import datasets_pb2

__all__ = [
    "CHUNK_BYTES",
    "Payload",
    "RawChunk",
    "prepare_payload",
    "validate_dataset_name",
    "validate_dataset_reference",
]

#: Payload bytes per UploadDatasetRequest chunk: the daemon's limit.
CHUNK_BYTES = 1 << 20
# Rows are converted and checked in blocks of about this many bytes.
_BLOCK_BYTES = 4 << 20
_MAX_DIMS = 8
_MAX_DIMENSION = 1 << 31
_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")
_MAX_OWNER_BYTES = 1024
_INT64_MAX = np.iinfo(np.int64).max
_EXAMPLES = 5

PathArg = Union[str, "os.PathLike[str]"]


def validate_dataset_name(name: object) -> str:
    """The daemon's rule for the name of an upload, checked before anything is sent: a bare name
    (the dataset is the caller's)."""
    if not isinstance(name, str):
        raise TypeError(f"a dataset name is a str, not {type(name).__name__}")
    if "/" in name:
        raise ValueError(
            f"dataset name {name!r} is not valid: a dataset is uploaded under a bare name, as one "
            "of the caller's ('OWNER/NAME' names another owner's dataset in the other calls)"
        )
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"dataset name {name!r} is not valid: use 1 to 128 letters, digits, '.', '_' or '-'"
        )
    return name


def validate_dataset_reference(name: object) -> str:
    """The daemon's rule for naming a dataset in a job: ``NAME`` (one of the caller's) or
    ``OWNER/NAME`` (another owner's; the name cannot hold '/', so the last one splits)."""
    if not isinstance(name, str):
        raise TypeError(f"a dataset name is a str, not {type(name).__name__}")
    owner, slash, bare = name.rpartition("/")
    if not slash:
        return validate_dataset_name(name)
    if len(owner.encode()) > _MAX_OWNER_BYTES or any(ord(c) < 0x20 or c == "\x7f" for c in owner):
        raise ValueError(
            f"dataset {name[:64]!r} is not valid: its owner has more than {_MAX_OWNER_BYTES} "
            "bytes or control characters"
        )
    if not _NAME.fullmatch(bare) or bare in (".", ".."):
        raise ValueError(
            f"dataset {name[:200]!r} is not valid: NAME (after OWNER/) uses 1 to 128 letters, "
            "digits, '.', '_' or '-'"
        )
    return name


@dataclasses.dataclass(frozen=True)
class RawChunk:
    """One chunk of payload, serialized by hand as UploadDatasetRequest{chunk} so that the bytes
    go from the array into the message without intermediate copies."""

    data: memoryview


# --- Sources: the rows of one logical array, read a block at a time ---------------------------


class _Source:
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


class _NumpySource(_Source):
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


class _TorchSource(_Source):
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


class _FrameSource(_Source):
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


class _ScalarView(_Source):
    """A source of shape (rows, 1) seen as (rows,): a single target column sent as one scalar
    class index per row."""

    def __init__(self, inner: _Source) -> None:
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


class _Reshaped(_Source):
    """A 1-D source seen as (rows, 1): one feature, or one float32 target, per row."""

    def __init__(self, inner: _Source) -> None:
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


# --- Conversion and checks -------------------------------------------------------------------


def _rows_per_block(source: _Source, out_item: int) -> int:
    per_row = int(np.prod(source.shape[1:], dtype=np.int64)) if len(source.shape) > 1 else 1
    row_bytes = max(1, per_row * max(out_item, source.item_bytes()))
    return max(1, _BLOCK_BYTES // row_bytes)


def _convert(block: np.ndarray[Any, Any], out: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """The block as a C-contiguous little-endian array of ``out``: the block itself (no copy)
    when it already is one."""
    with warnings.catch_warnings(), np.errstate(over="ignore", invalid="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.ascontiguousarray(block, dtype=out)


class _Problems:
    """The bad values found while checking a source: how many rows, and the first few."""

    def __init__(self, source: _Source, what: str) -> None:
        self.source = source
        self.what = what
        self.rows = 0
        self.examples: list[str] = []
        self.first_rows: list[int] = []

    def add(self, start: int, block: np.ndarray[Any, Any], bad: np.ndarray[Any, Any]) -> None:
        """``bad``: a boolean mask shaped like ``block``."""
        n = block.shape[0]
        bad_rows = np.flatnonzero(bad.reshape(n, -1).any(axis=1))
        if bad_rows.size == 0:
            return
        self.rows += int(bad_rows.size)
        for row in bad_rows[: max(0, _EXAMPLES - len(self.first_rows))]:
            row_values = block[int(row)]
            row_bad = bad[int(row)]
            inner: tuple[int, ...] = ()
            value: Any = row_values
            if np.ndim(row_values) > 0:
                position = int(np.flatnonzero(np.ravel(row_bad))[0])
                inner = tuple(int(i) for i in np.unravel_index(position, np.shape(row_values)))
                value = np.ravel(row_values)[position]
            self.first_rows.append(start + int(row))
            self.examples.append(f"{self.source.describe(start + int(row), inner)} = {value!r}")

    def raise_if_any(self) -> None:
        if not self.rows:
            return
        rows = ", ".join(str(r) for r in self.first_rows)
        more = "" if self.rows <= len(self.first_rows) else ", ..."
        raise ValueError(
            f"{self.source.label} has {self.what} in {self.rows} "
            f"row{'s' if self.rows != 1 else ''} (rows {rows}{more}); the first: "
            f"{self.examples[0]}. Nothing was sent"
        )


def _check_source(source: _Source, out: np.dtype[Any]) -> None:
    """Reads the whole source once, a block at a time, and raises ValueError naming the rows
    that cannot be sent: NaN or infinite values, values that do not fit float32, or int64
    targets that are not whole numbers."""
    step = _rows_per_block(source, out.itemsize)
    if out.kind == "f":
        problems = _Problems(source, "NaN or infinite values (or values beyond float32's range)")
        for start in range(0, source.rows, step):
            block = source.block(start, min(start + step, source.rows))
            if source.kind in "biu":
                continue  # integers and booleans are always finite in float32
            converted = _convert(block, out)
            bad = ~np.isfinite(converted)
            if bad.any():
                problems.add(start, block, bad)
        problems.raise_if_any()
        return
    # int64 targets: class indices.
    problems = _Problems(source, "values that are not whole numbers (int64 class indices)")
    for start in range(0, source.rows, step):
        block = source.block(start, min(start + step, source.rows))
        if source.kind == "f":
            values = np.asarray(block, dtype=np.float64)
            with np.errstate(invalid="ignore"):
                bad = ~np.isfinite(values) | (np.floor(values) != values) | (
                    np.abs(values) >= 2.0**63
                )
        elif source.kind == "u":
            bad = np.asarray(block) > _INT64_MAX
        else:
            continue
        if bad.any():
            problems.add(start, block, bad)
    problems.raise_if_any()


def _chunks_of(source: _Source, out: np.dtype[Any]) -> Iterator[memoryview]:
    """The source's bytes as ``out``, in pieces of at most CHUNK_BYTES. A C-contiguous array
    already of ``out`` is sliced in place; anything else is converted a block at a time."""
    step = _rows_per_block(source, out.itemsize)
    for start in range(0, source.rows, step):
        block = _convert(source.block(start, min(start + step, source.rows)), out)
        view = block.data.cast("B")
        for offset in range(0, len(view), CHUNK_BYTES):
            yield view[offset : offset + CHUNK_BYTES]


# --- Inputs ----------------------------------------------------------------------------------


def _is_torch_tensor(value: object) -> bool:
    module = type(value).__module__
    return module.startswith("torch") and type(value).__name__ in ("Tensor", "Parameter")


def _is_frame(value: object) -> bool:
    return type(value).__module__.startswith("pandas") and type(value).__name__ == "DataFrame"


def _is_series(value: object) -> bool:
    return type(value).__module__.startswith("pandas") and type(value).__name__ == "Series"


def _is_path(value: object) -> bool:
    return isinstance(value, (str, os.PathLike))


def _parse_target_dtype(target_dtype: object) -> str | None:
    if target_dtype is None:
        return None
    text = str(target_dtype)
    if text.startswith("torch."):
        text = text[len("torch.") :]
    aliases = {"float32": "float32", "float": "float32", "int64": "int64", "long": "int64"}
    try:
        text = aliases.get(text, str(np.dtype(text)))
    except TypeError:
        pass
    if text not in ("float32", "int64"):
        raise ValueError(
            f"target_dtype must be 'float32' (regression targets) or 'int64' (class indices), "
            f"not {target_dtype!r}"
        )
    return text


def _array_source(label: str, value: Any, columns: slice | None = None) -> _Source:
    if _is_torch_tensor(value):
        return _TorchSource(label, value, columns)
    if isinstance(value, np.ndarray):
        return _NumpySource(label, value, columns)
    if isinstance(value, (list, tuple)) or np.isscalar(value):
        array = np.asarray(value)
        if array.dtype.kind == "O":
            raise TypeError(f"{label} holds values numpy makes objects of (ragged or mixed)")
        return _NumpySource(label, array, columns)
    if hasattr(value, "__array__"):
        return _NumpySource(label, np.asarray(value), columns)
    raise TypeError(
        f"{label} must be a numpy array, a torch tensor, a pandas DataFrame or a path to a "
        f".npy or .csv file, not {type(value).__name__}"
    )


@dataclasses.dataclass
class _CsvTable:
    """A CSV file's numbers and its header line's fields (None without one)."""

    values: np.ndarray[Any, np.dtype[np.float64]]
    header: list[str] | None


def _read_csv(path: Path) -> _CsvTable:
    """A numeric CSV file as trainctl reads one: comma-separated numbers, an optional header line
    (a first line with a field that is not a number), blank lines ignored."""
    header: list[str] | None = None
    try:
        with open(path, encoding="utf-8", newline="") as file:
            header_lines = 0
            for line in file:
                stripped = line.strip()
                if not stripped:
                    header_lines += 1
                    continue
                fields = stripped.split(",")
                try:
                    for field in fields:
                        float(field)
                except ValueError:
                    header_lines += 1  # the header, which is skipped
                    header = [f.strip().strip('"') for f in line.rstrip("\r\n").split(",")]
                break
    except OSError as e:
        raise FileNotFoundError(f"cannot open '{path}': {e.strerror or e}") from e
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "input contained no data"
            array = np.loadtxt(
                path,
                delimiter=",",
                skiprows=header_lines,
                ndmin=2,
                dtype=np.float64,
                comments=None,
            )
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e
    return _CsvTable(array, header)


_INTEGER_TEXT = re.compile(r"\s*\+?\d+\s*")
_UNNAMED = re.compile(r"(Unnamed: \d+)?")


def _whole_numbers(column: np.ndarray[Any, Any]) -> bool:
    if not column.size:
        return False
    with np.errstate(invalid="ignore"):
        return bool(np.all(np.isfinite(column) & (np.floor(column) == column)))


def _csv_index_column(table: _CsvTable) -> bool:
    """Whether the file starts with the index ``DataFrame.to_csv`` writes unless index=False: a
    first column without a name in the header that holds distinct whole numbers (0..n-1 for a
    frame as read, any order for a split or a shuffle of one)."""
    if table.header is None or table.values.shape[1] < 3:
        return False
    if not _UNNAMED.fullmatch(table.header[0]):
        return False
    first = table.values[:, 0]
    return _whole_numbers(first) and np.unique(first).size == first.size


def _csv_integer_text(path: Path, has_header: bool) -> bool:
    """Whether every field of the last column, past the header, is written as a whole number
    ("3", not "3.0" or "3e0"): the column pandas would read as integers."""
    with open(path, encoding="utf-8", newline="") as file:
        first = has_header
        for line in file:
            stripped = line.strip()
            if not stripped:
                continue
            field = stripped.rsplit(",", 1)[-1]
            if not _INTEGER_TEXT.fullmatch(field) and not first:
                return False
            first = False
    return True


def _csv_class_targets(path: Path, table: _CsvTable, first: int) -> bool:
    """Whether the file's last column (the target, by trainctl's rule) holds class labels: every
    value a whole number of at least 0, written as one ("3", not "3.0"), as pandas writes an
    integer column."""
    if table.values.shape[1] - first < 2:
        return False
    last = table.values[:, -1]
    return _whole_numbers(last) and bool(np.all(last >= 0)) and _csv_integer_text(
        path, table.header is not None
    )


def _load_path(label: str, value: PathArg) -> tuple[np.ndarray[Any, Any], bool]:
    """(array, is_npy): a .npy file memory-mapped (read as it is sent), or a CSV file read whole,
    as trainctl does."""
    path = Path(value)
    if not path.exists():
        raise FileNotFoundError(f"{label}: '{path}' does not exist")
    if path.suffix.lower() == ".npy":
        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from e
        return array, True
    return _read_csv(path).values, False


@dataclasses.dataclass
class _CsvInput:
    """A CSV file's features and targets as an upload takes them: pandas' index column dropped,
    and whether its target column holds class labels."""

    values: np.ndarray[Any, Any]
    class_targets: bool


def _load_csv(path: Path, target_columns: int | None, given_dtype: str | None) -> _CsvInput:
    table = _read_csv(path)
    first = 0
    if _csv_index_column(table):
        first = 1
        rows = table.values.shape[0]
        warnings.warn(
            f"'{path}' starts with an unnamed column of distinct whole numbers (0 to "
            f"{int(table.values[:, 0].max())} over {rows} rows): the index DataFrame.to_csv "
            "writes unless index=False. It was dropped, not uploaded as a feature; write the "
            "file with df.to_csv(path, index=False) to leave it out",
            UserWarning,
            stacklevel=4,
        )
    values = table.values[:, first:] if first else table.values
    classes = False
    if (
        given_dtype is None
        and target_columns in (None, 1)
        and _csv_class_targets(path, table, first)
    ):
        classes = True
        name = f" '{table.header[-1]}'" if table.header and table.header[-1] else ""
        labels = np.unique(table.values[:, -1])
        shown = ", ".join(str(int(v)) for v in labels[:8]) + (", ..." if labels.size > 8 else "")
        warnings.warn(
            f"'{path}': its target column{name} holds whole numbers only ({shown}): uploaded as "
            "int64 class indices, as pandas reads such a column, so a job without a loss trains "
            "with cross_entropy (the model needs an output per class). Pass "
            "target_dtype='float32' to regress on them instead",
            UserWarning,
            stacklevel=4,
        )
    return _CsvInput(np.ascontiguousarray(values), classes)


def _frame_index_column(frame: Any) -> Any:
    """The name of a DataFrame's first column when it is pandas' index read back from a CSV
    file (``pd.read_csv`` of a file ``to_csv`` wrote with its index: "Unnamed: 0" holding
    distinct whole numbers), else None."""
    if len(frame.columns) < 2:
        return None
    first = frame.columns[0]
    if not isinstance(first, str) or not re.fullmatch(r"Unnamed: \d+", first):
        return None
    try:
        values = frame[first].to_numpy(dtype=np.float64)
    except (TypeError, ValueError):
        return None
    if not _whole_numbers(values) or np.unique(values).size != values.size:
        return None
    return first


@dataclasses.dataclass
class Payload:
    """A checked upload: the header's figures and the sources of its bytes."""

    feature_shape: tuple[int, ...]
    target_shape: tuple[int, ...]
    target_dtype: str  # "float32" or "int64"
    rows: int
    features: _Source
    targets: _Source

    @property
    def feature_bytes(self) -> int:
        return self.rows * int(np.prod(self.feature_shape, dtype=np.int64)) * 4

    @property
    def target_bytes(self) -> int:
        per_row = int(np.prod(self.target_shape, dtype=np.int64)) if self.target_shape else 1
        return self.rows * per_row * (8 if self.target_dtype == "int64" else 4)

    @property
    def total_bytes(self) -> int:
        return self.feature_bytes + self.target_bytes

    def sha256(self) -> str:
        """The payload's SHA-256 (hex), as the daemon records it: one more pass over the data."""
        digest = hashlib.sha256()
        for _ in self.chunks(digest):
            pass
        return digest.hexdigest()

    def difference(self, existing: datasets_pb2.Dataset) -> str:
        """How the dataset ``existing`` (the daemon's record) differs from this payload: "" when
        it holds the same rows, shapes, target dtype and bytes (its SHA-256), else a sentence."""
        ours_dtype = "int64" if self.target_dtype == "int64" else "float32"
        theirs_dtype = {datasets_pb2.DTYPE_INT64: "int64", datasets_pb2.DTYPE_FLOAT32: "float32"}
        header = (
            self.rows,
            self.feature_shape,
            self.target_shape,
            ours_dtype,
        )
        recorded = (
            int(existing.row_count),
            tuple(int(d) for d in existing.feature_shape),
            tuple(int(d) for d in existing.target_shape),
            theirs_dtype.get(existing.target_dtype, "unspecified"),
        )
        if header != recorded:
            return (
                f"it holds {recorded[0]} rows, features {recorded[1]}, targets {recorded[2]} "
                f"{recorded[3]}; this upload {header[0]} rows, features {header[1]}, targets "
                f"{header[2]} {header[3]}"
            )
        digest = self.sha256()
        if digest != existing.sha256:
            return (
                f"the same shapes but other bytes (sha256 {existing.sha256[:12]}... there, "
                f"{digest[:12]}... here)"
            )
        return ""

    def chunks(self, sha256: Any) -> Iterator[memoryview]:
        """The payload in chunks of at most 1 MiB, features then targets, fed to ``sha256``."""
        for source, dtype in (
            (self.features, np.dtype("<f4")),
            (self.targets, np.dtype("<f4" if self.target_dtype == "float32" else "<i8")),
        ):
            for chunk in _chunks_of(source, dtype):
                sha256.update(chunk)
                yield chunk


def _check_shape(label: str, shape: Sequence[int], rows: int) -> None:
    if rows == 0:
        raise ValueError(f"{label} has no rows; a dataset needs at least one")
    if len(shape) > _MAX_DIMS:
        raise ValueError(
            f"{label} has {len(shape)} dimensions per row; trainerd takes at most {_MAX_DIMS}"
        )
    for dim in shape:
        if dim < 1:
            raise ValueError(
                f"{label} has an empty dimension (per-row shape {tuple(shape)}); every "
                "dimension must be at least 1"
            )
        if dim > _MAX_DIMENSION:
            raise ValueError(f"{label}: dimension {dim} is over trainerd's limit of 2^31")


def _effective_target_dtype(given: str | None, targets: _Source | None) -> str:
    """target_dtype when given; else, for separate targets, int64 for an integer array (class
    indices) and float32 otherwise; else (targets in the features' last columns) float32, as
    trainctl."""
    if given is not None:
        return given
    if targets is not None and targets.kind in "iu":
        return "int64"
    return "float32"


def prepare_payload(
    X: Any,
    y: Any = None,
    *,
    target: Any = None,
    target_dtype: object = None,
    target_columns: int | None = None,
) -> Payload:
    """Reads the inputs' figures, decides the layout and checks every value, raising ValueError
    or TypeError before anything is sent."""
    given_dtype = _parse_target_dtype(target_dtype)
    if target_columns is not None and (
        not isinstance(target_columns, int) or isinstance(target_columns, bool)
    ):
        raise TypeError("target_columns must be an int")

    if _is_path(y) and not _is_path(X):
        raise TypeError("y is a path but X is not: give both as .npy files, or both as arrays")

    features: _Source
    targets: _Source
    x_label, y_label = "X", "y"
    csv_classes = False
    if _is_path(X):
        x_label = f"X ({os.fspath(X)})"
        if y is None and Path(X).is_file() and Path(X).suffix.lower() != ".npy":
            csv = _load_csv(Path(X), target_columns, given_dtype)
            array, is_npy, csv_classes = csv.values, False, csv.class_targets
        else:
            array, is_npy = _load_path("X", X)
        if y is not None:
            if not is_npy:
                raise ValueError(f"y needs X as a .npy file too; '{X}' is not")
            if not _is_path(y):
                raise TypeError("X is a .npy path: give y as a .npy path too (or load both)")
            y_label = f"y ({os.fspath(y)})"
            y_array, y_npy = _load_path("y", y)
            if not y_npy:
                raise ValueError(f"y must be a .npy file, not '{y}'")
            X, y = array, y_array
        else:
            X = array

    if target is not None and not _is_frame(X):
        raise TypeError("target= names a column of a pandas DataFrame X; give y= for arrays")

    if _is_frame(X):
        if y is not None and target is not None:
            raise TypeError("give either y= or target=, not both")
        if y is None and target is None:
            raise ValueError("give target='column' (the target column of the DataFrame) or y=")
        if target_columns is not None:
            raise TypeError(
                "target_columns applies to arrays without y; name the columns with target="
            )
        if target is not None:
            names = list(target) if isinstance(target, (list, tuple)) else [target]
            missing = [n for n in names if n not in X.columns]
            if missing:
                raise ValueError(f"target: no column {missing[0]!r} in the DataFrame")
            index_column = _frame_index_column(X)
            if index_column in names:
                index_column = None
            if index_column is not None:
                _warn_frame_index(index_column)
            feature_names = [c for c in X.columns if c not in names and c != index_column]
            if not feature_names:
                raise ValueError("the DataFrame has no feature columns besides the target")
            features = _FrameSource("X", X, feature_names)
            target_source: _Source = _FrameSource("X", X, names)
            dtype = _effective_target_dtype(given_dtype, target_source)
            if dtype == "int64" and len(names) != 1:
                raise ValueError(
                    f"int64 targets take one column (a class index), got {len(names)}"
                )
            targets = _ScalarView(target_source) if dtype == "int64" else target_source
            return _finish(features, targets, dtype)
        index_column = _frame_index_column(X)
        if index_column is not None:
            _warn_frame_index(index_column)
        features = _FrameSource("X", X, [c for c in X.columns if c != index_column])
    elif X is not None and not _is_path(X):
        features = _array_source(x_label, X)
    else:
        raise TypeError("X is required")

    if y is None:
        # The last target_columns columns of a 2-D X are the targets (trainctl's rule for CSV and
        # a single .npy file).
        k = 1 if target_columns is None else target_columns
        if k < 1:
            raise ValueError(f"target_columns must be at least 1, got {k}")
        if len(features.shape) != 2:
            raise ValueError(
                f"without y, X must be 2-D (rows, columns) with the targets in its last "
                f"{'column' if k == 1 else f'{k} columns'}; its shape is {features.shape}"
            )
        columns = features.shape[1]
        if columns <= k:
            raise ValueError(
                f"X has {columns} column{'s' if columns != 1 else ''}; with {k} "
                f"column{'s' if k != 1 else ''} of targets it needs at least {k + 1}"
            )
        dtype = given_dtype or ("int64" if csv_classes else "float32")
        if dtype == "int64" and k != 1:
            raise ValueError(
                f"int64 targets take one column (a class index), got target_columns={k}"
            )
        base_x, base_t = _split(features, columns - k)
        targets = _ScalarView(base_t) if dtype == "int64" else base_t
        return _finish(base_x, targets, dtype)

    if target_columns is not None:
        raise TypeError("target_columns applies without y (every column of X is a feature with y)")
    if _is_series(y):
        target_source = _FrameSource("y", y.to_frame(), [y.name if y.name is not None else 0])
    elif _is_frame(y):
        target_source = _FrameSource("y", y, list(y.columns))
    else:
        target_source = _array_source(y_label, y)
    if len(features.shape) == 0:
        raise ValueError("X is a scalar; give one row of features per example")
    if len(target_source.shape) == 0:
        raise ValueError("y is a scalar; give one target per row")
    dtype = _effective_target_dtype(given_dtype, target_source)
    if len(features.shape) == 1:
        features = _Reshaped(features)
    if len(target_source.shape) == 1:
        targets = target_source if dtype == "int64" else _Reshaped(target_source)
    elif (
        isinstance(target_source, _FrameSource)
        and target_source.shape[1] == 1
        and dtype == "int64"
    ):
        targets = _ScalarView(target_source)  # one int64 column: a class index per row
    else:
        targets = target_source
    if features.rows != targets.rows:
        raise ValueError(
            f"X has {features.rows} rows but y has {targets.rows}; they must have one target "
            "row per feature row"
        )
    return _finish(features, targets, dtype)


def _warn_frame_index(column: str) -> None:
    warnings.warn(
        f"the DataFrame's first column {column!r} holds distinct whole numbers: the index "
        "DataFrame.to_csv wrote, read back by pd.read_csv. It was dropped, not uploaded as a "
        "feature; read the file with pd.read_csv(path, index_col=0), or write it with "
        "index=False",
        UserWarning,
        stacklevel=4,
    )


def _split(features: _Source, split: int) -> tuple[_Source, _Source]:
    """The first ``split`` columns and the rest of a 2-D numpy or torch source."""
    if isinstance(features, _NumpySource):
        array = features._array  # noqa: SLF001
        return (
            _NumpySource(features.label, array, slice(0, split)),
            _NumpySource(features.label, array, slice(split, None)),
        )
    if isinstance(features, _TorchSource):
        tensor = features._tensor  # noqa: SLF001
        return (
            _TorchSource(features.label, tensor, slice(0, split)),
            _TorchSource(features.label, tensor, slice(split, None)),
        )
    raise TypeError(f"cannot split {features.label} into features and targets")


def _finish(features: _Source, targets: _Source, dtype: str) -> Payload:
    if len(features.shape) == 0:
        raise ValueError("X is a scalar; give one row of features per example")
    if len(targets.shape) == 0:
        raise ValueError("y is a scalar; give one target per row")
    rows = features.rows
    _check_shape("X", features.shape[1:], rows)
    if targets.rows != rows:
        raise ValueError(f"X has {rows} rows but y has {targets.rows}")
    if targets.shape[1:]:
        _check_shape("y", targets.shape[1:], rows)
    _check_source(features, np.dtype("<f4"))
    _check_source(targets, np.dtype("<f4" if dtype == "float32" else "<i8"))
    return Payload(
        feature_shape=tuple(features.shape[1:]),
        target_shape=tuple(targets.shape[1:]),
        target_dtype=dtype,
        rows=rows,
        features=features,
        targets=targets,
    )
