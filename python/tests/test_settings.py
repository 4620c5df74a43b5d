"""Where the client connects and with which credentials, decided as trainctl decides it: the
arguments, $TRAINERD_ADDR / $TRAINERD_TOKEN, trainctl's contexts file (written here by the real
trainctl), the default address; tokens and mutual TLS against real daemons."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import trainerd
import trainerd.aio
from conftest import TOKEN, Daemon, run_trainctl
from trainerd.config import (
    DEFAULT_ADDRESS,
    config_path,
    load_config,
    resolve_settings,
    with_default_port,
)


def set_context(config: Path, name: str, *flags: str) -> None:
    result = run_trainctl(*flags, "config", "set-context", name, env={"TRAINCTL_CONFIG": str(config)})
    assert result.returncode == 0, result.stderr


# --- Resolution -------------------------------------------------------------------------------


def test_config_path_follows_trainctl() -> None:
    assert config_path({"TRAINCTL_CONFIG": "/a/b.yaml", "XDG_CONFIG_HOME": "/x"}) == Path(
        "/a/b.yaml"
    )
    assert config_path({"XDG_CONFIG_HOME": "/x", "HOME": "/h"}) == Path("/x/trainctl/config.yaml")
    assert config_path({"HOME": "/h"}) == Path("/h/.config/trainctl/config.yaml")


def test_default_address_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_settings().address == DEFAULT_ADDRESS
    monkeypatch.setenv("TRAINERD_ADDR", "10.0.0.1:1234")
    monkeypatch.setenv("TRAINERD_TOKEN", " tok \n")
    settings = resolve_settings()
    assert (settings.address, settings.address_source) == ("10.0.0.1:1234", "$TRAINERD_ADDR")
    assert (settings.token, settings.token_source) == ("tok", "$TRAINERD_TOKEN")
    explicit = resolve_settings("unix:/run/t.sock", token="mine")
    assert (explicit.address, explicit.token) == ("unix:/run/t.sock", "mine")


def test_address_without_port_gets_trainctls_port(monkeypatch: pytest.MonkeyPatch) -> None:
    assert trainerd.Client("localhost").address == "localhost:50051"
    assert trainerd.Client("localhost:1234").address == "localhost:1234"  # a port given wins
    assert trainerd.aio.Client("gpu-node-1").address == "gpu-node-1:50051"
    assert with_default_port("10.0.0.7") == "10.0.0.7:50051"
    assert with_default_port("[::1]") == "[::1]:50051"
    assert with_default_port("::1") == "[::1]:50051"
    assert with_default_port("[::1]:7000") == "[::1]:7000"
    for target in ("unix:/run/t.sock", "unix-abstract:trainerd", "dns:///node:9000",
                   "ipv4:10.0.0.1:5"):
        assert with_default_port(target) == target
    monkeypatch.setenv("TRAINERD_ADDR", "node-3")
    assert resolve_settings().address == "node-3:50051"


def test_contexts_file_written_by_trainctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = Path(os.environ["TRAINCTL_CONFIG"])
    token = tmp_path / "gpu1.token"
    token.write_text("# comment\n\nalice:abc123\n")
    set_context(config, "gpu1", "--addr", "gpu-node-1:50051", "--token-file", str(token))
    set_context(config, "gpu2", "--addr", "gpu-node-2:50051", "--tls-ca", str(token),
                "--tls-server-name", "node2")
    parsed = load_config(config)
    assert parsed.current_context == "gpu1"  # the first one set becomes current
    assert [c.name for c in parsed.contexts] == ["gpu1", "gpu2"]

    current = resolve_settings()
    assert (current.address, current.context, current.token) == ("gpu-node-1:50051", "gpu1", "abc123")
    named = resolve_settings(context="gpu2")
    assert named.address == "gpu-node-2:50051"
    assert named.use_tls and named.tls_server_name == "node2"
    assert named.token == ""
    # An explicit address keeps the context's credentials only when the context is named.
    assert resolve_settings("elsewhere:1", context="gpu1").token == "abc123"
    assert resolve_settings("elsewhere:1").token == ""
    # $TRAINERD_ADDR chose the address: the current context's token does not go there.
    monkeypatch.setenv("TRAINERD_ADDR", "other:2")
    from_env = resolve_settings()
    assert (from_env.address, from_env.context, from_env.token) == ("other:2", "", "")
    with pytest.raises(trainerd.ConfigError, match="no context 'nope'"):
        trainerd.Client(context="nope")


def test_malformed_contexts_file(tmp_path: Path) -> None:
    config = Path(os.environ["TRAINCTL_CONFIG"])
    config.write_text("current-context: a\ncontexts:\n  - name: a\n    adress: x:1\n")
    with pytest.raises(trainerd.ConfigError, match="unknown key 'adress'"):
        trainerd.Client()
    trainerd.Client("127.0.0.1:1")  # an explicit address does not read the file
    config.write_text("current-context: gone\ncontexts: []\n")
    with pytest.raises(trainerd.ConfigError, match="current context 'gone'"):
        trainerd.Client()
    config.write_text("contexts: [unclosed\n")
    with pytest.raises(trainerd.ConfigError, match=str(config)):
        trainerd.Client()


def test_credential_files_are_checked(tmp_path: Path) -> None:
    empty = tmp_path / "empty.token"
    empty.write_text("# nothing\n\n")
    with pytest.raises(trainerd.ConfigError, match="holds no token"):
        trainerd.Client("x:1", token_file=empty)
    with pytest.raises(trainerd.ConfigError, match="cannot read"):
        trainerd.Client("x:1", token_file=tmp_path / "missing")
    with pytest.raises(trainerd.ConfigError, match="both tls_cert and tls_key"):
        trainerd.Client("x:1", tls_cert=empty)


def test_client_reaches_the_daemon_through_a_trainctl_context(daemon: Daemon) -> None:
    config = Path(os.environ["TRAINCTL_CONFIG"])
    set_context(config, "local", "--addr", daemon.address)
    with trainerd.Client(context="local") as client:
        assert client.address == daemon.address
        assert client.health() == "SERVING"
        assert client.version().trainerd
    with trainerd.Client() as client:  # the current context
        assert client.address == daemon.address
        assert client.version().trainerd


# --- Errors of the connection ---------------------------------------------------------------


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf"), True, "5"])
def test_a_timeout_that_is_not_a_positive_finite_number_is_refused(timeout: object) -> None:
    for client_class in (trainerd.Client, trainerd.aio.Client):
        with pytest.raises(ValueError, match="timeout must be a positive, finite number"):
            client_class("127.0.0.1:1", timeout=timeout)  # type: ignore[arg-type]



def test_unreachable_daemon_is_unavailable_naming_the_address() -> None:
    client = trainerd.Client("127.0.0.1:1", timeout=5)
    with pytest.raises(trainerd.Unavailable, match=r"cannot reach trainerd at 127\.0\.0\.1:1") as e:
        client.datasets()
    assert e.value.code is not None and e.value.code.name == "UNAVAILABLE"
    assert e.value.address == "127.0.0.1:1"
    with pytest.raises(trainerd.Unavailable, match="127.0.0.1:1"):
        client.health()


def test_daemon_of_another_major_version_is_incompatible(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trainerd._connection as module

    monkeypatch.setattr(module, "__version__", "1.0.0")  # this client, as a 1.x
    client = trainerd.Client(daemon.address)
    with pytest.raises(trainerd.IncompatibleDaemon, match=r"is version 0\.1\.0.*needs a trainerd 1\.x"):
        client.datasets()
    assert trainerd.Client(daemon.address, check_version=False).datasets() is not None


# --- Tokens -------------------------------------------------------------------------------------


def test_token_daemon_wants_a_token(token_daemon: Daemon, token_file: Path) -> None:
    anonymous = trainerd.Client(token_daemon.address)
    assert anonymous.health() == "SERVING"  # the health service needs no token
    with pytest.raises(trainerd.Unauthenticated, match="give token= or token_file="):
        anonymous.datasets()
    wrong = trainerd.Client(token_daemon.address, token="wrong")
    with pytest.raises(trainerd.Unauthenticated, match="check the token"):
        wrong.datasets()
    assert trainerd.Client(token_daemon.address, token=TOKEN).datasets() == []
    # trainerd's own token file ("alice:TOKEN") works as a client token file.
    assert trainerd.Client(token_daemon.address, token_file=token_file).datasets() == []


def test_token_from_environment_and_context(
    token_daemon: Daemon, token_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINERD_TOKEN", TOKEN)
    assert trainerd.Client(token_daemon.address).version().trainerd
    monkeypatch.delenv("TRAINERD_TOKEN")
    config = Path(os.environ["TRAINCTL_CONFIG"])
    set_context(config, "secure", "--addr", token_daemon.address, "--token-file", str(token_file))
    import numpy as np

    with trainerd.Client(context="secure") as client:
        ds = client.upload("mine", np.ones((4, 2), np.float32), np.ones(4, np.float32))
        assert ds.owner == "alice"


# --- TLS -----------------------------------------------------------------------------------------


def test_mutual_tls(tls_daemon: Daemon, pki: dict[str, Path]) -> None:
    with trainerd.Client(
        tls_daemon.address,
        tls_ca=pki["ca"],
        tls_cert=pki["client_cert"],
        tls_key=pki["client_key"],
    ) as client:
        assert client.version().trainerd
        job_free = client.datasets()
        assert job_free == []
        assert client.health() == "SERVING"
    # Over plaintext the handshake never happens: Unavailable, naming the address, with a hint.
    plain = trainerd.Client(tls_daemon.address, timeout=5)
    with pytest.raises(trainerd.Unavailable, match=f"{tls_daemon.address}.*give tls_ca"):
        plain.datasets()
    # TLS without a client certificate: refused at the handshake.
    no_certificate = trainerd.Client(tls_daemon.address, tls_ca=pki["ca"], timeout=5)
    with pytest.raises(trainerd.Unavailable, match="for mutual TLS, tls_cert and tls_key"):
        no_certificate.datasets()
    # A certificate that does not name the address.
    wrong_name = trainerd.Client(
        tls_daemon.address, tls_ca=pki["ca"], tls_server_name="elsewhere.example", timeout=5
    )
    with pytest.raises(trainerd.Unavailable, match="check tls_ca, tls_server_name"):
        wrong_name.datasets()
