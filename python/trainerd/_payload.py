"""An upload's payload: the inputs' layout decided (trainctl's rules), every value checked before
the first byte is sent, and the bytes produced in chunks of at most 1 MiB without a second copy
of the data.

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
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trainerd import _caller
from trainerd._files import frame_index_column, load_csv, load_path
from trainerd._sources import (
    FrameSource,
    Reshaped,
    ScalarView,
    Source,
    array_source,
    convert_block,
    is_frame,
    is_path,
    is_series,
    rows_per_block,
    split_columns,
)
from trainerd.v1 import datasets_pb2

__all__ = ["CHUNK_BYTES", "Payload", "prepare_payload"]

#: Payload bytes per UploadDatasetRequest chunk: the daemon's limit.
CHUNK_BYTES = 1 << 20
_MAX_DIMS = 8
_MAX_DIMENSION = 1 << 31
_INT64_MAX = np.iinfo(np.int64).max
_EXAMPLES = 5


class _Problems:
    """The bad values found while checking a source: how many rows, and the first few."""

    def __init__(self, source: Source, what: str) -> None:
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


def _check_source(source: Source, out: np.dtype[Any]) -> None:
    """Reads the whole source once, a block at a time, and raises ValueError naming the rows
    that cannot be sent: NaN or infinite values, values that do not fit float32, or int64
    targets that are not whole numbers."""
    step = rows_per_block(source, out.itemsize)
    if out.kind == "f":
        problems = _Problems(source, "NaN or infinite values (or values beyond float32's range)")
        for start in range(0, source.rows, step):
            block = source.block(start, min(start + step, source.rows))
            if source.kind in "biu":
                continue  # integers and booleans are always finite in float32
            converted = convert_block(block, out)
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


def _chunks_of(source: Source, out: np.dtype[Any]) -> Iterator[memoryview]:
    """The source's bytes as ``out``, in pieces of at most CHUNK_BYTES. A C-contiguous array
    already of ``out`` is sliced in place; anything else is converted a block at a time."""
    step = rows_per_block(source, out.itemsize)
    for start in range(0, source.rows, step):
        block = convert_block(source.block(start, min(start + step, source.rows)), out)
        view = block.data.cast("B")
        for offset in range(0, len(view), CHUNK_BYTES):
            yield view[offset : offset + CHUNK_BYTES]


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


@dataclasses.dataclass
class Payload:
    """A checked upload: the header's figures and the sources of its bytes."""

    feature_shape: tuple[int, ...]
    target_shape: tuple[int, ...]
    target_dtype: str  # "float32" or "int64"
    rows: int
    features: Source
    targets: Source

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


def _effective_target_dtype(given: str | None, targets: Source | None) -> str:
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

    if is_path(y) and not is_path(X):
        raise TypeError("y is a path but X is not: give both as .npy files, or both as arrays")

    features: Source
    targets: Source
    x_label, y_label = "X", "y"
    csv_classes = False
    if is_path(X):
        x_label = f"X ({os.fspath(X)})"
        if y is None and Path(X).is_file() and Path(X).suffix.lower() != ".npy":
            csv = load_csv(Path(X), target_columns, given_dtype)
            array, is_npy, csv_classes = csv.values, False, csv.class_targets
        else:
            array, is_npy = load_path("X", X)
        if y is not None:
            if not is_npy:
                raise ValueError(f"y needs X as a .npy file too; '{X}' is not")
            if not is_path(y):
                raise TypeError("X is a .npy path: give y as a .npy path too (or load both)")
            y_label = f"y ({os.fspath(y)})"
            y_array, y_npy = load_path("y", y)
            if not y_npy:
                raise ValueError(f"y must be a .npy file, not '{y}'")
            X, y = array, y_array
        else:
            X = array

    if target is not None and not is_frame(X):
        raise TypeError("target= names a column of a pandas DataFrame X; give y= for arrays")

    if is_frame(X):
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
            index_column = frame_index_column(X)
            if index_column in names:
                index_column = None
            if index_column is not None:
                _warn_frame_index(index_column)
            feature_names = [c for c in X.columns if c not in names and c != index_column]
            if not feature_names:
                raise ValueError("the DataFrame has no feature columns besides the target")
            features = FrameSource("X", X, feature_names)
            target_source: Source = FrameSource("X", X, names)
            dtype = _effective_target_dtype(given_dtype, target_source)
            if dtype == "int64" and len(names) != 1:
                raise ValueError(
                    f"int64 targets take one column (a class index), got {len(names)}"
                )
            targets = ScalarView(target_source) if dtype == "int64" else target_source
            return _finish(features, targets, dtype)
        index_column = frame_index_column(X)
        if index_column is not None:
            _warn_frame_index(index_column)
        features = FrameSource("X", X, [c for c in X.columns if c != index_column])
    elif X is not None and not is_path(X):
        features = array_source(x_label, X)
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
        base_x, base_t = split_columns(features, columns - k)
        targets = ScalarView(base_t) if dtype == "int64" else base_t
        return _finish(base_x, targets, dtype)

    if target_columns is not None:
        raise TypeError("target_columns applies without y (every column of X is a feature with y)")
    if is_series(y):
        target_source = FrameSource("y", y.to_frame(), [y.name if y.name is not None else 0])
    elif is_frame(y):
        target_source = FrameSource("y", y, list(y.columns))
    else:
        target_source = array_source(y_label, y)
    if len(features.shape) == 0:
        raise ValueError("X is a scalar; give one row of features per example")
    if len(target_source.shape) == 0:
        raise ValueError("y is a scalar; give one target per row")
    dtype = _effective_target_dtype(given_dtype, target_source)
    if len(features.shape) == 1:
        features = Reshaped(features)
    if len(target_source.shape) == 1:
        targets = target_source if dtype == "int64" else Reshaped(target_source)
    elif (
        isinstance(target_source, FrameSource)
        and target_source.shape[1] == 1
        and dtype == "int64"
    ):
        targets = ScalarView(target_source)  # one int64 column: a class index per row
    else:
        targets = target_source
    if features.rows != targets.rows:
        raise ValueError(
            f"X has {features.rows} rows but y has {targets.rows}; they must have one target "
            "row per feature row"
        )
    return _finish(features, targets, dtype)


def _warn_frame_index(column: str) -> None:
    _caller.warn(
        f"the DataFrame's first column {column!r} holds distinct whole numbers: the index "
        "DataFrame.to_csv wrote, read back by pd.read_csv. It was dropped, not uploaded as a "
        "feature; read the file with pd.read_csv(path, index_col=0), or write it with "
        "index=False"
    )


def _finish(features: Source, targets: Source, dtype: str) -> Payload:
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
