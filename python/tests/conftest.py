"""Fixtures: real trainerd daemons (plain, with tokens, with mutual TLS) started once per session on
free loopback ports with temporary data folders, and clients of them.

The daemon is $TRAINERD_BIN, else ../build/release/server/trainerd relative to python/; trainctl
is $TRAINCTL_BIN, else the build's client/trainctl next to it.
"""

from __future__ import annotations

import itertools
import os
import select
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import trainerd

PYTHON_DIR = Path(__file__).resolve().parent.parent

if os.environ.get("TRAINERD_PYCLIENT_INSTALLED") and Path(trainerd.__file__).resolve().is_relative_to(
    PYTHON_DIR
):
    raise RuntimeError(f"testing the sources ({trainerd.__file__}), not the installed package")
DEFAULT_BIN = PYTHON_DIR.parent / "build" / "release" / "server" / "trainerd"


def trainerd_bin() -> Path:
    return Path(os.environ.get("TRAINERD_BIN", DEFAULT_BIN))


def trainctl_bin() -> Path:
    if os.environ.get("TRAINCTL_BIN"):
        return Path(os.environ["TRAINCTL_BIN"])
    return trainerd_bin().parent.parent / "client" / "trainctl"


class Daemon:
    """A trainerd process on a free loopback port; stopped with SIGTERM."""

    def __init__(self, directory: Path, extra_flags: list[str]) -> None:
        binary = trainerd_bin()
        if not binary.exists():
            pytest.skip(f"no trainerd binary at {binary} (build it, or set $TRAINERD_BIN)")
        self.directory = directory
        self.stderr_path = directory / "stderr.log"
        argv = [
            str(binary),
            "--listen=127.0.0.1:0",
            f"--data_dir={directory / 'data'}",
            "--device=cpu",
            "--metrics_listen=",
            "--diagnose_at_start=false",
            # One CPU job at a time (the default is a job per core), so that what queues behind
            # what does not depend on this machine's cores.
            "--max_concurrent_jobs=1",
            *extra_flags,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINERD_")}
        with open(self.stderr_path, "wb") as stderr:
            self.process = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL, env=env
            )
        self.address = self._wait_for_address()

    def _wait_for_address(self, timeout: float = 30.0) -> str:
        """Reads "trainerd listening on HOST:PORT ..." from its standard output, then keeps
        draining that pipe so that the daemon never blocks on it."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout
        text = ""
        marker = "listening on "
        while time.monotonic() < deadline and marker not in text.split("\n", 1)[0]:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                data = os.read(fd, 4096)
                if not data:
                    break
                text += data.decode(errors="replace")
            elif self.process.poll() is not None:
                break
        first = text.split("\n", 1)[0]
        if marker not in first or "\n" not in text:
            self.stop()
            raise RuntimeError(f"trainerd did not start: {self.stderr_path.read_text()}")
        threading.Thread(target=self._drain, args=(fd,), daemon=True).start()
        return first.split(marker, 1)[1].split(" ", 1)[0]

    def _drain(self, fd: int) -> None:
        try:
            while os.read(fd, 4096):
                pass
        except OSError:
            pass

    def stop(self) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


@pytest.fixture(scope="session")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    process = Daemon(tmp_path_factory.mktemp("trainerd"), [])
    yield process
    assert process.stop() == 0, process.stderr_path.read_text()[-2000:]


@pytest.fixture(scope="session")
def client(daemon: Daemon) -> Iterator[trainerd.Client]:
    with trainerd.Client(daemon.address) as c:
        yield c


@pytest.fixture(autouse=True)
def _no_settings_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each test starts without the user's settings: no address or token from the environment,
    and an empty contexts file."""
    for name in ("TRAINERD_ADDR", "TRAINERD_TOKEN", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TRAINCTL_CONFIG", str(tmp_path / "trainctl-config.yaml"))


_names = itertools.count()


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    """A dataset name of its own for each test."""
    base = "".join(c if c.isalnum() else "-" for c in request.node.name)[:80]
    return f"{base}-{next(_names)}"


# --- Data ----------------------------------------------------------------------------------------


def seed_data(rows: int = 400, seed: int = 42) -> tuple[np.ndarray, np.ndarray]:
    """y = 1 + 2x + noise: the C++ end-to-end tests' seed dataset, as arrays (float32)."""
    rng = np.random.default_rng(seed)
    x = rng.random((rows, 1), dtype=np.float32)
    y = (1 + 2 * x + 0.1 * rng.standard_normal((rows, 1))).astype(np.float32)
    return x, y


def class_data(rows: int = 300, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Three Gaussian blobs in 2-D with int64 labels."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, size=rows, dtype=np.int64)
    centers = np.array([[0.0, 0.0], [3.0, 0.0], [0.0, 3.0]], dtype=np.float32)
    x = (centers[y] + 0.5 * rng.standard_normal((rows, 2))).astype(np.float32)
    return x, y


@pytest.fixture(scope="session")
def seed_dataset(client: trainerd.Client) -> trainerd.Dataset:
    """The seed data, uploaded once for the job tests."""
    x, y = seed_data()
    return client.upload("seed", x, y)


def run_trainctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    binary = trainctl_bin()
    if not binary.exists():
        pytest.skip(f"no trainctl binary at {binary}")
    return subprocess.run(
        [str(binary), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )


# --- Security: tokens and TLS ------------------------------------------------------------------

TOKEN = "s3cret-token-for-tests"


@pytest.fixture(scope="session")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tokens") / "tokens"
    path.write_text(f"# trainerd's tokens\nalice:{TOKEN}\n")
    return path


@pytest.fixture(scope="session")
def token_daemon(tmp_path_factory: pytest.TempPathFactory, token_file: Path) -> Iterator[Daemon]:
    """A daemon that wants 'authorization: Bearer <token>' on every call."""
    process = Daemon(tmp_path_factory.mktemp("trainerd-token"), [f"--auth_token_file={token_file}"])
    yield process
    process.stop()


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _sign(directory: Path, ca: tuple[Path, Path], name: str, server: bool) -> tuple[Path, Path]:
    cert, key, csr, ext = (directory / f"{name}.{s}" for s in ("crt", "key", "csr", "ext"))
    ext.write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
        if server
        else "extendedKeyUsage=clientAuth\n"
    )
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(csr))
    _openssl("x509", "-req", "-days", "1", "-in", str(csr), "-CA", str(ca[0]), "-CAkey",
             str(ca[1]), "-set_serial", str(abs(hash(name)) % 10**9), "-extfile", str(ext),
             "-out", str(cert))
    return cert, key


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA, a server certificate for localhost and 127.0.0.1, and a client certificate for
    'alice' (as tests/support/certificates.cc makes them, with the openssl command)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command")
    directory = tmp_path_factory.mktemp("pki")
    ca = (directory / "ca.crt", directory / "ca.key")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-days", "1", "-subj", "/CN=trainerd test CA", "-keyout", str(ca[1]),
             "-out", str(ca[0]))
    server = _sign(directory, ca, "localhost", server=True)
    client = _sign(directory, ca, "alice", server=False)
    return {
        "ca": ca[0],
        "server_cert": server[0],
        "server_key": server[1],
        "client_cert": client[0],
        "client_key": client[1],
    }


@pytest.fixture(scope="session")
def tls_daemon(tmp_path_factory: pytest.TempPathFactory, pki: dict[str, Path]) -> Iterator[Daemon]:
    """A daemon serving mutual TLS: its certificate is the test CA's, and it wants a client
    certificate the same CA signed."""
    process = Daemon(
        tmp_path_factory.mktemp("trainerd-tls"),
        [
            f"--tls_cert_file={pki['server_cert']}",
            f"--tls_key_file={pki['server_key']}",
            f"--tls_client_ca_file={pki['ca']}",
        ],
    )
    yield process
    process.stop()
