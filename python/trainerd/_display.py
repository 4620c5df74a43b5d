"""What a job or a sweep shows while it trains and once it ended: a progress bar over epochs
(tqdm), in Jupyter a loss curve redrawn as the epochs arrive (matplotlib, shown through
IPython.display and updated in place), and the HTML tables of ``Job._repr_html_`` and
``Sweep._repr_html_``.

Whether a bar is drawn is decided as for uploads (trainerd._progress.tqdm_class). A curve is
drawn, with ``plot=None``, when the code runs in a Jupyter kernel and matplotlib is installed;
``plot=True`` draws it wherever IPython.display and matplotlib can be imported (a frontend whose
shell is not Jupyter's own, e.g. Colab's), with a warning and no curve when they cannot; ``False``
never. Neither ever raises because an optional package is missing.

What it costs the watch: with ``plot=None`` the curve is live only once a watch has lasted
CURVE_DELAY (a quick job is drawn once, when it ended); matplotlib is imported at the first
frame; frames are throttled (REDRAW_INTERVAL, RENDER_SHARE) and drawn on one figure kept for the
watch. The job's own time is the daemon's (``Job.wall_seconds``), never the drawing.
"""

from __future__ import annotations

import html
import importlib
import importlib.util
import io
import math
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Optional

from trainerd import _progress
from trainerd.v1 import jobs_pb2

if TYPE_CHECKING:
    from trainerd._jobbase import Epoch, JobBase
    from trainerd.sweeps import SweepBase

__all__ = [
    "DisplayArg",
    "JobDisplay",
    "SweepDisplay",
    "job_display",
    "job_html",
    "job_series",
    "sweep_display",
    "sweep_html",
    "sweep_series",
]

#: What ``progress=`` and ``plot=`` of watch and wait take: None (automatic), True or False.
DisplayArg = Optional[bool]

#: Least seconds between two redraws of a curve while epochs arrive (rendering a PNG costs tens
#: of milliseconds; a fast job's epochs come far more often). The last state is always drawn.
REDRAW_INTERVAL = 0.5
#: And at least this many times the last frame's rendering time: drawing takes at most about a
#: fifth of a watch, however slow the machine.
RENDER_SHARE = 4.0
#: With plot=None, no live frame while the watch is younger than this (seconds): a job that ends
#: sooner is drawn once, as it ended.
CURVE_DELAY = 1.0
#: A sweep's curve names its members in a legend up to this many.
MAX_LEGEND = 12

#: One line of a curve: (label, epochs, values, emphasised).
Series = tuple[str, list[int], list[float], bool]


# --- The bar -----------------------------------------------------------------------------------


class _Bar:
    """A tqdm bar over a count (epochs) with a postfix (the latest losses)."""

    def __init__(self, tqdm: Any, total: int, description: str) -> None:
        # In a notebook the finished bar stays as a record of the run; in a terminal it is erased
        # so that a log is not left with a half-drawn line.
        self._bar = tqdm(
            total=total or None,
            desc=description,
            unit="epoch",
            leave=_progress.in_jupyter(),
            dynamic_ncols=True,
        )
        self._count = 0

    def set(self, count: int, postfix: dict[str, str]) -> None:
        self._bar.set_postfix(postfix, refresh=False)
        if count > self._count:
            self._bar.update(count - self._count)
            self._count = count
        else:
            self._bar.refresh()

    def close(self) -> None:
        # tqdm skips redraws closer than its interval: the final count and figures are drawn
        # once before the bar closes (and, outside a notebook, is erased).
        self._bar.refresh()
        self._bar.close()


def _make_bar(progress: DisplayArg, total: int, description: str) -> _Bar | None:
    tqdm = _progress.tqdm_class(progress)
    return None if tqdm is None else _Bar(tqdm, total, description)


# --- The curve ---------------------------------------------------------------------------------


class _Figure:
    """One matplotlib figure with its Agg canvas and axes, kept between watches: building a
    figure and laying it out costs several times what drawing new values on it does."""

    def __init__(self) -> None:
        figure_module = importlib.import_module("matplotlib.figure")
        agg = importlib.import_module("matplotlib.backends.backend_agg")
        self.figure = figure_module.Figure(figsize=(6.4, 3.4), dpi=100)
        self.canvas = agg.FigureCanvasAgg(self.figure)
        # Fixed margins: laying the figure out again at every frame (tight_layout) costs more
        # than drawing it.
        self.figure.subplots_adjust(left=0.11, right=0.98, top=0.9, bottom=0.15)
        self.axes = self.figure.add_subplot()
        self.axes.set_xlabel("epoch")
        self.axes.set_ylabel("loss")
        self.axes.grid(alpha=0.3)
        self.lines: dict[str, Any] = {}

    def render(self, title: str, epochs: int, series: list[Series]) -> bytes:
        axes = self.axes
        axes.set_title(title, fontsize=10)
        labels = [label for label, _, _, _ in series]
        if list(self.lines) != labels:
            # Other lines (another watch, a sweep's leader changed): drawn anew.
            for line in self.lines.values():
                line.remove()
            self.lines = {}
            for label, _, _, _ in series:
                (line,) = axes.plot([], [], label=label, markersize=3)
                self.lines[label] = line
            if axes.get_legend() is not None:
                axes.get_legend().remove()
            if len(series) <= MAX_LEGEND:
                axes.legend(fontsize=8)
        finite = [v for _, _, values, _ in series for v in values if math.isfinite(v)]
        for label, points, values, emphasised in series:
            line = self.lines[label]
            line.set_data(points, [v if math.isfinite(v) else math.nan for v in values])
            line.set_marker("o" if len(points) <= 30 else "None")
            line.set_linewidth(2.4 if emphasised else 1.4)
        # Losses that fall by orders of magnitude read better on a log scale.
        log = bool(finite) and min(finite) > 0 and max(finite) / min(finite) > 50
        axes.set_yscale("log" if log else "linear")
        axes.relim()
        if epochs > 0:
            axes.set_xlim(0.5, epochs + 0.5)
        axes.autoscale_view(scalex=epochs <= 0)
        buffer = io.BytesIO()
        self.canvas.print_png(buffer)
        return buffer.getvalue()


# Figures no curve is drawing on: a watch takes one (or makes one) and gives it back at its end.
_spare_figures: list[_Figure] = []
_spare_lock = threading.Lock()
_MAX_SPARE_FIGURES = 2


class _Curve:
    """A loss curve rendered to PNG and shown with IPython.display under one display id, so that
    each redraw replaces the last image instead of adding one.

    Cheap by construction: matplotlib is imported at the first frame (or in the background while
    the job trains, see _make_curve), not before; with ``delay`` (plot=None) no frame is drawn
    while the watch is younger than that, so a job that ends sooner gets one frame, its last;
    frames are at least REDRAW_INTERVAL apart and at least RENDER_SHARE times the last frame's
    rendering time, so drawing takes a small share of a watch; and figures are kept and their
    lines updated rather than built again."""

    def __init__(self, display_module: Any, title: str, epochs: int, delay: float = 0.0) -> None:
        self._display_module = display_module
        self._title = title
        self._epochs = epochs
        self._delay = delay
        self._started = time.monotonic()
        self._handle: Any = None
        self._shown = False
        self._drawn_at = -math.inf
        self._render_seconds = 0.0
        self._pending: list[Series] | None = None
        self._failed = False
        self._figure: _Figure | None = None

    def draw(self, series: list[Series], *, force: bool = False) -> None:
        """Shows ``series``: at once when the last redraw is old enough (or ``force``), else
        kept for the next call (:meth:`close` draws what is left)."""
        if self._failed or not any(values for _, _, values, _ in series):
            return
        live = not self._shown or self._handle is not None
        now = time.monotonic()
        wait = max(REDRAW_INTERVAL, RENDER_SHARE * self._render_seconds)
        if not force and (
            not live or now - self._drawn_at < wait or now - self._started < self._delay
        ):
            self._pending = series
            return
        self._pending = None
        began = time.monotonic()
        try:
            png = self._render(series)
        except ImportError as e:
            self._failed = True
            warnings.warn(f"no loss curve: matplotlib cannot be imported ({e})", stacklevel=2)
            return
        image = self._display_module.Image(data=png, format="png")
        if self._handle is not None:
            self._handle.update(image)
        else:
            # None outside an IPython shell (which prints instead): shown again only at the end.
            self._handle = self._display_module.display(image, display_id=True)
            self._shown = True
        self._drawn_at = time.monotonic()
        self._render_seconds = self._drawn_at - began

    def close(self) -> None:
        if self._pending is not None:
            self.draw(self._pending, force=True)
        if self._figure is not None:
            with _spare_lock:
                if len(_spare_figures) < _MAX_SPARE_FIGURES:
                    _spare_figures.append(self._figure)
            self._figure = None

    def _render(self, series: list[Series]) -> bytes:
        if self._figure is None:
            with _spare_lock:
                self._figure = _spare_figures.pop() if _spare_figures else None
            if self._figure is None:
                self._figure = _Figure()
        return self._figure.render(self._title, self._epochs, series)


def _import_in_background(module: str) -> None:
    """Starts importing ``module`` on a thread of its own (the caller goes on; an import of it
    elsewhere waits for this one): matplotlib loads while the job trains."""

    def run() -> None:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 (the first frame reports it)
            pass

    threading.Thread(target=run, name=f"trainerd-import-{module}", daemon=True).start()


def _make_curve(plot: DisplayArg, title: str, epochs: int) -> _Curve | None:
    """The curve ``plot`` asks for: None (False, or None outside Jupyter) when there is none.
    Nothing heavy happens here: matplotlib is only looked for (its import waits for the first
    frame)."""
    if plot is False or (plot is None and not _progress.in_jupyter()):
        return None
    try:
        found = importlib.util.find_spec("matplotlib") is not None
        display = importlib.import_module("IPython.display") if found else None
    except (ImportError, ValueError):
        found, display = False, None
    if display is None:
        if plot:
            warnings.warn(
                "plot=True needs matplotlib and IPython (pip install 'trainerd[notebook]'); "
                "no loss curve is drawn",
                stacklevel=4,
            )
        return None
    if "matplotlib.backends.backend_agg" not in sys.modules:
        _import_in_background("matplotlib.backends.backend_agg")
    # Asked for (True): from the first epoch. Automatic (None): live once the watch outlasts
    # CURVE_DELAY; a job that ends sooner gets its final curve only.
    return _Curve(display, title, epochs, delay=0.0 if plot else CURVE_DELAY)


# --- A job -------------------------------------------------------------------------------------


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"


def job_series(history: Sequence[Epoch]) -> list[Series]:
    """The lines of a job's curve: the training loss, and the validation loss when the job
    validates."""
    series: list[Series] = [
        ("training loss", [e.epoch for e in history], [e.loss for e in history], True)
    ]
    validated = [e for e in history if e.validation_loss is not None]
    if validated:
        series.append(
            (
                "validation loss",
                [e.epoch for e in validated],
                [float(e.validation_loss) for e in validated if e.validation_loss is not None],
                False,
            )
        )
    return series


class JobDisplay:
    """The bar and the curve of one job, fed epoch by epoch."""

    def __init__(self, bar: _Bar | None, curve: _Curve | None) -> None:
        self._bar = bar
        self._curve = curve
        self.history: list[Epoch] = []

    def add(self, epoch: Epoch) -> None:
        self.history.append(epoch)
        if self._bar is not None:
            postfix = {"loss": _fmt(epoch.loss)}
            if epoch.validation_loss is not None:
                postfix["val_loss"] = _fmt(epoch.validation_loss)
            if epoch.validation_accuracy is not None:
                postfix["val_acc"] = f"{epoch.validation_accuracy:.3f}"
            self._bar.set(epoch.epoch, postfix)
        if self._curve is not None:
            self._curve.draw(job_series(self.history))

    def close(self) -> None:
        if self._curve is not None:
            self._curve.close()
        if self._bar is not None:
            self._bar.close()


def job_display(
    job_id: str, epochs: int, progress: DisplayArg, plot: DisplayArg
) -> JobDisplay | None:
    """The display ``progress`` and ``plot`` ask for, for a job of ``epochs`` epochs; None when
    there is nothing to show."""
    bar = _make_bar(progress, epochs, job_id)
    curve = _make_curve(plot, job_id, epochs)
    if bar is None and curve is None:
        return None
    return JobDisplay(bar, curve)


# --- A sweep -----------------------------------------------------------------------------------


def _lr(spec: jobs_pb2.JobSpec) -> float:
    return spec.optimizer.learning_rate


def _momentum(spec: jobs_pb2.JobSpec) -> float:
    return spec.optimizer.momentum


def _weight_decay(spec: jobs_pb2.JobSpec) -> float:
    return spec.optimizer.weight_decay


def _seed(spec: jobs_pb2.JobSpec) -> float:
    return spec.seed


#: What a sweep may vary, and where a member's spec holds it.
_SWEPT: tuple[tuple[str, Callable[[jobs_pb2.JobSpec], float]], ...] = (
    ("lr", _lr),
    ("momentum", _momentum),
    ("weight_decay", _weight_decay),
    ("seed", _seed),
)


def _member_labels(members: Sequence[JobBase]) -> list[str]:
    """Each member named by the values that differ between members ("lr=0.1, seed=2")."""
    differing = [
        (name, read)
        for name, read in _SWEPT
        if len({read(m.proto.spec) for m in members}) > 1
    ]
    if not differing:
        return [m.id for m in members]
    return [
        ", ".join(f"{name}={read(m.proto.spec):g}" for name, read in differing) for m in members
    ]


def _metric(epoch: Epoch, metric: str) -> float | None:
    return epoch.validation_loss if metric == "validation_loss" else epoch.loss


def _leader(members: Sequence[JobBase], metric: str, ended_only: bool) -> int | None:
    """The index of the member with the lowest latest ``metric`` (among those that succeeded
    when ``ended_only``; else among all that have an epoch and did not fail)."""
    best: tuple[float, int] | None = None
    for index, member in enumerate(members):
        state = member.cached_state.value
        if ended_only and state != "SUCCEEDED":
            continue
        if state in ("FAILED", "CANCELLED"):
            continue
        history = member._history()  # noqa: SLF001
        score = _metric(history[-1], metric) if history else None
        if score is None or not math.isfinite(score):
            continue
        if best is None or (score, index) < best:
            best = (score, index)
    return None if best is None else best[1]


def sweep_series(members: Sequence[JobBase], metric: str) -> list[Series]:
    """The lines of a sweep's curve: each member's ``metric`` ("loss" or "validation_loss") by
    epoch, the leading member's emphasised and marked in its label."""
    labels = _member_labels(members)
    leader = _leader(members, metric, ended_only=False)
    series: list[Series] = []
    for index, (member, label) in enumerate(zip(members, labels)):
        points = [(e.epoch, _metric(e, metric)) for e in member._history()]  # noqa: SLF001
        epochs = [epoch for epoch, value in points if value is not None]
        values = [float(value) for _, value in points if value is not None]
        lead = index == leader
        series.append((f"{label} (best)" if lead else label, epochs, values, lead))
    return series


class SweepDisplay:
    """The bar (every member's epochs) and the curve (every member's ranking metric) of one
    sweep, redrawn from the members' last answers."""

    def __init__(self, bar: _Bar | None, curve: _Curve | None, metric: str) -> None:
        self._bar = bar
        self._curve = curve
        self._metric = metric

    def update(self, members: Sequence[JobBase]) -> None:
        if self._bar is not None:
            done = 0
            ended = 0
            for member in members:
                if member.cached_state.ended:
                    ended += 1
                    done += member.spec.epochs  # stopped early or failed: its share is done
                else:
                    done += member.epochs_completed
            postfix = {"ended": f"{ended}/{len(members)}"}
            leader = _leader(members, self._metric, ended_only=False)
            if leader is not None:
                history = members[leader]._history()  # noqa: SLF001
                postfix["best"] = _fmt(_metric(history[-1], self._metric))
            self._bar.set(done, postfix)
        if self._curve is not None:
            self._curve.draw(sweep_series(members, self._metric))

    def close(self) -> None:
        if self._curve is not None:
            self._curve.close()
        if self._bar is not None:
            self._bar.close()


def sweep_display(
    sweep: SweepBase[Any], progress: DisplayArg, plot: DisplayArg
) -> SweepDisplay | None:
    """The display ``progress`` and ``plot`` ask for, for ``sweep``; None when there is nothing
    to show."""
    total = sum(job.spec.epochs for job in sweep.jobs)
    metric = sweep.best_metric
    bar = _make_bar(progress, total, sweep.id)
    title = f"{sweep.id}: {metric.replace('_', ' ')}"
    epochs = max((job.spec.epochs for job in sweep.jobs), default=0)
    curve = _make_curve(plot, title, epochs)
    if bar is None and curve is None:
        return None
    return SweepDisplay(bar, curve, metric)


# --- HTML ----------------------------------------------------------------------------------------

_STYLE = "border-collapse:collapse;font-size:90%"
_CELL = "padding:2px 8px;text-align:left;vertical-align:top"


def _e(value: object) -> str:
    return html.escape(str(value))


def _table(rows: Sequence[tuple[str, str]], caption: str = "") -> str:
    """A two-column table of (name, value) rows; both are escaped here."""
    head = f"<caption style='text-align:left'><b>{_e(caption)}</b></caption>" if caption else ""
    body = "".join(
        f"<tr><th style='{_CELL}'>{_e(name)}</th><td style='{_CELL}'>{_e(value)}</td></tr>"
        for name, value in rows
    )
    return f"<table style='{_STYLE}'>{head}{body}</table>"


def _seconds(value: float) -> str:
    return f"{value:.3g} s"


def _losses(history: Sequence[Epoch]) -> list[tuple[str, str]]:
    """first / final / best (at which epoch) of the losses a history has."""
    rows: list[tuple[str, str]] = []

    def summary(name: str, values: list[tuple[int, float]], lower_is_better: bool) -> None:
        if not values:
            return
        finite = [(e, v) for e, v in values if math.isfinite(v)]
        text = f"first {values[0][1]:.4g}, final {values[-1][1]:.4g}"
        if finite:
            sign = 1.0 if lower_is_better else -1.0
            epoch, value = min(finite, key=lambda item: (sign * item[1], item[0]))
            text += f", best {value:.4g} (epoch {epoch})"
        rows.append((name, text))

    summary("loss", [(e.epoch, e.loss) for e in history], True)
    summary(
        "validation loss",
        [(e.epoch, e.validation_loss) for e in history if e.validation_loss is not None],
        True,
    )
    accuracy = [
        (e.epoch, e.validation_accuracy) for e in history if e.validation_accuracy is not None
    ]
    summary("validation accuracy", accuracy, False)
    return rows



def _sandbox(s: jobs_pb2.WorkerSandbox) -> str:
    """A TorchScript job's worker sandbox in one line, as `trainctl job get` says it."""
    landlock = (
        f"Landlock ABI {s.landlock_abi}"
        if s.landlock
        else f"no Landlock ({s.landlock_error or '-'})"
    )
    seccomp = "seccomp" if s.seccomp else f"no seccomp ({s.seccomp_error or '-'})"
    network = (
        "network namespace"
        if s.network_namespace
        else f"no network namespace ({s.network_error or '-'})"
    )
    whose = "not the daemon's" if s.other_user else "the daemon's"
    user = "mixed user ids" if s.uid < 0 else f"user {s.uid} ({whose})"
    return ", ".join(
        [
            landlock,
            seccomp,
            "no new privileges" if s.no_new_privileges else "new privileges possible",
            "not dumpable" if s.not_dumpable else "dumpable",
            network,
            user,
        ]
    )

def report_rows(job: JobBase) -> list[tuple[str, str]]:
    """The device report's figures worth a glance (trainerd.v1.DeviceReport)."""
    report = job.proto.report
    rows: list[tuple[str, str]] = []
    if report.verdict:
        rows.append(("verdict", report.verdict))
    if report.bound:
        bound = jobs_pb2.DeviceReport.Bound.Name(report.bound)
        rows.append(("bound by", bound.lower().replace("_", "-")))
    if report.engine:
        engine = report.engine
        if report.engine_reason:
            engine += f" ({report.engine_reason})"
        rows.append(("engine", engine))
    device = job.device
    if report.intra_op_threads:
        threads = report.intra_op_threads
        device += f", {threads} thread{'' if threads == 1 else 's'}"
    if device:
        rows.append(("device", device))
    if report.packed_members > 1:
        rows.append(("packed with", f"{report.packed_members} members"))
        if report.packed_numerics:
            rows.append(("numerics", report.packed_numerics))
    if report.collective_seconds > 0:
        collectives = _seconds(report.collective_seconds)
        if report.HasField("collective_fraction"):
            collectives += f" ({report.collective_fraction:.0%} of compute, rank 0)"
        rows.append(("collectives", collectives))
    if report.steps_per_second:
        rows.append(("steps/s", f"{report.steps_per_second:.4g}"))
    if report.HasField("worker_sandbox"):
        rows.append(("sandbox", _sandbox(report.worker_sandbox)))
    parts = [
        (name, value)
        for name, value in (
            ("queued", report.queue_seconds),
            ("data", report.data_seconds),
            ("compute", report.compute_seconds),
            ("host transfers", report.host_transfer_seconds),
            ("worker start", report.worker_start_seconds),
        )
        if value
    ]
    if parts:
        rows.append(("time", ", ".join(f"{name} {_seconds(value)}" for name, value in parts)))
    if report.HasField("utilization_average"):
        text = f"{report.utilization_average:.0%} average"
        if report.HasField("utilization_peak"):
            text += f", {report.utilization_peak:.0%} peak"
        rows.append(("utilization", text))
    if report.peak_memory_bytes:
        rows.append(("peak memory", f"{report.peak_memory_bytes / 2**20:.1f} MiB"))
    if report.achieved_flops_per_second:
        text = f"{report.achieved_flops_per_second / 1e9:.3g} GFLOP/s"
        if report.HasField("peak_fraction"):
            text += f" ({report.peak_fraction:.1%} of the measured peak)"
        rows.append(("achieved", text))
    if report.HasField("overhead_fraction"):
        rows.append(("overhead", f"{report.overhead_fraction:.0%} of the step time"))
    if report.host_syncs:
        rows.append(("host syncs", str(report.host_syncs)))
    return rows


def job_html(job: JobBase) -> str:
    """The job as a small HTML table: state, id, dataset, epochs, losses, then its device
    report. Every text is escaped."""
    proto = job.proto
    history = job._history()  # noqa: SLF001
    spec = proto.spec
    rows: list[tuple[str, str]] = [
        ("state", job.cached_state.value),
        ("id", job.id),
        ("dataset", job.dataset),
    ]
    if spec.model:
        rows.append(("model", spec.model))
    if spec.replicas > 1:
        rows.append(("batch", f"{spec.batch_size} per rank, {job.global_batch_size} global"))
        placed = ", ".join(f"{rank}: {device} on {node}" for rank, device, node in job.ranks)
        rows.append(("ranks", f"{spec.replicas} ({placed})" if placed else str(spec.replicas)))
    if job.peer is not None:
        node, there = job.peer
        device = job.ranks[0][1] if job.ranks else ""
        rows.append(("on peer", f"{node} as {there}" + (f" ({device})" if device else "")))
    epochs = f"{proto.epochs_completed} of {spec.epochs}"
    if proto.stopped_early:
        epochs += " (stopped early)"
    rows.append(("epochs", epochs))
    if proto.model_epoch:
        best = " (the best)" if proto.model_epoch == proto.best_epoch else ""
        rows.append(("model from", f"epoch {proto.model_epoch}{best}"))
    if proto.error:
        rows.append(("error", proto.error))
    rows += _losses(history)
    if not history and proto.epochs_completed:
        rows.append(("final loss", _fmt(proto.final_loss)))
    if proto.wall_seconds:
        rows.append(("wall time", _seconds(proto.wall_seconds)))
    if proto.samples_per_second:
        rows.append(("samples/s", f"{proto.samples_per_second:.4g}"))
    report = report_rows(job)
    tables = _table(rows, f"Job {job.id}")
    if report:
        tables += _table(report, "Device report")
    return f"<div>{tables}</div>"


def sweep_html(sweep: SweepBase[Any]) -> str:
    """One row per member (its swept values, state, epochs and results); the best member (as
    :meth:`SweepBase.best` ranks them) is marked. Every text is escaped."""
    members = sweep.jobs
    metric = sweep.best_metric
    best = _leader(members, metric, ended_only=True)
    validates = metric == "validation_loss"
    columns = ["", "id", "state", "lr", "momentum", "weight decay", "seed", "epochs", "loss"]
    if validates:
        columns += ["val loss", "val acc"]
    columns += ["wall s", "error"]
    head = "".join(f"<th style='{_CELL}'>{_e(c)}</th>" for c in columns)
    body = []
    for index, job in enumerate(members):
        spec = job.spec
        history = job._history()  # noqa: SLF001
        last = history[-1] if history else None
        cells = [
            "\u2605" if index == best else "",
            job.id,
            job.cached_state.value,
            f"{spec.optimizer.learning_rate:g}",
            f"{spec.optimizer.momentum:g}",
            (
                f"{spec.optimizer.weight_decay:g}"
                if spec.optimizer.HasField("weight_decay")
                else ""
            ),
            str(spec.seed),
            f"{job.epochs_completed}/{spec.epochs}",
            _fmt(last.loss) if last else "",
        ]
        if validates:
            cells += [
                _fmt(last.validation_loss) if last else "",
                (
                    f"{last.validation_accuracy:.3f}"
                    if last and last.validation_accuracy is not None
                    else ""
                ),
            ]
        cells += [f"{job.wall_seconds:.3g}" if job.wall_seconds else "", job.error]
        style = " style='font-weight:bold'" if index == best else ""
        body.append(
            f"<tr{style}>" + "".join(f"<td style='{_CELL}'>{_e(c)}</td>" for c in cells) + "</tr>"
        )
    ended = sum(1 for job in members if job.cached_state.ended)
    succeeded = sum(1 for job in members if job.cached_state.value == "SUCCEEDED")
    caption = (
        f"Sweep {sweep.id}: {len(members)} members, {ended} ended, {succeeded} succeeded; "
        f"\u2605 best by {metric.replace('_', ' ')}"
    )
    if best is not None:
        caption += f": {members[best].id}"
    return (
        f"<table style='{_STYLE}'><caption style='text-align:left'><b>{_e(caption)}</b>"
        f"</caption><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )
