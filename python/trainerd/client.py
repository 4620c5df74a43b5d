"""The synchronous client of trainerd: :class:`Client`, whose every call blocks until the daemon
answered. Each method converts its arguments, runs the operation of the request layer
(:mod:`trainerd._calls`, :mod:`trainerd._submit`, :mod:`trainerd._upload`) on a
:class:`~trainerd._transport.Transport`, and wraps what it returns in this client's
:class:`~trainerd.Dataset`, :class:`~trainerd.Job` and :class:`~trainerd.Sweep`."""

from __future__ import annotations

import datetime
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, Union

from trainerd import _calls, _health, _submit, _upload
from trainerd._calls import DIAGNOSE_TIMEOUT as DIAGNOSE_TIMEOUT  # noqa: PLC0414
from trainerd._connection import DEFAULT_TIMEOUT as DEFAULT_TIMEOUT  # noqa: PLC0414
from trainerd._connection import MIN_DAEMON_VERSION as MIN_DAEMON_VERSION  # noqa: PLC0414
from trainerd._connection import ClientBase, Connection, Version
from trainerd._progress import ProgressArg
from trainerd._rpc import Op
from trainerd.search import Distribution
from trainerd._spec import OPTION_NAMES, SweepOptions, given_options
from trainerd._upload import UPLOAD_TIMEOUT as UPLOAD_TIMEOUT  # noqa: PLC0414
from trainerd._transport import Transport
from trainerd.config import Settings
from trainerd.datasets import Dataset
from trainerd.jobs import Job, JobState
from trainerd.sweeps import Sweep
from trainerd.v1 import system_pb2

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["Client", "Version", "MIN_DAEMON_VERSION"]

P = ParamSpec("P")
T = TypeVar("T")

DatasetArg = Union[str, Dataset]


class Client(ClientBase[Transport]):
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

    def _connect(self, settings: Settings, timeout: float) -> Transport:
        return Transport(settings, timeout)

    def _call(
        self,
        operation: Callable[Concatenate[Connection, P], Op[T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Runs ``operation`` of the request layer, with this client's connection, to its result."""
        return self._transport.run(operation(self._connection, *args, **kwargs))

    # --- Connection ------------------------------------------------------------------------

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

    # --- System ----------------------------------------------------------------------------

    def version(self) -> Version:
        """The daemon's version and the LibTorch, CUDA and driver versions it runs on
        (GetVersion)."""
        return self._call(Connection.version)

    def devices(self) -> list[system_pb2.DeviceStatus]:
        """Every device with its utilization, memory, resident datasets and jobs (ListDevices;
        trainerd.v1.DeviceStatus messages)."""
        return self._call(_calls.devices)

    def diagnose(
        self, *, refresh: bool = False, timeout: float | None = None
    ) -> system_pb2.DiagnoseResponse:
        """The seed's checks of every device: matrix-product peak, host-to-device bandwidth,
        launch and sync costs (Diagnose; a few seconds on first use, cached afterwards unless
        ``refresh``)."""
        return self._call(_calls.diagnose, refresh, timeout)

    def health(self, service: str = "") -> str:
        """The standard gRPC health check (grpc.health.v1.Health/Check, which needs no token):
        "SERVING", "NOT_SERVING", "UNKNOWN" or "SERVICE_UNKNOWN". ``service`` "" asks about the
        whole server. Unavailable when the daemon cannot be reached."""
        return self._transport.run(_health.check(service))

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
        options = (target, target_dtype, target_columns, progress, timeout, exist_ok, overwrite)
        return Dataset(self, self._call(_upload.upload, name, X, y, *options))

    def datasets(self) -> list[Dataset]:
        """Every dataset the caller may see, sorted by name (ListDatasets): its own by their bare
        names, other owners' (shared with it, or all for an admin) as ``"OWNER/NAME"``."""
        return [Dataset(self, d) for d in self._call(_calls.datasets)]

    def dataset(self, name: str) -> Dataset:
        """The dataset called ``name`` (GetDataset): one of the caller's, or ``"OWNER/NAME"`` for
        another owner's. NotFound when there is none, or it is another tenant's and not shared."""
        return Dataset(self, self._call(_calls.dataset, name))

    def delete_dataset(self, name: DatasetArg) -> None:
        """Deletes a dataset (DeleteDataset)."""
        self._call(_calls.delete_dataset, name)

    def share_dataset(self, name: DatasetArg, shared: bool = True) -> Dataset:
        """Lets other tenants' jobs train on a dataset, or stops it (ShareDataset)."""
        return Dataset(self, self._call(_calls.share_dataset, name, shared))

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
        validation_split_seed: int | None = None,
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

        The arguments are trainctl submit's flags with underscores. An argument left at its
        default is not sent: the daemon applies its own default (``job.spec`` says which), except
        for the optimizer, ``lr``, ``batch_size`` and ``epochs``, which the daemon needs and which
        are sent with trainctl's values (sgd, 0.01, 32, 10). The daemon checks the spec: a value
        out of range, an argument that does not apply (``momentum`` with adam) or that needs
        another (``early_stop_patience`` without validation) raises :class:`InvalidArgument`
        with its sentence. Before anything is sent, this raises TypeError or ValueError only for
        what cannot be written into the request: an unknown argument, a value of the wrong type
        or an unknown name (``optimizer="lbfgs"``), or a value the request would carry as unset
        (``device=""``, ``replicas=0``).

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
            early_stop_metric: with early_stop_patience (or a sweep's ``halving_min_epochs``,
                whose rungs compare it): ``"loss"`` (the validation loss, lower is better; the
                default) or ``"accuracy"`` (the validation accuracy, higher is better;
                cross_entropy and nll only).
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
            validation_split_seed: the seed of the validation split in place of ``seed``, so that
                jobs with different seeds hold out the same rows (a sweep's members all take the
                sweep's seed for it unless it is given).
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
        options = given_options(
            {k: v for k, v in locals().items() if k in OPTION_NAMES}, _submit_defaults()
        )
        return Job(self, self._call(_submit.submit, dataset, model, options, request_id))

    def job(self, job_id: str) -> Job:
        """The job with id ``job_id`` (GetJob). NotFound when there is none."""
        return Job(self, self._call(_calls.job, job_id))

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
        found = self._call(_calls.jobs, state, dataset, limit, sweep)
        return [Job(self, proto) for proto in found]

    def get_sweep(self, sweep_id: str) -> Sweep:
        """The sweep with id ``sweep_id`` (as :meth:`sweep` returned it, ``Sweep.id``), its
        members in order: how a sweep is picked up again in a new session. NotFound when the
        daemon knows none of its members (another tenant's, deleted, or pruned).

        Example::

            sweep = client.get_sweep("sweep-f6e17bb93128").wait()
            sweep.best()
        """
        members = self._call(_calls.get_sweep, sweep_id)
        return Sweep(self, sweep_id, [Job(self, proto) for proto in members])

    def delete_job(self, job_id: str | Job) -> None:
        """Forgets a job that ended (DeleteJob)."""
        self._call(_calls.delete_job, job_id.id if isinstance(job_id, Job) else job_id)

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
        points: Sequence[Mapping[str, Any]] | None = None,
        request_id: str | None = None,
        search: Mapping[str, Distribution] | None = None,
        trials: int | None = None,
        search_seed: int | None = None,
        **options: Unpack[SweepOptions],
    ) -> Sweep:
        """Submits a hyperparameter sweep: one job per combination of the lists (SubmitSweep),
        all QUEUED; members that share the architecture train together as one packed model.

        Or, with ``points``, exactly the members it lists, in order (a random search, or any
        set no product gives): each a mapping of some of ``lr``, ``momentum``,
        ``weight_decay`` and ``seed``, and of ``model`` and any other option of :meth:`submit`
        (``batch_size``, ``epochs``, ``optimizer``, ``schedule``, ``clip_grad_norm``, ...) but
        those of the data and placement (``validation_fraction``, ``validation_dataset``,
        ``device``, ``nodes``, ``replicas``), which are the sweep's; a key left out takes the
        sweep's value (``lr``, ``momentum``, ``weight_decay`` and ``seed`` take no lists then).
        Members whose options differ only in the four swept values train as one pack; the
        others as packs of their own, or alone. Every member validates on the same held-out
        rows (drawn from the sweep's seed), so that members rank fairly.

        Or a random search: ``search`` maps ``model`` and submit()'s options to distributions
        (:mod:`trainerd.search`: ``Uniform``, ``LogUniform``, ``Integer``, ``Choice``), and the
        daemon draws ``trials`` members from them with ``search_seed`` (the same members for the
        same space and seed).

        ``halving_min_epochs`` (and ``halving_reduction_factor``, default 3) stop the poor
        members early, by asynchronous successive halving as Ray Tune's ASHAScheduler does: at
        rungs of min_epochs * factor^k epochs a member behind the best 1/factor of the members
        that reached the rung before it stops there (``job.stopped_early``, ``job.stop_reason``);
        the others go on. :meth:`Sweep.epochs_saved` says what it saved.

        ``lr``, ``momentum``, ``weight_decay`` and ``seed`` take one value or a list; the other
        keyword arguments are :meth:`submit`'s and apply to every member. The daemon checks every
        member as it checks a job submitted alone (:class:`InvalidArgument` names the first that
        fails and its values); at most 256 members. Without ``seed`` every member gets the same
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
            widths = client.sweep("digits", model="linear:32,relu,linear:10", points=[
                {"model": f"linear:{w},relu,linear:10", "batch_size": b}
                for w in (32, 64, 128) for b in (32, 128)])
        """
        request = _submit.sweep_request(
            dataset, model, lr, momentum, weight_decay, seed, options, points, request_id,
            search, trials, search_seed,
        )
        response = self._call(_submit.sweep, request)
        return Sweep(self, response.sweep_id, [Job(self, m) for m in response.members])


def _submit_defaults() -> Mapping[str, Any]:
    """The defaults of :meth:`Client.submit`'s signature: an option left at one is not given."""
    global _SUBMIT_DEFAULTS
    if _SUBMIT_DEFAULTS is None:
        parameters = inspect.signature(Client.submit).parameters
        _SUBMIT_DEFAULTS = {n: parameters[n].default for n in OPTION_NAMES if n in parameters}
    return _SUBMIT_DEFAULTS


_SUBMIT_DEFAULTS: Mapping[str, Any] | None = None
