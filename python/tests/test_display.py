"""What jobs and sweeps show: the progress bars of watch and wait, the loss curves drawn in
Jupyter (IPython.display replaced by a recorder; the PNG is matplotlib's own), and the HTML tables
of _repr_html_, against the real daemon."""

from __future__ import annotations

import asyncio
import io
import sys
import time
import warnings
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from typing import Any

import pytest

import trainerd
import trainerd.aio
from conftest import Daemon, class_data, seed_data
from trainerd import _display, _progress
from trainerd.v1 import jobs_pb2

PNG = b"\x89PNG\r\n\x1a\n"


class Recorder:
    """Stands in for IPython.display.display: records what is shown and each update of it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def display(self, obj: Any, display_id: Any = None) -> Recorder.Handle:
        assert display_id is True  # one display id, so that updates replace the image
        self.calls.append(("display", obj))
        return Recorder.Handle(self)

    class Handle:
        def __init__(self, recorder: Recorder) -> None:
            self._recorder = recorder

        def update(self, obj: Any) -> None:
            self._recorder.calls.append(("update", obj))


@pytest.fixture
def jupyter(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Recorder, list[list[Any]]]]:
    """A Jupyter kernel as the display sees one: in_jupyter() is True, IPython.display.display
    records, and every rendered curve's lines are kept (the rendering itself is matplotlib's)."""
    ipython_display = pytest.importorskip("IPython.display")
    pytest.importorskip("matplotlib")
    recorder = Recorder()
    monkeypatch.setattr(_progress, "in_jupyter", lambda: True)
    monkeypatch.setattr(ipython_display, "display", recorder.display)
    rendered: list[list[Any]] = []
    render = _display._Curve._render

    def spy(self: Any, series: list[Any]) -> bytes:
        rendered.append(series)
        return render(self, series)

    monkeypatch.setattr(_display._Curve, "_render", spy)
    yield recorder, rendered


def table_rows(html: str) -> dict[str, str]:
    """The (name, value) rows of a job's tables; the HTML must be well-formed."""
    root = ET.fromstring(html)
    return {
        tr.find("th").text or "": tr.find("td").text or ""  # type: ignore[union-attr]
        for tr in root.iter("tr")
    }


def classes_job(
    client: trainerd.Client, name: str, epochs: int = 8, **options: Any
) -> trainerd.Job:
    x, y = class_data(240, seed=5)
    client.upload(name, x, y)
    return client.submit(
        name, model="linear:16,relu,linear:3", loss="cross_entropy", lr=0.1, epochs=epochs,
        validation_fraction=0.25, seed=1, **options,
    )


# --- The decision ----------------------------------------------------------------------------


def test_bar_decision_follows_uploads(monkeypatch: pytest.MonkeyPatch) -> None:
    tqdm = pytest.importorskip("tqdm")
    import tqdm.auto

    assert not sys.stderr.isatty()  # pytest captures it
    assert _progress.tqdm_class(None) is None  # a log gets no bar
    assert _progress.tqdm_class(False) is None
    assert _progress.tqdm_class(True) is tqdm.tqdm
    monkeypatch.setattr(_progress, "in_jupyter", lambda: True)
    assert _progress.tqdm_class(None) is tqdm.auto.tqdm
    assert _progress.tqdm_class(False) is None
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    assert _progress.tqdm_class(True) is None  # not installed: no bar, no error


def test_nothing_is_shown_outside_a_notebook_by_default(
    client: trainerd.Client, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    job = classes_job(client, name)
    assert [e.epoch for e in job.watch()] == list(range(1, 9))
    job.wait()
    assert capsys.readouterr().err == ""
    assert _display.job_display(job.id, 8, None, None) is None


# --- Bars ------------------------------------------------------------------------------------


def test_watch_draws_a_bar_with_the_latest_losses(
    client: trainerd.Client, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tqdm")
    job = classes_job(client, name)
    epochs = list(job.watch(progress=True, plot=False))
    assert [e.epoch for e in epochs] == list(range(1, 9))
    err = capsys.readouterr().err
    assert job.id in err
    assert "8/8" in err
    last = epochs[-1]
    assert last.validation_loss is not None and last.validation_accuracy is not None
    assert f"loss={last.loss:.4g}" in err
    assert f"val_loss={last.validation_loss:.4g}" in err
    assert f"val_acc={last.validation_accuracy:.3f}" in err
    # Off when asked, whatever the environment.
    assert len(list(job.watch(progress=False, plot=False))) == 8
    assert capsys.readouterr().err == ""


def test_wait_draws_the_bar_too(
    client: trainerd.Client, seed_dataset: trainerd.Dataset, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tqdm")
    job = client.submit("seed", model="linear:1", loss="mse", lr=0.1, epochs=15, seed=2)
    job.wait(progress=True)
    err = capsys.readouterr().err
    assert "15/15" in err
    assert f"loss={job.history[-1].loss:.4g}" in err
    assert job.state == trainerd.JobState.SUCCEEDED


def test_sweep_wait_draws_a_bar_over_every_members_epochs(
    client: trainerd.Client, seed_dataset: trainerd.Dataset, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tqdm")
    sweep = client.sweep(
        "seed", model="linear:1", loss="mse", lr=[0.1, 0.03, 1e6], seed=[1, 2], epochs=10,
        batch_size=16,
    )
    assert sweep.wait(timeout=120, progress=True) is sweep
    assert sweep.ended
    err = capsys.readouterr().err
    assert sweep.id in err
    # The diverging members failed early; their share counts as done.
    assert "60/60" in err
    assert "ended=6/6" in err
    assert f"best={sweep.best().final_loss:.4g}" in err


# --- Curves ------------------------------------------------------------------------------------


def test_watch_plots_training_and_validation_loss_in_jupyter(
    client: trainerd.Client, name: str, jupyter: tuple[Recorder, list[list[Any]]]
) -> None:
    from IPython.display import Image

    recorder, rendered = jupyter
    job = classes_job(client, name, epochs=12)
    epochs = list(job.watch(progress=False))
    assert len(epochs) == 12
    # One image, updated in place.
    assert [kind for kind, _ in recorder.calls[:1]] == ["display"]
    assert all(kind == "update" for kind, _ in recorder.calls[1:])
    assert len(recorder.calls) == len(rendered)
    for _, image in recorder.calls:
        assert isinstance(image, Image)
        assert image.data.startswith(PNG)
    # The last image has every epoch: training loss and validation loss.
    train, validation = rendered[-1]
    assert train[:2] == ("training loss", list(range(1, 13)))
    assert train[2] == [e.loss for e in job.history]
    assert validation[:2] == ("validation loss", list(range(1, 13)))
    assert validation[2] == [e.validation_loss for e in job.history]
    import matplotlib.image

    pixels = matplotlib.image.imread(io.BytesIO(recorder.calls[-1][1].data), format="png")
    assert pixels.shape[:2] == (340, 640)


def test_a_late_watchers_curve_is_redrawn_seldom(
    client: trainerd.Client, seed_dataset: trainerd.Dataset,
    jupyter: tuple[Recorder, list[list[Any]]],
) -> None:
    recorder, rendered = jupyter
    job = client.submit("seed", model="linear:1", loss="mse", lr=0.1, epochs=60, seed=3)
    job.wait(progress=False, plot=False)
    assert recorder.calls == []
    # The history arrives at once, within CURVE_DELAY: one frame, the last (plot=None).
    assert len(list(job.watch(progress=False))) == 60
    assert len(rendered) == 1 and len(recorder.calls) == 1
    # Asked for (plot=True): drawn on its first epoch, then its last, not 60 times.
    assert len(list(job.watch(progress=False, plot=True))) == 60
    assert 3 <= len(rendered) < 10
    (train,) = rendered[-1]
    assert train[1] == list(range(1, 61))
    assert train[2] == [e.loss for e in job.history]


def test_a_curve_imports_matplotlib_off_the_callers_thread(tmp_path: Any) -> None:
    """Making the display never waits for matplotlib: it loads on a thread of its own (here made
    to take 2 s) while the job trains, and the first frame uses it."""
    pytest.importorskip("IPython.display")
    pytest.importorskip("matplotlib")
    import subprocess

    code = (
        "import importlib.abc, sys, threading, time\n"
        "importers = []\n"
        "class Slow(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'matplotlib.backends':\n"
        "            importers.append(threading.current_thread().name)\n"
        "            time.sleep(2)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Slow())\n"
        "from trainerd import _display, _progress\n"
        "_progress.in_jupyter = lambda: True\n"
        "start = time.monotonic()\n"
        "curve = _display._make_curve(None, 'job', 3)\n"
        "made = time.monotonic() - start\n"
        "print(curve is not None, made < 1.0)\n"
        "curve._display_module = type('D', (), {'Image': staticmethod(lambda **k: k), "
        "'display': staticmethod(lambda image, display_id: None)})\n"
        "curve.draw([('training loss', [1, 2], [0.5, 0.25], True)], force=True)\n"
        "print('matplotlib.backends.backend_agg' in sys.modules, curve._shown, importers)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == [
        "True True",
        "True True ['trainerd-import-matplotlib.backends.backend_agg']",
    ]


def test_drawing_takes_a_small_share_of_a_watch(monkeypatch: pytest.MonkeyPatch) -> None:
    """However slow a frame is, frames are spaced RENDER_SHARE times its rendering time apart,
    and a watch younger than CURVE_DELAY draws none until it ends (plot=None)."""
    shown: list[Any] = []

    class Display:
        @staticmethod
        def Image(data: bytes, format: str) -> bytes:  # noqa: A002, N802
            return data

        @staticmethod
        def display(image: Any, display_id: bool) -> Any:
            shown.append(image)
            return type("Handle", (), {"update": staticmethod(shown.append)})

    def slow_render(self: Any, series: Any) -> bytes:
        time.sleep(0.05)
        return PNG

    monkeypatch.setattr(_display._Curve, "_render", slow_render)
    monkeypatch.setattr(_display, "REDRAW_INTERVAL", 0.0)
    series = [("training loss", [1], [1.0], True)]
    quick = _display._Curve(Display, "job", 10, delay=_display.CURVE_DELAY)
    for _ in range(20):
        quick.draw(series)
    assert shown == []
    quick.close()
    assert shown == [PNG]

    shown.clear()
    live = _display._Curve(Display, "job", 10, delay=0.0)
    start = time.monotonic()
    drawing = 0.0
    while time.monotonic() - start < 1.5:
        before = time.monotonic()
        live.draw(series)
        drawing += time.monotonic() - before
        time.sleep(0.001)
    elapsed = time.monotonic() - start
    assert 2 <= len(shown) <= 8, len(shown)
    assert drawing / elapsed < 1 / (1 + _display.RENDER_SHARE) + 0.1


def test_no_matplotlib_no_curve_and_no_error(
    client: trainerd.Client, seed_dataset: trainerd.Dataset,
    jupyter: tuple[Recorder, list[list[Any]]], monkeypatch: pytest.MonkeyPatch,
) -> None:
    recorder, _ = jupyter
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    job = client.submit("seed", model="linear:1", loss="mse", lr=0.1, epochs=5, seed=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(list(job.watch(progress=False))) == 5
        job.wait(progress=False)
    assert recorder.calls == []
    # Asked for explicitly, it says why there is none.
    with pytest.warns(UserWarning, match=r"plot=True needs matplotlib"):
        assert len(list(job.watch(progress=False, plot=True))) == 5
    assert recorder.calls == []


def test_sweep_wait_plots_each_members_metric(
    client: trainerd.Client, name: str, jupyter: tuple[Recorder, list[list[Any]]]
) -> None:
    recorder, rendered = jupyter
    x, y = seed_data(200, seed=9)
    client.upload(name, x, y)
    sweep = client.sweep(
        name, model="linear:1", loss="mse", lr=[0.1, 0.01], seed=[1, 2], epochs=10,
        validation_fraction=0.25,
    ).wait(progress=False)
    assert sweep.best_metric == "validation_loss"
    assert recorder.calls and recorder.calls[0][0] == "display"
    lines = rendered[-1]
    best = sweep.best()
    assert [label for label, *_ in lines] == [
        "lr=0.1, seed=1" + (" (best)" if sweep.jobs[0] == best else ""),
        "lr=0.1, seed=2" + (" (best)" if sweep.jobs[1] == best else ""),
        "lr=0.01, seed=1" + (" (best)" if sweep.jobs[2] == best else ""),
        "lr=0.01, seed=2" + (" (best)" if sweep.jobs[3] == best else ""),
    ]
    for job, (label, epochs, values, emphasised) in zip(sweep.jobs, lines):
        assert epochs == list(range(1, 11))
        assert values == [e.validation_loss for e in job.history]
        assert emphasised == (job == best)


# --- HTML ----------------------------------------------------------------------------------------


def test_job_repr_html_shows_state_losses_and_report(client: trainerd.Client, name: str) -> None:
    job = classes_job(client, name, epochs=10).wait()
    html = job._repr_html_()
    rows = table_rows(html)
    history = job.history
    assert rows["state"] == "SUCCEEDED"
    assert rows["id"] == job.id
    assert rows["dataset"] == name
    assert rows["model"] == "linear:16,relu,linear:3"
    assert rows["epochs"] == "10 of 10"
    losses = [e.loss for e in history]
    best = min(range(10), key=lambda i: losses[i])
    assert rows["loss"] == (
        f"first {losses[0]:.4g}, final {losses[-1]:.4g}, best {losses[best]:.4g} "
        f"(epoch {best + 1})"
    )
    assert rows["validation loss"].startswith(f"first {history[0].validation_loss:.4g}, ")
    accuracy = [e.validation_accuracy for e in history]
    assert rows["validation accuracy"].startswith(
        f"first {accuracy[0]:.4g}, final {accuracy[-1]:.4g}, best {max(accuracy):.4g}"  # type: ignore[type-var]
    )
    assert rows["verdict"] == job.report.verdict
    assert rows["device"].startswith("cpu")
    assert rows["engine"].startswith(job.report.engine)
    assert "Device report" in html


def test_repr_html_escapes_every_text() -> None:
    proto = jobs_pb2.Job(
        id="job-<b>1</b>",
        state=jobs_pb2.JOB_STATE_FAILED,
        error="<script>alert('x')</script> & more",
        spec=jobs_pb2.JobSpec(dataset="a&b", model="linear:1", epochs=3),
    )
    proto.report.verdict = "<i>launch-bound</i>"
    html = trainerd.jobs.JobBase(proto)._repr_html_()
    assert "<script>" not in html and "<i>" not in html and "<b>1" not in html
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; more" in html
    rows = table_rows(html)  # well-formed
    assert rows["state"] == "FAILED"
    assert rows["error"] == "<script>alert('x')</script> & more"
    assert rows["dataset"] == "a&b"
    assert rows["verdict"] == "<i>launch-bound</i>"
    assert "loss" not in rows  # no epoch, no losses


def test_a_member_on_a_peer_shows_the_peer_and_its_job_there() -> None:
    spec = jobs_pb2.JobSpec(dataset="d", model="linear:1", epochs=3, nodes=["10.0.0.2:50051"])
    member = jobs_pb2.Job(id="job-here", state=jobs_pb2.JOB_STATE_RUNNING, spec=spec)
    member.ranks.add(rank=0, device="cpu", node="10.0.0.2:50051", job_id="job-there")
    job = trainerd.jobs.JobBase(member)
    assert job.peer == ("10.0.0.2:50051", "job-there")
    assert table_rows(job._repr_html_())["on peer"] == "10.0.0.2:50051 as job-there (cpu)"
    # Not taken by the peer yet: the peer, no id.
    queued = jobs_pb2.Job(id="job-q", state=jobs_pb2.JOB_STATE_QUEUED, spec=spec)
    assert trainerd.jobs.JobBase(queued).peer == ("10.0.0.2:50051", "")
    # A job with ranks on peers, or none, is no member on a peer.
    ranks = jobs_pb2.JobSpec(dataset="d", model="linear:1", replicas=2, nodes=["10.0.0.2:50051"])
    assert trainerd.jobs.JobBase(jobs_pb2.Job(id="job-r", spec=ranks)).peer is None
    assert trainerd.jobs.JobBase(jobs_pb2.Job(id="job-1", spec=jobs_pb2.JobSpec())).peer is None
    assert "on peer" not in table_rows(trainerd.jobs.JobBase(jobs_pb2.Job(id="job-1"))._repr_html_())


def test_sweep_repr_html_has_a_row_per_member_and_marks_the_best(
    client: trainerd.Client, seed_dataset: trainerd.Dataset
) -> None:
    sweep = client.sweep(
        "seed", model="linear:1", loss="mse", lr=[0.1, 0.03, 1e6], epochs=20, batch_size=16,
        seed=5,
    ).wait(progress=False, plot=False)
    root = ET.fromstring(sweep._repr_html_())
    header = [th.text or "" for th in root.iter("th")]
    assert header[:5] == ["", "id", "state", "lr", "momentum"]
    rows = [[td.text or "" for td in tr.iter("td")] for tr in root.find("tbody")]  # type: ignore[union-attr]
    assert [row[1] for row in rows] == [job.id for job in sweep.jobs]
    assert [row[2] for row in rows] == [job.state.value for job in sweep.jobs]
    assert [row[3] for row in rows] == ["0.1", "0.03", "1e+06"]
    best = sweep.best()
    marked = [row[1] for row in rows if row[0] == "\u2605"]
    assert marked == [best.id]
    failed = next(row for row in rows if row[2] == "FAILED")
    assert "loss became" in failed[-1]
    loss = header.index("loss")
    assert rows[sweep.jobs.index(best)][loss] == f"{best.final_loss:.4g}"
    caption = "".join(root.find("caption").itertext())  # type: ignore[union-attr]
    assert f"3 members, 3 ended, 2 succeeded" in caption
    assert caption.endswith(f"best by loss: {best.id}")


# --- asyncio -----------------------------------------------------------------------------------


def test_aio_watch_and_sweep_show_the_same(
    daemon: Daemon, name: str, capsys: pytest.CaptureFixture[str],
    jupyter: tuple[Recorder, list[list[Any]]],
) -> None:
    recorder, rendered = jupyter

    async def main() -> None:
        async with trainerd.aio.Client(daemon.address) as client:
            x, y = seed_data(160, seed=11)
            await client.upload(name, x, y)
            job = await client.submit(name, model="linear:1", loss="mse", lr=0.1, epochs=7, seed=1)
            epochs = [e async for e in job.watch(progress=True)]
            assert [e.epoch for e in epochs] == list(range(1, 8))
            assert rendered[-1][0][2] == [e.loss for e in epochs]
            html = job._repr_html_()
            assert table_rows(html)["state"] == "SUCCEEDED"
            await job.wait(progress=True, plot=False)
            sweep = await client.sweep(name, model="linear:1", loss="mse", lr=[0.1, 0.05],
                                       epochs=6, seed=2)
            await sweep.wait(progress=True)
            assert sweep.ended
            lines = rendered[-1]
            assert [values for _, _, values, _ in lines] == [
                [e.loss for e in member.history] for member in sweep.jobs
            ]
            root = ET.fromstring(sweep._repr_html_())
            assert len(root.find("tbody")) == 2  # type: ignore[arg-type]

    asyncio.run(main())
    err = capsys.readouterr().err
    assert "7/7" in err
    assert "12/12" in err and "ended=2/2" in err
    # One image for the job's watch, one for the sweep; every other call updated one of them.
    assert [kind for kind, _ in recorder.calls].count("display") == 2
