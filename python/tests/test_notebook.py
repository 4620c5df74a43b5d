"""examples/quickstart.ipynb, executed with nbclient in a kernel of this environment's Python
against the session's daemon: it must run without an error, show its live curve and the job's
HTML view, and train models that recognise digits."""

from __future__ import annotations

import json
import os
import re
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from conftest import PYTHON_DIR, Daemon

NOTEBOOK = PYTHON_DIR.parent / "examples" / "quickstart.ipynb"


def kernel_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A kernel spec named python3 that runs this interpreter (the one the package is installed
    in), found before any other python3 spec; Jupyter's and IPython's state in tmp_path."""
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "Python 3 (trainerd tests)",
                "language": "python",
            }
        )
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    return "python3"


def text_of(cell: Any) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def accuracy(pattern: str, text: str) -> float:
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not in {text!r}"
    return float(match.group(1))


def test_committed_without_outputs() -> None:
    notebook = json.loads(NOTEBOOK.read_text())
    assert notebook["nbformat"] == 4
    assert notebook["metadata"]["kernelspec"]["name"] == "python3"
    code = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    assert len(code) >= 6
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in code)


def test_quickstart_notebook_runs_against_the_daemon(
    daemon: Daemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nbclient = pytest.importorskip(
        "nbclient", reason="nbclient is not installed (pip install './python[notebook]')"
    )
    import nbformat

    kernel = kernel_environment(tmp_path, monkeypatch)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # The kernel starts in tmp_path, away from python/ (whose trainerd is the sources, without
    # the generated modules), and gets the daemon's address as a user would set it.
    env = {**os.environ, "TRAINERD_ADDR": daemon.address}
    client = nbclient.NotebookClient(
        notebook,
        kernel_name=kernel,
        timeout=180,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    start = time.monotonic()
    client.execute(env=env)  # CellExecutionError on the first cell that raises
    seconds = time.monotonic() - start
    cells = [c for c in notebook.cells if c.cell_type == "code"]
    assert all(not any(o.output_type == "error" for o in c.outputs) for c in cells)
    everything = "\n".join(text_of(c) for c in cells)
    assert "Traceback" not in everything

    def cell(marker: str) -> Any:
        return next(c for c in cells if marker in c.source)

    assert daemon.address in text_of(cell("trainerd.Client()"))
    assert "digits: 1437 rows, features (64,), targets int64" in text_of(cell("client.upload("))
    # The watch printed every tenth epoch, and drew its curve in the notebook (one image, updated
    # in place) with a progress bar.
    watch = cell("job.watch()")
    assert re.findall(r"epoch\s+(\d+)", text_of(watch)) == ["10", "20", "30"]
    images = [o for o in watch.outputs if "image/png" in o.get("data", {})]
    assert len(images) == 1
    assert images[0]["data"]["image/png"].startswith("iVBORw0KGgo")  # base64 of the PNG magic
    # The job's HTML view.
    (shown,) = [c for c in cells if c.source.strip() == "job"]
    (view,) = [o for o in shown.outputs if o.output_type == "execute_result"]
    assert "SUCCEEDED" in view["data"]["text/html"]
    assert "Device report" in view["data"]["text/html"]
    # Both trainings recognise digits, in similar times.
    comparison = text_of(cell("torch.optim.SGD"))
    assert accuracy(r"trainerd: validation accuracy (\d\.\d+)", comparison) > 0.8
    assert accuracy(r"pytorch:  validation accuracy (\d\.\d+)", comparison) > 0.8
    assert float(re.search(r"trainerd: .* in (\d+\.\d+) s", comparison).group(1)) > 0  # type: ignore[union-attr]
    assert float(re.search(r"pytorch: .* in (\d+\.\d+) s", comparison).group(1)) > 0  # type: ignore[union-attr]
    # The sweep: its best member, its frame (pandas' HTML) and its own view.
    sweep = cell("client.sweep(")
    best = re.search(r"best: (job-\w+), lr (0\.3|0\.1|0\.03|0\.01), validation loss", text_of(sweep))
    assert best
    (frame,) = [o for o in sweep.outputs if o.output_type == "execute_result"]
    assert frame["data"]["text/html"].count("SUCCEEDED") == 4
    (members,) = [o for o in cell("sweep  #").outputs if o.output_type == "execute_result"]
    rows = ET.fromstring(members["data"]["text/html"]).find("tbody")
    assert rows is not None and len(rows) == 4
    marked = [[td.text for td in row][1] for row in rows if row[0].text == "\u2605"]
    assert marked == [best.group(1)]
    # The downloaded models, on digits no training saw.
    tested = text_of(cell("job.model()"))
    assert accuracy(r"test accuracy, trainerd's model: (\d\.\d+)", tested) > 0.8
    assert accuracy(r"test accuracy, the PyTorch loop's model: (\d\.\d+)", tested) > 0.8
    assert accuracy(r"test accuracy, the sweep's best model \(lr [\d.]+\): (\d\.\d+)", tested) > 0.8
    print(f"quickstart.ipynb ran in {seconds:.1f} s")
    if os.environ.get("TRAINERD_NOTEBOOK_OUT"):  # to look at what it showed
        nbformat.write(notebook, os.environ["TRAINERD_NOTEBOOK_OUT"])
