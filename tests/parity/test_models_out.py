"""Parity of the trained model a job hands back: its state_dict (safetensors, Job.state_dict) holds
what the PyTorch loop's nn.Sequential.state_dict() holds after the same training, every key in
the same order, batch norm's running statistics and num_batches_tracked included (the reported
parameters leave the buffers out), and it loads into that nn.Sequential."""

from __future__ import annotations

import numpy as np
import pytest

import reference_loop

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")


def check_state_dict(parity, dataset: str, rtol: float = 1e-5, **spec) -> None:
    spec.setdefault("seed", 7)
    (job,) = parity.check(dataset, **spec)
    x, y = parity.data(dataset)
    want = reference_loop.train(dict(spec), x, y, None).state
    got = job.state_dict()
    assert list(got) == list(want)
    for name, w in want.items():
        g = got[name].numpy()
        assert g.dtype == w.dtype, name
        assert g.shape == w.shape, name
        if w.dtype == np.int64:
            assert np.array_equal(g, w), f"{name}: {g} vs {w}"
            continue
        scale = max(float(np.abs(w).max()), 1e-3)
        worst = float(np.abs(g - w).max())
        assert worst <= rtol * scale, f"{name} differs by {worst:.3g} (largest {scale:.3g})"


def test_batchnorm_mlp_state_dict(parity):
    # SGD: the bias of a linear layer before batch norm gets float noise for a gradient, which
    # Adam's normalised step turns into steps of a full learning rate in either direction.
    check_state_dict(parity, "regression", model="linear:8,batchnorm,relu,linear:1",
                     optimizer="sgd", momentum=0.9, lr=0.05, epochs=3, batch_size=16)


def test_cnn_state_dict(parity):
    check_state_dict(parity, "images",
                     model="conv2d:4:3:1:1,batchnorm,relu,maxpool2d:2,flatten,linear:8,layernorm,"
                     "relu,linear:3",
                     loss="cross_entropy", lr=0.05, epochs=2, batch_size=16)
