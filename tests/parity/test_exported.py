"""Users' own modules as exported programs (torch.export, trained in trainerd's sandboxed worker on
the interpreter of server/engine/training/exported_program.h): each model's per-epoch losses,
validation losses and trained parameters against the eager module trained by the plain PyTorch
loop of reference_loop.py. Dropout's masks come from the job's generator (docs/TRAINING.md): the
reference draws them as trainerd documents (reference_model.SeededDropout). Validation runs each model in evaluation mode (batch norm on its running statistics),
as module.eval() does."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn

import reference_loop


class Mlp(nn.Module):
    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 16)
        self.bn = nn.BatchNorm1d(16)
        self.drop = nn.Dropout(p)
        self.l2 = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(self.drop(torch.relu(self.bn(self.l1(x)))))


class Cnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(1, 4, 3, padding=1)
        self.c2 = nn.Conv2d(4, 8, 3, padding=1)
        self.drop = nn.Dropout(0.0)
        self.fc = nn.Linear(8 * 2 * 2, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.c1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.c2(x)), 2)
        return self.fc(self.drop(torch.flatten(x, 1)))


class Lstm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(4, 12, batch_first=True)
        self.fc = nn.Linear(12, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.fc(out[:, -1])


class Transformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.fc = nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.enc(x).mean(dim=1))


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.l2 = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(torch.relu(self.norm(x + self.l1(x))))


def check_module(parity, dataset: str, module: nn.Module, what: str,
                 seeded_dropout: bool = False, **spec):
    x, y = parity.data(dataset)
    spec = dict(dict(lr=0.05, seed=7, epochs=3, batch_size=16), **spec)
    want = reference_loop.train(spec, x, y, module=copy.deepcopy(module),
                                seeded_dropout=seeded_dropout)
    job = parity.run(dataset, "auto", dict(spec, model=module))
    assert job.spec.model.startswith("exported ("), job.spec.model
    parity.compare(job if job.parameters else FromDownload(job), want, 1e-5, what)
    return job


class FromDownload:
    """A job whose parameters are too many to be reported (Job.parameters): its trained
    parameters read from the downloaded .pt2 instead."""

    def __init__(self, job) -> None:
        self._job = job
        program = torch.export.load(io.BytesIO(job.model_bytes()))
        names = {n for n, _ in program.module().named_parameters()}
        self.parameters = {
            n: t.detach().numpy() for n, t in program.state_dict.items() if n in names
        }

    def __getattr__(self, name):
        return getattr(self._job, name)


def test_mlp_with_batch_norm_validates_in_evaluation_mode(parity):
    torch.manual_seed(3)
    check_module(parity, "classes", Mlp(), "exported MLP with batch norm",
                 loss="cross_entropy", momentum=0.5, validation_fraction=0.25)


def test_cnn_with_max_pool(parity):
    torch.manual_seed(4)
    check_module(parity, "digits", Cnn(), "exported CNN", loss="cross_entropy",
                 validation_fraction=0.25)


def test_lstm_with_a_linear_head(parity):
    torch.manual_seed(5)
    check_module(parity, "sequences", Lstm(), "exported LSTM", optimizer="adam", lr=0.01)


def test_transformer_encoder_layer(parity):
    torch.manual_seed(6)
    # SGD, not Adam: the key projection's bias has an analytically zero gradient (softmax is
    # shift-invariant), so Adam's normalised step follows that gradient's float32 rounding noise,
    # which differs between any two kernels; SGD compares the arithmetic itself.
    check_module(parity, "tokens", Transformer(), "exported TransformerEncoderLayer",
                 loss="cross_entropy", momentum=0.9, lr=0.05, validation_fraction=0.25)


def test_residual_block_with_layer_norm(parity):
    torch.manual_seed(8)
    check_module(parity, "regression", Residual(), "exported residual block",
                 schedule="cosine", weight_decay=0.01)


def test_dropout_draws_from_the_jobs_generator(parity):
    # x * mask / (1 - p), mask ~ Bernoulli(1 - p) drawn from the job's generator after the
    # epoch's permutation, as a spec's dropout layer; validation runs without it.
    torch.manual_seed(3)
    job = check_module(parity, "classes", Mlp(0.25), "exported MLP with dropout 0.25",
                       loss="cross_entropy", validation_fraction=0.25, seeded_dropout=True)
    other = parity.run("classes", "auto", dict(lr=0.05, momentum=0.5, seed=8, epochs=3,
                                               batch_size=16, validation_fraction=0.25,
                                               loss="cross_entropy", model=Mlp(0.25)))
    assert [e.loss for e in job.history] != [e.loss for e in other.history]


def test_the_downloaded_program_is_the_trained_model_in_evaluation_mode(parity):
    # torch.export.load of the download, switched to evaluation as trainerd validates, gives the
    # job's last validation loss on its held-out rows.
    x, y = parity.data("classes")
    torch.manual_seed(3)
    job = parity.run("classes", "auto", dict(lr=0.05, seed=7, epochs=2, batch_size=16,
                                             loss="cross_entropy", validation_fraction=0.25,
                                             model=Mlp(0.5)))
    model = job.model()
    held_out = job.validation_rows(x.shape[0])
    with torch.no_grad():
        logits = model(torch.from_numpy(x[held_out]))
        loss = nn.functional.cross_entropy(logits, torch.from_numpy(y[held_out])).item()
    assert loss == pytest.approx(job.history[-1].validation_loss, rel=1e-5)
    assert job.model_bytes()[:2] == b"PK"


def test_bf16_autocast_reaches_the_programs_operators(parity):
    # The interpreter's calls go through LibTorch's dispatcher, autocast included: the same
    # operators run in bfloat16 as under torch.autocast in the eager module.
    torch.manual_seed(8)
    check_module(parity, "regression", Residual(), "exported residual block in bf16",
                 precision="bf16")


def test_the_best_epoch_is_handed_back(parity):
    # The best validation epoch's weights (parameters and batch norm's buffers) are copied aside
    # at each improvement and handed back, as for a spec's model (docs/TRAINING.md).
    torch.manual_seed(3)
    job = check_module(parity, "classes", Mlp(), "exported MLP, the best epoch handed back",
                       loss="cross_entropy", lr=0.3, momentum=0.9, epochs=8,
                       validation_fraction=0.25, model_from="best")
    assert 1 <= job.model_epoch <= 8
    assert job.model_epoch == job.best_epoch
