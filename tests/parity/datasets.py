"""The parity suite's small datasets, fixed by their own seeds (numpy's generator)."""

from __future__ import annotations

import numpy as np


def regression(rows: int = 96) -> tuple[np.ndarray, np.ndarray]:
    """4 features, one float32 target: a noisy linear function with a bend."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((rows, 4)).astype(np.float32)
    w = np.array([[0.5], [-1.0], [2.0], [0.25]], dtype=np.float32)
    y = (x @ w + 0.3 * np.tanh(x[:, :1] * 2) + 0.1 * rng.standard_normal((rows, 1)))
    return x, y.astype(np.float32)


def classes(rows: int = 120) -> tuple[np.ndarray, np.ndarray]:
    """4 features, int64 labels of 3 overlapping Gaussian blobs."""
    rng = np.random.default_rng(12)
    y = rng.integers(0, 3, size=rows, dtype=np.int64)
    centers = np.array([[0, 0, 1, 0], [1.5, 0, 0, 1], [0, 1.5, -1, 0]], dtype=np.float32)
    x = (centers[y] + 0.8 * rng.standard_normal((rows, 4))).astype(np.float32)
    return x, y


def binary(rows: int = 96) -> tuple[np.ndarray, np.ndarray]:
    """4 features, two float32 targets in {0, 1} (two independent labels per row)."""
    rng = np.random.default_rng(13)
    x = rng.standard_normal((rows, 4)).astype(np.float32)
    logits = np.stack([x[:, 0] - x[:, 1], x[:, 2] + 0.5 * x[:, 3]], axis=1)
    y = (logits + 0.5 * rng.standard_normal((rows, 2)) > 0).astype(np.float32)
    return x, y


def images(rows: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """1x6x6 images, int64 labels of 3 classes (where the bright square is)."""
    rng = np.random.default_rng(14)
    y = rng.integers(0, 3, size=rows, dtype=np.int64)
    x = 0.3 * rng.standard_normal((rows, 1, 6, 6)).astype(np.float32)
    for i, label in enumerate(y):
        x[i, 0, 2 * label : 2 * label + 2, 1:5] += 1.0
    return x, y.astype(np.int64)


def regression_validation() -> tuple[np.ndarray, np.ndarray]:
    """A second draw of the regression data's kind, to validate on."""
    x, y = regression(160)
    return x[96:], y[96:]


def classes_ignoring() -> tuple[np.ndarray, np.ndarray]:
    """The classes data with every fifth row's target -100 (PyTorch's usual ignore_index)."""
    x, y = classes()
    y = y.copy()
    y[::5] = -100
    return x, y


def classes_ignored_block() -> tuple[np.ndarray, np.ndarray]:
    """The classes data whose first 16 rows have target -100: unshuffled in batches of 8 or 16,
    whole batches of ignored rows."""
    x, y = classes()
    y = y.copy()
    y[:16] = -100
    return x, y


def digits(rows: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """1x8x8 images, int64 labels of 4 classes (which quadrant is bright)."""
    rng = np.random.default_rng(15)
    y = rng.integers(0, 4, size=rows, dtype=np.int64)
    x = 0.3 * rng.standard_normal((rows, 1, 8, 8)).astype(np.float32)
    for i, label in enumerate(y):
        r, c = 4 * (label // 2), 4 * (label % 2)
        x[i, 0, r : r + 4, c : c + 4] += 1.0
    return x, y


def sequences(rows: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """6 steps of 4 features, one float32 target: a decayed sum of the steps' first feature."""
    rng = np.random.default_rng(16)
    x = rng.standard_normal((rows, 6, 4)).astype(np.float32)
    weights = 0.7 ** np.arange(5, -1, -1, dtype=np.float32)
    y = (x[:, :, 0] @ weights).reshape(rows, 1)
    return x, y.astype(np.float32)


def tokens(rows: int = 48) -> tuple[np.ndarray, np.ndarray]:
    """5 positions of 32 features, int64 labels of 2 classes (the sign of a mean feature)."""
    rng = np.random.default_rng(17)
    x = rng.standard_normal((rows, 5, 32)).astype(np.float32)
    y = (x[:, :, :4].mean(axis=(1, 2)) > 0).astype(np.int64)
    return x, y


ALL = {
    "regression": regression,
    "regression_validation": regression_validation,
    "classes": classes,
    "classes_ignoring": classes_ignoring,
    "classes_ignored_block": classes_ignored_block,
    "binary": binary,
    "images": images,
    "digits": digits,
    "sequences": sequences,
    "tokens": tokens,
}
