"""The client of trainerd: :class:`Client`."""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import math
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Union

from google.protobuf.message import Message

from trainerd import _health
from trainerd._optional import torch_mismatch, warn_torch_mismatch
from trainerd._progress import Progress, ProgressArg, make_progress
from trainerd._spec import (
    MAX_SWEEP_MEMBERS,
    OPTION_NAMES,
    SweepOptions,
    build_spec,
    model_argument,
    sweep_values,
)
from trainerd._transport import Transport
from trainerd._upload import Payload, RawChunk, prepare_payload, validate_dataset_name
from trainerd._version import __version__
from trainerd.config import Settings, resolve_settings
from trainerd.datasets import Dataset
from trainerd.errors import (
    AlreadyExists,
    IncompatibleDaemon,
    NotFound,
    TrainerdError,
    Unimplemented,
)
from trainerd.jobs import Job, JobState
from trainerd.sweeps import Sweep
from trainerd.v1 import datasets_pb2, jobs_pb2, system_pb2

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["Client", "Version", "MIN_DAEMON_VERSION"]

_DATASETS = "/trainerd.v1.DatasetService/"
_JOBS = "/trainerd.v1.JobService/"
_SYSTEM = "/trainerd.v1.SystemService/"

#: trainctl's default call deadline (client/cli.h, kDefaultTimeout), seconds.
DEFAULT_TIMEOUT = 30.0
#: Uploads may move gigabytes: their deadline is at least this (client/connection.h).
UPLOAD_TIMEOUT = 600.0
#: Diagnose measures every device on first use: a longer default deadline.
DIAGNOSE_TIMEOUT = 120.0
#: The oldest daemon this client works with. The daemon's API is package trainerd.v1; its
#: VersionInfo carries trainerd's version (no separate API version), so compatibility is judged
#: from that: the same major version, and at least this one.
MIN_DAEMON_VERSION = (0, 1, 0)

_LIST_PAGE = 1000  # the daemon's largest ListJobs page

DatasetArg = Union[str, Dataset]


@dataclasses.dataclass(frozen=True)
class Version:
    """What :meth:`Client.version` reports: the daemon's versions and this package's."""

    trainerd: str
    libtorch: str
    cuda: str  # "" for a CPU-only LibTorch
    driver: str  # "" without a driver or NVML
    client: str = __version__


def _parse_version(text: str) -> tuple[int, int, int] | None:
    match = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _serialize_upload(item: Message | RawChunk) -> bytes:
    """UploadDatasetRequest: the header and trailer as messages; a chunk written by hand (field 2,
    bytes) straight from the array's memory."""
    if isinstance(item, RawChunk):
        return b"".join((b"\x12", _varint(len(item.data)), item.data))
    return item.SerializeToString()


def _dataset_name(dataset: DatasetArg) -> str:
    return dataset.name if isinstance(dataset, Dataset) else dataset


class Client:
    """A connection to one trainerd daemon.

    The address and credentials are decided as trainctl decides them: the arguments, then
    ``$TRAINERD_ADDR`` and ``$TRAINERD_TOKEN``, then trainctl's contexts file
    (``context=NAME``, or its current context when no address was chosen), then
    ``127.0.0.1:50051`` (see :mod:`trainerd.config`). Nothing connects until the first call, which
    also checks once that the daemon speaks this client's API.

    Example::

        import trainerd
        client = trainerd.Client("127.0.0.1:50051")
        ds = client.upload("houses", X, y)
        job = client.submit(ds, model="linear:64,relu,linear:1", epochs=20).wait()
        model = job.model()

    Args:
        address: the daemon's gRPC address, "HOST:PORT" or "unix:PATH"; "HOST" alone dials
            port 50051, trainctl's default.
        context: a context of trainctl's config file.
        token: the bearer token (else ``token_file``, the context's, ``$TRAINERD_TOKEN``).
        token_file: a file holding it (as trainerd's token files: "NAME:TOKEN" lines allowed).
        tls_ca, tls_cert, tls_key: PEM files: the CA that signed the daemon's certificate, and a
            client certificate and key for mutual TLS. Any TLS setting turns TLS on.
        tls_server_name: the name to check the daemon's certificate against.
        timeout: the deadline of each unary call, in seconds (uploads and downloads get at least
            10 minutes; watching and waiting have none unless asked).
        check_version: check the daemon's version on the first call.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        context: str | None = None,
        token: str | None = None,
        token_file: str | os.PathLike[str] | None = None,
        tls_ca: str | os.PathLike[str] | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
        tls_server_name: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        check_version: bool = True,
    ) -> None:
        _check_timeout(timeout)
        self.settings: Settings = resolve_settings(
            address,
            context=context,
            token=token,
            token_file=token_file,
            tls_ca=tls_ca,
            tls_cert=tls_cert,
            tls_key=tls_key,
            tls_server_name=tls_server_name,
        )
        self._transport = Transport(self.settings, float(timeout))
        self._check_version = check_version
        self._compatible: Version | None = None
        self._torch_checked = False

    # --- Connection ------------------------------------------------------------------------

    @property
    def address(self) -> str:
        """The address the client talks to."""
        return self.settings.address

    @property
    def timeout(self) -> float:
        return self._transport.timeout

    @property
    def channel(self) -> Any:
        """The grpc.Channel, for calls this class does not make (the token is not added to
        them: pass ``metadata=client.metadata``)."""
        return self._transport.channel

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The metadata every call carries (the bearer token, when there is one)."""
        return self._transport.metadata

    def close(self) -> None:
        """Closes the channel."""
        self._transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        how = f", context={self.settings.context!r}" if self.settings.context else ""
        tls = ", tls=True" if self.settings.use_tls else ""
        return f"Client(address={self.address!r}{how}{tls})"

    def _ensure_compatible(self) -> None:
        """Checks once (on the first call) that the daemon speaks this client's API."""
        if not self._check_version or self._compatible is not None:
            return
        # Two threads may both ask on the first call; the answer is the same.
        self._compatible = self._check_daemon()

    def _check_daemon(self) -> Version:
        try:
            info = self._transport.unary(
                _SYSTEM + "GetVersion", system_pb2.GetVersionRequest(), system_pb2.VersionInfo
            )
        except Unimplemented as e:
            raise not_trainerd(self.address, e) from None
        return checked_version(info, self.address)

    def _check_torch(self, stacklevel: int) -> None:
        """Warns once (a UserWarning naming both versions) when the torch this process imported
        and the daemon's LibTorch differ in major.minor version: called where a TorchScript module
        or an exported program moves between them (an archive one writes may not load, or load
        differently, in the other). Nothing without torch imported."""
        if self._torch_checked or "torch" not in sys.modules:
            return
        self._torch_checked = True
        warn_torch_mismatch(torch_mismatch(self.version().libtorch), stacklevel + 1)

    def _unary(self, method: str, request: Message, response_type: Any, **kwargs: Any) -> Any:
        self._ensure_compatible()
        return self._transport.unary(method, request, response_type, **kwargs)

    # --- System ----------------------------------------------------------------------------

    def version(self) -> Version:
        """The daemon's version and the LibTorch, CUDA and driver versions it runs on
        (GetVersion)."""
        self._ensure_compatible()
        if self._compatible is not None:
            return self._compatible
        info = self._transport.unary(
            _SYSTEM + "GetVersion", system_pb2.GetVersionRequest(), system_pb2.VersionInfo
        )
        return version_of(info)

    def devices(self) -> list[system_pb2.DeviceStatus]:
        """Every device with its utilization, memory, resident datasets and jobs (ListDevices;
        trainerd.v1.DeviceStatus messages)."""
        response = self._unary(
            _SYSTEM + "ListDevices", system_pb2.ListDevicesRequest(), system_pb2.ListDevicesResponse
        )
        return list(response.devices)

    def diagnose(
        self, *, refresh: bool = False, timeout: float | None = None
    ) -> system_pb2.DiagnoseResponse:
        """The seed's checks of every device: matrix-product peak, host-to-device bandwidth,
        launch and sync costs (Diagnose; a few seconds on first use, cached afterwards unless
        ``refresh``)."""
        deadline = timeout if timeout is not None else max(DIAGNOSE_TIMEOUT, self.timeout)
        response: system_pb2.DiagnoseResponse = self._unary(
            _SYSTEM + "Diagnose",
            system_pb2.DiagnoseRequest(refresh=refresh),
            system_pb2.DiagnoseResponse,
            timeout=deadline,
        )
        return response

    def health(self, service: str = "") -> str:
        """The standard gRPC health check (grpc.health.v1.Health/Check, which needs no token):
        "SERVING", "NOT_SERVING", "UNKNOWN" or "SERVICE_UNKNOWN". ``service`` "" asks about the
        whole server. Unavailable when the daemon cannot be reached."""
        return _health.check(self._transport, service)

    # --- Datasets --------------------------------------------------------------------------

    def upload(
        self,
        name: str,
        X: Any,
        y: Any = None,
        *,
        target: Any = None,
        target_dtype: object = None,
        target_columns: int | None = None,
        progress: ProgressArg = None,
        timeout: float | None = None,
        exist_ok: bool = False,
        overwrite: bool = False,
    ) -> Dataset:
        """Uploads a dataset and returns it once the daemon registered it (UploadDataset).

        ``X`` is a numpy array, a torch tensor (CPU or CUDA: copied to the host a block at a
        time), a pandas DataFrame (with ``target=`` naming the target column(s), or ``y=``), or
        the path of a .npy or .csv file. ``y`` holds the targets (an array, tensor, Series or a
        .npy path); without it, the last ``target_columns`` (default 1) columns of a 2-D ``X``
        are the targets, as trainctl reads CSV files.

        Features are sent as float32. Targets are int64 class indices when ``y`` holds integers
        (or ``target_dtype="int64"``), float32 otherwise; a 1-D int64 ``y`` is one scalar per row.

        Every value is checked before anything is sent: NaN or infinite values (the rows are
        named), object or string dtypes, empty arrays and row counts that differ raise
        ValueError or TypeError. The payload is then streamed in 1 MiB chunks straight from the
        array (a C-contiguous array is never copied whole; other layouts are converted a block
        at a time) with its SHA-256, which the daemon verifies.

        ``progress``: None shows a tqdm bar when tqdm is installed and stderr is a terminal or
        this runs in Jupyter; True or False force it; a callable gets (bytes sent, total).

        A name already taken raises :class:`AlreadyExists`, unless: ``exist_ok=True``, which
        returns the dataset there when it holds the same rows, shapes, target dtype and bytes
        (its SHA-256; nothing is sent) and still raises AlreadyExists, saying how they differ,
        when it does not; or ``overwrite=True``, which deletes it and uploads again (nothing is
        sent either when it already holds the same data). Re-running a notebook cell that
        uploads is then safe.

        A CSV file written by ``DataFrame.to_csv`` without ``index=False`` starts with pandas'
        index, an unnamed column holding 0..n-1: it is dropped, with a warning. A CSV file's
        target column written as whole numbers only (``3``, not ``3.0``), none negative, is
        uploaded as int64 class indices, as that column's integers would be from a DataFrame,
        with a warning (``target_dtype="float32"`` keeps them values to regress on). Without a
        loss, a job then trains with cross_entropy.

        Example::

            ds = client.upload("digits", X_train, y_train)           # int64 y: class indices
            ds = client.upload("houses", df, target="price")
            ds = client.upload("seed", "seed.csv", exist_ok=True)
        """
        validate_dataset_name(name)
        check_replace_flags(exist_ok, overwrite)
        payload = prepare_payload(
            X, y, target=target, target_dtype=target_dtype, target_columns=target_columns
        )
        self._ensure_compatible()
        if exist_ok or overwrite:
            existing = self._existing_dataset(name)
            if existing is not None:
                if keep_existing(name, payload, existing, exist_ok, self.address):
                    return Dataset(self, existing)
                self.delete_dataset(name)
        bar = make_progress(progress, payload.total_bytes, f"upload {name}")
        failure: list[BaseException] = []
        requests = upload_requests(name, payload, bar, failure)
        deadline = timeout if timeout is not None else max(UPLOAD_TIMEOUT, self.timeout)
        try:
            response = self._transport.stream_unary(
                _DATASETS + "UploadDataset",
                requests,
                datasets_pb2.Dataset,
                timeout=deadline,
                serializer=_serialize_upload,
            )
        except TrainerdError:
            # A failure reading the data (a file that changed as it was read) cancels the call;
            # it is the error to report, not gRPC's "cancelled".
            if failure:
                raise failure[0] from None
            raise
        finally:
            bar.close()
        return Dataset(self, response)

    def _existing_dataset(self, name: str) -> datasets_pb2.Dataset | None:
        try:
            proto: datasets_pb2.Dataset = self._unary(
                _DATASETS + "GetDataset",
                datasets_pb2.GetDatasetRequest(name=name),
                datasets_pb2.Dataset,
            )
        except NotFound:
            return None
        return proto

    def datasets(self) -> list[Dataset]:
        """Every dataset the caller may see, sorted by name (ListDatasets): its own by their bare
        names, other owners' (shared with it, or all for an admin) as ``"OWNER/NAME"``."""
        response = self._unary(
            _DATASETS + "ListDatasets",
            datasets_pb2.ListDatasetsRequest(),
            datasets_pb2.ListDatasetsResponse,
        )
        return [Dataset(self, d) for d in response.datasets]

    def dataset(self, name: str) -> Dataset:
        """The dataset called ``name`` (GetDataset): one of the caller's, or ``"OWNER/NAME"`` for
        another owner's. NotFound when there is none, or it is another tenant's and not shared."""
        proto = self._unary(
            _DATASETS + "GetDataset", datasets_pb2.GetDatasetRequest(name=name), datasets_pb2.Dataset
        )
        return Dataset(self, proto)

    def delete_dataset(self, name: DatasetArg) -> None:
        """Deletes a dataset (DeleteDataset)."""
        self._unary(
            _DATASETS + "DeleteDataset",
            datasets_pb2.DeleteDatasetRequest(name=_dataset_name(name)),
            datasets_pb2.DeleteDatasetResponse,
        )

    def share_dataset(self, name: DatasetArg, shared: bool = True) -> Dataset:
        """Lets other tenants' jobs train on a dataset, or stops it (ShareDataset)."""
        proto = self._unary(
            _DATASETS + "ShareDataset",
            datasets_pb2.ShareDatasetRequest(name=_dataset_name(name), shared=shared),
            datasets_pb2.Dataset,
        )
        return Dataset(self, proto)

    # --- Jobs ------------------------------------------------------------------------------

    def submit(
        self,
        dataset: DatasetArg,
        *,
        model: Any,
        loss: str | None = None,
        huber_delta: float | None = None,
        label_smoothing: float | None = None,
        class_weights: Sequence[float] | None = None,
        ignore_index: int | None = None,
        pos_weight: Sequence[float] | None = None,
        optimizer: str = "sgd",
        lr: float = 0.01,
        momentum: float | None = None,
        nesterov: bool = False,
        weight_decay: float | None = None,
        beta1: float | None = None,
        beta2: float | None = None,
        eps: float | None = None,
        alpha: float | None = None,
        amsgrad: bool = False,
        centered: bool = False,
        momentum_decay: float | None = None,
        decoupled_weight_decay: bool = False,
        lr_decay: float | None = None,
        initial_accumulator_value: float | None = None,
        weight_decay_exclude_bias_and_norm: bool = False,
        schedule: str = "constant",
        step_epochs: int | None = None,
        gamma: float | None = None,
        min_lr: float | None = None,
        warmup_epochs: int = 0,
        schedule_per_step: bool = False,
        warmup_steps: int | None = None,
        milestones: Sequence[int] | None = None,
        t_0: int | None = None,
        t_mult: int | None = None,
        pct_start: float | None = None,
        anneal_strategy: str | None = None,
        div_factor: float | None = None,
        final_div_factor: float | None = None,
        three_phase: bool = False,
        plateau_factor: float | None = None,
        plateau_patience: int | None = None,
        plateau_threshold: float | None = None,
        plateau_cooldown: int | None = None,
        clip_grad_norm: float = 0.0,
        batch_size: int = 32,
        epochs: int = 10,
        validation_fraction: float = 0.0,
        validation_dataset: str | None = None,
        early_stop_patience: int = 0,
        early_stop_min_delta: float | None = None,
        early_stop_metric: str | None = None,
        model_from: str | None = None,
        gradient_accumulation_steps: int | None = None,
        drop_last: bool = False,
        checkpoint_every: int = 0,
        precision: str = "fp32",
        seed: int | None = None,
        device: str | None = None,
        priority: str = "normal",
        engine: str = "auto",
        max_job_time: float | datetime.timedelta | None = None,
        shuffle: bool = True,
        replicas: int | None = None,
        nodes: Sequence[str] | str | None = None,
        request_id: str | None = None,
    ) -> Job:
        """Submits a training job and returns it, QUEUED (SubmitJob).

        The arguments are trainctl submit's flags with underscores, with its defaults; an
        argument left at None is not sent (the daemon's default applies) and, like a flag not
        given, may not be given where it does not apply (``momentum`` with adam is an error).

        Args:
            dataset: the resident dataset to train on (a name or a :class:`Dataset`): one of the
                caller's, or ``"OWNER/NAME"`` for one another owner shared.
            model: a spec ("linear:64,relu,linear:1"); a ``torch.nn.Module``, exported with
                ``torch.export`` in training mode on an example batch of the dataset's rows (the
                batch dimension dynamic) and trained as an exported program (docs/MODELS.md); a
                ``torch.jit.ScriptModule`` (TorchScript, deprecated by PyTorch); a path to a
                ``.pt2`` (``torch.export.save``) or TorchScript file; or such a file's bytes.
            loss: mse, l1, huber or bce_with_logits (float32 targets shaped like the output),
                cross_entropy or nll (int64 class targets; nll wants log-probabilities). None:
                the daemon picks cross_entropy for int64 targets, mse for float32 ones
                (``job.spec.loss`` says which).
            huber_delta: huber: where the loss turns linear, > 0 (default 1).
            label_smoothing: cross_entropy: 0 <= S < 1 (default 0). Training only: the
                validation loss is without it.
            class_weights: cross_entropy and nll: one positive weight per class, as
                ``torch.nn.CrossEntropyLoss(weight=...)`` (a list, tuple, tensor or array); a
                batch's loss is then ``sum(w[y] * l) / sum(w[y])``. Training only.
            ignore_index: cross_entropy and nll: rows whose target is this value add nothing;
                the loss is the mean over the other rows, and a batch of only ignored rows
                gives 0 rather than PyTorch's NaN. None (the default): no row is ignored;
                PyTorch's -100 is not assumed, so a target outside the classes is refused.
                Validation leaves ignored rows out of its loss and accuracy.
            pos_weight: bce_with_logits: one positive weight per output column on the positive
                targets, as ``torch.nn.BCEWithLogitsLoss(pos_weight=...)``. Training only.
            optimizer: sgd, adam, adamw, rmsprop, nadam, radam or adagrad, each as
                ``torch.optim``'s optimizer of that name with PyTorch's defaults.
            lr: learning rate, > 0; the peak with a schedule.
            momentum: sgd and rmsprop, 0 <= M < 1 (default 0).
            nesterov: sgd: Nesterov momentum (needs momentum above 0).
            weight_decay: L2 penalty, >= 0; decoupled for adamw (default 0, adamw 0.01).
            beta1, beta2: adam, adamw, nadam and radam, 0 <= B < 1 (defaults 0.9 and 0.999).
            eps: every optimizer but sgd, > 0 (default 1e-8, adagrad 1e-10).
            alpha: rmsprop smoothing, 0 < A < 1 (default 0.99).
            amsgrad: adam and adamw: the AMSGrad variant (``torch.optim.Adam(amsgrad=True)``).
            centered: rmsprop: centered (``torch.optim.RMSprop(centered=True)``).
            momentum_decay: nadam: >= 0 (default 0.004).
            decoupled_weight_decay: nadam and radam: weight decay as adamw applies it instead of
                an L2 penalty.
            lr_decay: adagrad: step t's rate is lr / (1 + (t - 1) * lr_decay), >= 0 (default 0).
            initial_accumulator_value: adagrad: the starting squared-gradient sum, >= 0
                (default 0).
            weight_decay_exclude_bias_and_norm: parameters of 1 dimension or fewer (biases,
                batchnorm's and layernorm's weights and biases) get weight decay 0, as the two
                parameter groups ``[{"params": [p for p in model.parameters() if p.dim() > 1]},
                {"params": [p for p in model.parameters() if p.dim() <= 1], "weight_decay":
                0.0}]`` do; needs a weight decay above 0.
            schedule: the learning-rate schedule, each as its torch.optim.lr_scheduler twin
                with PyTorch's defaults, stepped once per epoch (or per optimizer step with
                ``schedule_per_step``): constant; step (StepLR: times ``gamma`` every
                ``step_epochs``); multistep (MultiStepLR: times ``gamma`` at each of
                ``milestones``); exponential (ExponentialLR: times ``gamma`` every epoch);
                cosine (CosineAnnealingLR towards ``min_lr``); cosine_restarts
                (CosineAnnealingWarmRestarts: ``t_0``, ``t_mult``, ``min_lr``); onecycle
                (OneCycleLR with max_lr ``lr`` and total_steps epochs * steps per epoch, always
                per step, cycle_momentum=False: the optimizer's momentum and beta1 stay as set);
                plateau (ReduceLROnPlateau, mode min, on each epoch's validation loss: needs
                validation). ``job.epochs[i].learning_rate`` is the rate of the epoch's first
                step.
            step_epochs: step: epochs (steps when per step) between decays, >= 1 (required).
            gamma: step, multistep and exponential: decay factor, 0 < G <= 1 (default 0.1).
            min_lr: cosine and cosine_restarts: eta_min, the rate the cosine heads for,
                0 <= RATE < lr; as CosineAnnealingLR's, no trained epoch (or step) uses it:
                the last has ``min_lr + (lr - min_lr) * (1 - cos(pi / N)) / 2`` over N epochs.
                plateau: the floor of its reductions, >= 0. Default 0.
            warmup_epochs: ramp the rate up linearly over the first N epochs, epoch e using
                ``lr * e / (N + 1)``, N < epochs; the schedule then runs over the rest (not
                onecycle or plateau, not per step).
            schedule_per_step: advance the schedule every optimizer step instead of every
                epoch (as calling ``scheduler.step()`` after each batch): ``step_epochs``,
                ``milestones``, ``t_0`` and cosine's span count steps (not plateau).
            warmup_steps: per step: ramp the rate up linearly over the first N steps, step k
                using ``lr * k / (N + 1)``; fewer than the job's steps.
            milestones: multistep: the rate is multiplied by ``gamma`` once each of these
                epochs (steps) of the schedule has passed; ascending, >= 1 (required).
            t_0: cosine_restarts: epochs (steps) of the first cycle, >= 1 (required).
            t_mult: cosine_restarts: each cycle this many times longer, >= 1 (default 1).
            pct_start: onecycle: the fraction of the steps raising the rate, 0 <= F <= 1
                (default 0.3).
            anneal_strategy: onecycle: "cos" or "linear" (default "cos").
            div_factor: onecycle: the first rate is ``lr / div_factor``, > 0 (default 25).
            final_div_factor: onecycle: the last step's rate is
                ``lr / div_factor / final_div_factor``, > 0 (default 1e4).
            three_phase: onecycle: up, back down to the first rate, then down to the last.
            plateau_factor: plateau: multiply the rate by F on a plateau, 0 < F < 1
                (default 0.1).
            plateau_patience: plateau: epochs without improvement before a reduction, >= 0
                (default 10).
            plateau_threshold: plateau: a validation loss improves when below
                ``best * (1 - T)``, 0 <= T < 1 (default 1e-4).
            plateau_cooldown: plateau: epochs after a reduction before bad epochs count, >= 0
                (default 0).
            clip_grad_norm: scale gradients down to a global L2 norm of at most N (0: off).
            batch_size: rows per batch (the last batch of an epoch may be shorter).
            epochs: passes over the dataset.
            validation_fraction: hold out this fraction of the rows, 0 <= F < 1 (0: none):
                ``k`` rows, ``F * rows`` in float64 rounded to the nearest integer with halves
                away from zero (C's llround, not Python's ``round()``: 10 rows at 0.25 hold out
                3, not 2),
                the last k of ``torch.randperm(rows, generator=torch.Generator()
                .manual_seed(seed))`` (:meth:`Job.validation_rows` gives them). The validation
                loss each epoch reports is the plain loss, without label_smoothing,
                class_weights or pos_weight, as an eval loop computes it.
            validation_dataset: validate on this resident dataset instead.
            early_stop_patience: stop after N epochs without a better validation metric
                (``early_stop_metric``; the loss by default).
            early_stop_min_delta: with early_stop_patience: an epoch improves only when it
                beats the best by more than this, >= 0 (default 0), as Keras' and Lightning's
                ``EarlyStopping(min_delta=...)``; the best moves only on an improvement.
            early_stop_metric: with early_stop_patience: ``"loss"`` (the validation loss, lower
                is better; the default) or ``"accuracy"`` (the validation accuracy, higher is
                better; cross_entropy and nll only).
            model_from: the weights the job hands back (``job.model()``, ``job.parameters``):
                ``"best"``, the best validation epoch's (by early stopping's metric and
                min_delta; needs validation), as Keras' ``restore_best_weights=True`` and
                Lightning's ``ModelCheckpoint`` keep them, or ``"last"``, the last epoch's.
                None: the best with early_stop_patience, else the last. ``job.model_epoch``
                says which epoch the model is from.
            gradient_accumulation_steps: step the optimizer once per N batches (default 1), as
                PyTorch's usual loop ``(loss / N).backward()`` per batch and
                ``optimizer.step(); optimizer.zero_grad()`` after every N-th batch and after
                the epoch's last: the last group of an epoch may be shorter and its gradients
                are still divided by N. Clipping and fp16's unscaling act on the accumulated
                gradients; ``Job.steps`` counts optimizer steps. Runs on the LibTorch path, on
                one rank.
            drop_last: drop each epoch's last batch when it is shorter than batch_size, as
                ``DataLoader(drop_last=True)``; the epoch loss is then the mean over the rows
                that trained.
            checkpoint_every: save model and optimizer state every N epochs (0: off).
            precision: fp32, bf16 or fp16 (autocast; fp16 adds loss scaling that trains as
                ``torch.amp.GradScaler`` with the optimizer: a step whose gradients overflowed
                changes nothing, step counts included).
            seed: seed for initialisation, the validation split, shuffling and dropout masks
                (default: the daemon picks one and reports it in the job). On the CPU, with
                ``g = torch.Generator().manual_seed(seed)``, each epoch draws
                ``torch.randperm(training_rows, generator=g)`` (when shuffling), then for each
                batch and each dropout layer in order ``torch.empty_like(x).bernoulli_(1 - p,
                generator=g)``, the layer's output being ``x * (mask / (1 - p))``; initial
                weights are ``torch.manual_seed(seed)`` then the layers built in order.
            device: cpu, cuda, cuda:N or auto (default: the daemon's default device).
            priority: high, normal or low.
            engine: auto, fused or libtorch.
            max_job_time: a TorchScript job's time limit, seconds or a timedelta.
            shuffle: reshuffle the rows every epoch (trainctl's ``--no-shuffle`` is
                ``shuffle=False``). False: every epoch takes the training rows in ascending row
                index (with validation_fraction, the split's training rows sorted; validation
                rows sorted too).
            replicas: train on N ranks, data-parallel (CPU ranks): each takes its slice of every
                global batch of ``replicas * batch_size`` rows and the gradients are averaged,
                so the job trains as one rank with batch ``replicas * batch_size`` would
                (``job.ranks`` says where each ran; default 1).
            nodes: with replicas, other daemons (the daemon's ``--peers``, as "host:port") that
                run some of the ranks, round the list after this one; each must hold the dataset.
                ``"all"``: every peer the daemon knows (its ``--peers``, or the group a cluster
                manager started it in).
            request_id: makes a retry safe: a second submit with the same id and the same
                arguments returns the job the first one queued instead of queueing another
                (1 to 128 of ``A-Z a-z 0-9 . _ : -``; a ``str(uuid.uuid4())`` fits). The same id
                with other arguments raises :class:`AlreadyExists`. Kept as long as the job is.

        Example::

            job = client.submit("houses", model="linear:64,relu,linear:1", optimizer="adam",
                                lr=1e-3, epochs=50, validation_fraction=0.2)
        """
        options = {k: v for k, v in locals().items() if k in OPTION_NAMES}
        return self._submit(dataset, model, _given(options), request_id)

    def _submit(
        self, dataset: DatasetArg, model: Any, options: dict[str, Any], request_id: str | None
    ) -> Job:
        def feature_shape() -> Sequence[int]:
            if isinstance(dataset, Dataset):
                return dataset.feature_shape
            return self.dataset(dataset).feature_shape

        request = submit_request(dataset, model, options, feature_shape)
        if request_id is not None:
            request.request_id = request_id
        proto = self._unary(_JOBS + "SubmitJob", request, jobs_pb2.Job)
        if request.torchscript_module or request.exported_program:
            self._check_torch(stacklevel=3)
        return Job(self, proto)

    def job(self, job_id: str) -> Job:
        """The job with id ``job_id`` (GetJob). NotFound when there is none."""
        return Job(self, self._get_job_proto(job_id))

    def _get_job_proto(self, job_id: str) -> jobs_pb2.Job:
        proto: jobs_pb2.Job = self._unary(
            _JOBS + "GetJob", jobs_pb2.GetJobRequest(id=job_id), jobs_pb2.Job
        )
        return proto

    def jobs(
        self,
        state: str | JobState | None = None,
        dataset: DatasetArg | None = None,
        limit: int | None = None,
        sweep: str | None = None,
    ) -> list[Job]:
        """Jobs the caller may see, oldest first, following the daemon's pages (ListJobs, basic
        view: a job's epochs are fetched when asked for). ``state``, ``dataset`` and ``sweep``
        (a sweep's id: its members, in order) filter on the daemon; ``limit`` keeps the newest
        ``limit`` jobs (as trainctl job list --limit)."""
        request = list_jobs_request(state, dataset, limit, sweep)
        found: list[jobs_pb2.Job] = []
        while True:
            request.page_size = page_size(len(found), limit)
            page = self._unary(_JOBS + "ListJobs", request, jobs_pb2.ListJobsResponse)
            found.extend(page.jobs)
            if not page.next_page_token or (limit is not None and len(found) >= limit):
                break
            request.page_token = page.next_page_token
        found = ordered_jobs(found, limit)
        return [Job(self, proto) for proto in found]

    def get_sweep(self, sweep_id: str) -> Sweep:
        """The sweep with id ``sweep_id`` (as :meth:`sweep` returned it, ``Sweep.id``), its
        members in order: how a sweep is picked up again in a new session. NotFound when the
        daemon knows none of its members (another tenant's, deleted, or pruned).

        Example::

            sweep = client.get_sweep("sweep-f6e17bb93128").wait()
            sweep.best()
        """
        members = self.jobs(sweep=sweep_id)
        if not members:
            raise NotFound(f"sweep {sweep_id!r} not found", address=self.address)
        return Sweep(self, sweep_id, members)

    def delete_job(self, job_id: str | Job) -> None:
        """Forgets a job that ended (DeleteJob)."""
        job_id = job_id.id if isinstance(job_id, Job) else job_id
        self._unary(
            _JOBS + "DeleteJob", jobs_pb2.DeleteJobRequest(id=job_id), jobs_pb2.DeleteJobResponse
        )

    # --- Sweeps ----------------------------------------------------------------------------

    def sweep(
        self,
        dataset: DatasetArg,
        *,
        model: str,
        lr: float | list[float] | tuple[float, ...] = 0.01,
        momentum: float | list[float] | tuple[float, ...] | None = None,
        weight_decay: float | list[float] | tuple[float, ...] | None = None,
        seed: int | list[int] | tuple[int, ...] | None = None,
        points: Sequence[Mapping[str, float]] | None = None,
        request_id: str | None = None,
        **options: Unpack[SweepOptions],
    ) -> Sweep:
        """Submits a hyperparameter sweep: one job per combination of the lists (SubmitSweep),
        all QUEUED; members that share the architecture train together as one packed model.

        Or, with ``points``, exactly the members it lists, in order (a random search, or any
        set no product gives): each a mapping of some of ``lr``, ``momentum``,
        ``weight_decay`` and ``seed``; a key left out takes the single value given to that
        argument (``lr``, ``momentum``, ``weight_decay`` and ``seed`` take no lists then).

        ``lr``, ``momentum``, ``weight_decay`` and ``seed`` take one value or a list; the other
        keyword arguments are :meth:`submit`'s and apply to every member. Each value is checked
        as submit checks it; at most 256 members. Without ``seed`` every member gets the same
        seed (one the daemon picks), so members differ only in the swept values. ``model`` must
        be a spec string (a sweep packs its members into one model). ``nodes`` without
        ``replicas`` spreads the members over this daemon and those peers (``"all"``: every
        peer it knows): member m trains here when m % (1 + len(nodes)) is 0, else whole on that
        peer, with the results it would have alone. ``request_id`` makes a retry safe, as for
        :meth:`submit`: the same id and arguments return the sweep the first call queued.

        Example::

            sweep = client.sweep("houses", model="linear:1", lr=[0.1, 0.03, 0.01], seed=[1, 2])
            best = sweep.wait().best()
            rng = random.Random(0)
            search = client.sweep("houses", model="linear:1", seed=1, points=[
                {"lr": 10 ** rng.uniform(-4, -1), "weight_decay": 10 ** rng.uniform(-6, -2)}
                for _ in range(32)])
        """
        request = sweep_request(
            _dataset_name(dataset), model, lr, momentum, weight_decay, seed, dict(options), points
        )
        if request_id is not None:
            request.request_id = request_id
        response = self._unary(_JOBS + "SubmitSweep", request, jobs_pb2.SubmitSweepResponse)
        return Sweep(self, response.sweep_id, [Job(self, m) for m in response.members])


def _check_timeout(timeout: object) -> None:
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not math.isfinite(timeout)
        or not timeout > 0
    ):
        raise ValueError(f"timeout must be a positive, finite number of seconds, got {timeout!r}")


def _given(options: dict[str, Any]) -> dict[str, Any]:
    """The options the caller gave: those not None and not at submit's signature default for the
    options whose mere presence matters (nesterov, amsgrad, centered, decoupled_weight_decay,
    weight_decay_exclude_bias_and_norm, three_phase, schedule_per_step). The others are sent with
    their value."""
    given = {k: v for k, v in options.items() if v is not None}
    for switch in (
        "nesterov",
        "amsgrad",
        "centered",
        "decoupled_weight_decay",
        "weight_decay_exclude_bias_and_norm",
        "three_phase",
        "schedule_per_step",
    ):
        if given.get(switch) is False:
            del given[switch]
    return given


# --- What the synchronous and the asyncio clients share -----------------------------------------


def version_of(info: system_pb2.VersionInfo) -> Version:
    return Version(
        trainerd=info.trainerd_version,
        libtorch=info.libtorch_version,
        cuda=info.cuda_version,
        driver=info.driver_version,
    )


def not_trainerd(address: str, error: TrainerdError) -> IncompatibleDaemon:
    """The error for a server that does not implement GetVersion."""
    return IncompatibleDaemon(
        f"the server at {address} does not serve trainerd's API "
        f"(trainerd.v1.SystemService): {error.details}",
        address=address,
    )


def checked_version(info: system_pb2.VersionInfo, address: str) -> Version:
    """The daemon's version, when this client speaks its API: the same major version and at
    least MIN_DAEMON_VERSION. IncompatibleDaemon otherwise."""
    parsed = _parse_version(info.trainerd_version)
    if parsed is None:
        raise IncompatibleDaemon(
            f"trainerd at {address} reports version {info.trainerd_version!r}, which this "
            f"client ({__version__}) cannot read",
            address=address,
        )
    ours = _parse_version(__version__)
    assert ours is not None
    if parsed[0] != ours[0] or parsed < MIN_DAEMON_VERSION:
        minimum = ".".join(str(v) for v in MIN_DAEMON_VERSION)
        raise IncompatibleDaemon(
            f"trainerd at {address} is version {info.trainerd_version}; this client "
            f"({__version__}) needs a trainerd {ours[0]}.x of at least {minimum}",
            address=address,
        )
    return version_of(info)


def check_replace_flags(exist_ok: object, overwrite: object) -> None:
    for flag, value in (("exist_ok", exist_ok), ("overwrite", overwrite)):
        if not isinstance(value, bool):
            raise TypeError(f"{flag} must be True or False, not {value!r}")
    if exist_ok and overwrite:
        raise ValueError(
            "give exist_ok=True (keep the dataset there when it holds the same data) or "
            "overwrite=True (replace it), not both"
        )


def keep_existing(
    name: str, payload: Payload, existing: datasets_pb2.Dataset, exist_ok: bool, address: str
) -> bool:
    """For an upload with exist_ok or overwrite to a name taken by ``existing``: True when it
    holds the payload's data (the upload has nothing to do), False when it is to be replaced
    (overwrite). AlreadyExists, saying how they differ, for exist_ok and other data."""
    difference = payload.difference(existing)
    if not difference:
        return True
    if exist_ok:
        raise AlreadyExists(
            f"dataset '{name}' exists and holds other data than this upload: {difference}. "
            "Pass overwrite=True to replace it, or upload under another name",
            address=address,
        )
    return False


def upload_requests(
    name: str, payload: Payload, bar: Progress, failure: list[BaseException]
) -> Iterator[Message | RawChunk]:
    """The messages of UploadDataset: the header, the payload's chunks, the SHA-256 trailer. An
    error reading the data is kept in ``failure`` (gRPC then cancels the call)."""
    header = datasets_pb2.DatasetHeader(
        name=name,
        feature_shape=payload.feature_shape,
        target_shape=payload.target_shape,
        target_dtype=(
            datasets_pb2.DTYPE_INT64
            if payload.target_dtype == "int64"
            else datasets_pb2.DTYPE_FLOAT32
        ),
        row_count=payload.rows,
    )
    total = payload.total_bytes
    try:
        yield datasets_pb2.UploadDatasetRequest(header=header)
        digest = hashlib.sha256()
        sent = 0
        for chunk in payload.chunks(digest):
            yield RawChunk(chunk)
            sent += len(chunk)
            bar.update(sent)
        if sent != total:
            raise AssertionError(f"the payload has {sent} bytes, not {total}")
        yield datasets_pb2.UploadDatasetRequest(sha256=digest.hexdigest())
    except GeneratorExit:
        raise
    except BaseException as e:  # reported after gRPC cancels the call
        failure.append(e)
        raise


def list_jobs_request(
    state: str | JobState | None,
    dataset: DatasetArg | None,
    limit: int | None,
    sweep: str | None = None,
) -> jobs_pb2.ListJobsRequest:
    """The first page's request of Client.jobs (page_size is set per page)."""
    request = jobs_pb2.ListJobsRequest()
    if sweep is not None:
        if not isinstance(sweep, str) or not _SWEEP_ID.fullmatch(sweep):
            raise ValueError(
                f"sweep must be a sweep's id such as 'sweep-0123456789ab' (at most 64 letters, "
                f"digits, '_' and '-'), got {sweep!r}"
            )
        request.sweep_id = sweep
    if state is not None:
        try:
            parsed = JobState(str(state).upper().replace("CANCELED", "CANCELLED"))
        except ValueError:
            raise ValueError(
                f"state must be queued, running, succeeded, failed or cancelled, not {state!r}"
            ) from None
        request.state = parsed.to_proto()  # type: ignore[assignment]
    if dataset is not None:
        request.dataset = _dataset_name(dataset)
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a whole number >= 1, got {limit!r}")
        request.newest_first = True
    return request


_SWEEP_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def page_size(found: int, limit: int | None) -> int:
    return _LIST_PAGE if limit is None else min(_LIST_PAGE, limit - found)


def ordered_jobs(found: list[jobs_pb2.Job], limit: int | None) -> list[jobs_pb2.Job]:
    """Oldest first: a limited listing was asked newest first."""
    if limit is None:
        return found
    return list(reversed(found[:limit]))


def sweep_request(
    dataset: str,
    model: object,
    lr: Any,
    momentum: Any,
    weight_decay: Any,
    seed: Any,
    options: dict[str, Any],
    points: Any = None,
) -> jobs_pb2.SubmitSweepRequest:
    """SubmitSweep's request, every member's values checked as submit checks them."""
    if not isinstance(model, str):
        raise TypeError(
            "a sweep trains a model spec (a str such as 'linear:64,relu,linear:1'); "
            "TorchScript modules go to submit() one job at a time"
        )
    for name in ("lr", "momentum", "weight_decay", "seed"):
        if name in options:
            raise TypeError(f"{name} is given twice")
    if points is not None:
        return _points_request(dataset, model, lr, momentum, weight_decay, seed, options, points)
    swept: dict[str, list[Any]] = {"lr": sweep_values("lr", lr)}
    if momentum is not None:
        swept["momentum"] = sweep_values("momentum", momentum)
    if weight_decay is not None:
        swept["weight_decay"] = sweep_values("weight_decay", weight_decay)
    if seed is not None:
        swept["seed"] = sweep_values("seed", seed, whole=True)
    members = 1
    for values in swept.values():
        members *= len(values)
    if members > MAX_SWEEP_MEMBERS:
        factors = " x ".join(f"{len(v)} {k}" for k, v in swept.items() if len(v) > 1)
        raise ValueError(
            f"a sweep has at most {MAX_SWEEP_MEMBERS} members; {factors} make {members}"
        )
    spec_model, module = model_argument(model)
    if module:
        raise TypeError("a sweep trains a model spec; a TorchScript file goes to submit()")
    first = dict(options, **{k: v[0] for k, v in swept.items()})
    spec = build_spec(dataset, spec_model, first, sweep=True)
    # Each further value in place of the first, the others at theirs: the checks that tie two
    # options together (nesterov and the momentum, min_lr and the rate) involve one swept option
    # each, so this covers every member (as trainctl).
    for key, values in swept.items():
        for value in values[1:]:
            build_spec(dataset, spec_model, dict(first, **{key: value}), sweep=True)
    request = jobs_pb2.SubmitSweepRequest(spec=spec)
    request.learning_rates.extend(float(v) for v in swept["lr"])
    if "momentum" in swept:
        request.momenta.extend(float(v) for v in swept["momentum"])
    if "weight_decay" in swept:
        request.weight_decays.extend(float(v) for v in swept["weight_decay"])
    if "seed" in swept:
        request.seeds.extend(int(v) for v in swept["seed"])
    return request


_POINT_KEYS = ("lr", "momentum", "weight_decay", "seed")


def _points_request(
    dataset: str,
    model: str,
    lr: Any,
    momentum: Any,
    weight_decay: Any,
    seed: Any,
    options: dict[str, Any],
    points: Any,
) -> jobs_pb2.SubmitSweepRequest:
    """SubmitSweep's request with points: the members one by one, each checked as submit checks
    its options (as ``trainctl sweep --points``)."""
    if isinstance(points, (str, bytes, Mapping)) or not hasattr(points, "__iter__"):
        raise TypeError("points must be a sequence of mappings such as {'lr': 0.1, 'seed': 1}")
    rows = list(points)
    if not rows:
        raise ValueError("points: give at least one member")
    if len(rows) > MAX_SWEEP_MEMBERS:
        raise ValueError(f"points has {len(rows)} members; a sweep has at most {MAX_SWEEP_MEMBERS}")
    base: dict[str, Any] = dict(options)
    for key, value in (("lr", lr), ("momentum", momentum), ("weight_decay", weight_decay),
                       ("seed", seed)):
        if value is None:
            continue
        if isinstance(value, (list, tuple, range)) or hasattr(value, "__len__"):
            raise ValueError(
                f"points gives each member's values: {key} takes one value with it (the "
                "members' default), not a list"
            )
        base[key] = value
    spec_model, _ = model_argument(model)
    for number, row in enumerate(rows, start=1):
        if not isinstance(row, Mapping):
            raise TypeError(f"points[{number - 1}] must be a mapping, got {type(row).__name__}")
        unknown = sorted(str(k) for k in row if k not in _POINT_KEYS)
        if unknown:
            raise ValueError(
                f"points[{number - 1}]: a point sets lr, momentum, weight_decay and seed, not "
                + ", ".join(unknown)
            )
        try:
            build_spec(dataset, spec_model, dict(base, **row), sweep=True)
        except (TypeError, ValueError) as error:
            raise type(error)(f"points[{number - 1}]: {error}") from None
    # The spec: the options, with the first point's value for each key every point sets (no
    # member takes the option's value then, and it may not suit the others: min_lr above the
    # default rate when every point gives a rate above it).
    everyone = {k: v for k, v in rows[0].items() if all(k in row for row in rows)}
    request = jobs_pb2.SubmitSweepRequest(
        spec=build_spec(dataset, spec_model, dict(base, **everyone), sweep=True)
    )
    for row in rows:
        point = request.points.add()
        if "lr" in row:
            point.learning_rate = float(row["lr"])
        if "momentum" in row:
            point.momentum = float(row["momentum"])
        if "weight_decay" in row:
            point.weight_decay = float(row["weight_decay"])
        if "seed" in row:
            point.seed = int(row["seed"])
    return request


def submit_request(
    dataset: DatasetArg,
    model: object,
    options: dict[str, Any],
    feature_shape: Callable[[], Sequence[int]] | None = None,
) -> jobs_pb2.SubmitJobRequest:
    """``feature_shape``: the dataset's rows, asked only to export a torch.nn.Module."""
    spec_model, module = model_argument(model, feature_shape)
    spec = build_spec(_dataset_name(dataset), spec_model, options)
    if spec_model == "exported":
        return jobs_pb2.SubmitJobRequest(spec=spec, exported_program=module)
    return jobs_pb2.SubmitJobRequest(spec=spec, torchscript_module=module)
