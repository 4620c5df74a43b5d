"""Files an upload reads as trainctl reads them: a .npy file memory-mapped (read as it is sent),
a CSV file of numbers (an optional header line, blank lines ignored) read whole. And the marks
pandas leaves in such data: the index ``DataFrame.to_csv`` writes as an unnamed first column
(dropped, with a warning), and a target column of whole numbers written as such, which pandas
would read as class labels (sent as int64 class indices, with a warning)."""

from __future__ import annotations

import dataclasses
import os
import re
import warnings
from pathlib import Path
from typing import Any, Union

import numpy as np

from trainerd import _caller

__all__ = ["CsvInput", "PathArg", "frame_index_column", "load_csv", "load_path"]

PathArg = Union[str, "os.PathLike[str]"]


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


def load_path(label: str, value: PathArg) -> tuple[np.ndarray[Any, Any], bool]:
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
class CsvInput:
    """A CSV file's features and targets as an upload takes them: pandas' index column dropped,
    and whether its target column holds class labels."""

    values: np.ndarray[Any, Any]
    class_targets: bool


def load_csv(path: Path, target_columns: int | None, given_dtype: str | None) -> CsvInput:
    table = _read_csv(path)
    first = 0
    if _csv_index_column(table):
        first = 1
        rows = table.values.shape[0]
        _caller.warn(
            f"'{path}' starts with an unnamed column of distinct whole numbers (0 to "
            f"{int(table.values[:, 0].max())} over {rows} rows): the index DataFrame.to_csv "
            "writes unless index=False. It was dropped, not uploaded as a feature; write the "
            "file with df.to_csv(path, index=False) to leave it out"
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
        _caller.warn(
            f"'{path}': its target column{name} holds whole numbers only ({shown}): uploaded as "
            "int64 class indices, as pandas reads such a column, so a job without a loss trains "
            "with cross_entropy (the model needs an output per class). Pass "
            "target_dtype='float32' to regress on them instead"
        )
    return CsvInput(np.ascontiguousarray(values), classes)


def frame_index_column(frame: Any) -> Any:
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
