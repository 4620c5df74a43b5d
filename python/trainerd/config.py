"""Where the client connects and with which credentials: the same settings, in the same order, as
trainctl's (client/contexts.h and client/connection.h in the trainerd repository).

1. The arguments of :class:`trainerd.Client` (``address``, ``token``, ``token_file``, ``tls_*``).
2. ``$TRAINERD_ADDR`` for the address, ``$TRAINERD_TOKEN`` for the token.
3. trainctl's contexts file: ``$TRAINCTL_CONFIG``, else ``$XDG_CONFIG_HOME/trainctl/config.yaml``,
   else ``~/.config/trainctl/config.yaml``. With ``context=NAME`` that context supplies the address
   (unless ``address`` was given) and each credential file not given as an argument. Without one,
   the file's current context does the same, but only when neither ``address`` nor
   ``$TRAINERD_ADDR`` chose the address: a context's token never goes to another address.
4. trainctl's default address, ``127.0.0.1:50051``.

An address without a port gets trainctl's default port, 50051: ``Client("localhost")`` dials
``localhost:50051`` (gRPC alone would dial 443). A port given wins; ``unix:`` paths and other
gRPC target schemes are used as given.

Example::

    settings = resolve_settings(context="gpu1")
    print(settings.address, settings.context)
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from trainerd.errors import ConfigError

__all__ = [
    "DEFAULT_ADDRESS",
    "DEFAULT_PORT",
    "ClientContext",
    "ClientConfig",
    "Settings",
    "config_path",
    "load_config",
    "read_token_file",
    "resolve_settings",
    "with_default_port",
]

#: trainctl's default address (client/cli.h, kDefaultAddress).
DEFAULT_ADDRESS = "127.0.0.1:50051"
#: The port of an address given without one (trainctl's and trainerd's default).
DEFAULT_PORT = 50051

_CONTEXT_KEYS = {
    "name": "name",
    "address": "address",
    "token-file": "token_file",
    "tls-ca": "tls_ca",
    "tls-cert": "tls_cert",
    "tls-key": "tls_key",
    "tls-server-name": "tls_server_name",
}
_MAX_CONFIG_BYTES = 1 << 20
_TOKEN_NAME_CHARS = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._@-"
)


@dataclasses.dataclass(frozen=True)
class ClientContext:
    """One context of trainctl's config file: a named address and its credential files."""

    name: str
    address: str = ""
    token_file: str = ""
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    tls_server_name: str = ""


@dataclasses.dataclass(frozen=True)
class ClientConfig:
    """trainctl's config file: its contexts and which one is current ("" for none)."""

    current_context: str = ""
    contexts: tuple[ClientContext, ...] = ()

    def find(self, name: str) -> ClientContext | None:
        """The context called ``name``, or None."""
        for context in self.contexts:
            if context.name == name:
                return context
        return None


@dataclasses.dataclass(frozen=True)
class Settings:
    """The resolved settings of a client (see the module's documentation for the order)."""

    address: str
    token: str = dataclasses.field(default="", repr=False)
    token_source: str = ""  # "token", "token_file", "$TRAINERD_TOKEN" or ""
    use_tls: bool = False
    tls_ca_pem: bytes | None = dataclasses.field(default=None, repr=False)
    tls_cert_pem: bytes | None = dataclasses.field(default=None, repr=False)
    tls_key_pem: bytes | None = dataclasses.field(default=None, repr=False)
    tls_server_name: str = ""
    context: str = ""  # the context that applied, "" for none
    address_source: str = "default"  # "argument", "$TRAINERD_ADDR", "context NAME" or "default"


_TARGET_SCHEMES = ("unix:", "unix-abstract:", "vsock:", "ipv4:", "ipv6:", "dns:", "xds:")


def with_default_port(address: str) -> str:
    """``address`` with :data:`DEFAULT_PORT` added when it names a host without a port:
    "localhost" becomes "localhost:50051", "[::1]" and "::1" become "[::1]:50051". An address
    with a port, a ``unix:`` path and any other gRPC target scheme ("dns:///host:port") is
    returned as given."""
    text = address.strip()
    if not text or "://" in text or text.lower().startswith(_TARGET_SCHEMES):
        return address
    if text.startswith("["):
        close = text.find("]")
        if close > 0 and close == len(text) - 1:
            return f"{text}:{DEFAULT_PORT}"
        return address
    colons = text.count(":")
    if colons == 0:
        return f"{text}:{DEFAULT_PORT}"
    if colons >= 2:  # an IPv6 literal without brackets has no port
        return f"[{text}]:{DEFAULT_PORT}"
    return address


def config_path(environ: Mapping[str, str] | None = None) -> Path:
    """trainctl's config file: $TRAINCTL_CONFIG, else $XDG_CONFIG_HOME/trainctl/config.yaml, else
    $HOME/.config/trainctl/config.yaml."""
    env = os.environ if environ is None else environ
    if env.get("TRAINCTL_CONFIG"):
        return Path(env["TRAINCTL_CONFIG"])
    if env.get("XDG_CONFIG_HOME"):
        return Path(env["XDG_CONFIG_HOME"]) / "trainctl" / "config.yaml"
    return Path(env.get("HOME", "")) / ".config" / "trainctl" / "config.yaml"


def _malformed(path: Path, why: str) -> ConfigError:
    return ConfigError(f"config file '{path}': {why}")


def load_config(path: str | os.PathLike[str] | None = None) -> ClientConfig:
    """Reads trainctl's config file (``config_path()`` when ``path`` is None). A file that does not
    exist is an empty config. :class:`ConfigError` naming the file for YAML that does not parse or
    does not have trainctl's shape (unknown keys included, as trainctl refuses them)."""
    file = config_path() if path is None else Path(path)
    if not file.exists():
        return ClientConfig()
    try:
        if file.stat().st_size > _MAX_CONFIG_BYTES:
            raise _malformed(file, "larger than 1 MiB")
        text = file.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read config file '{file}': {e.strerror or e}") from e
    try:
        root: Any = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise _malformed(file, str(e).replace("\n", " ")) from e
    if root is None:
        return ClientConfig()
    if not isinstance(root, dict):
        raise _malformed(file, "not a mapping of current-context and contexts")
    current = ""
    contexts: list[ClientContext] = []
    for key, value in root.items():
        if key == "current-context":
            current = "" if value is None else str(value)
        elif key == "contexts":
            if value is None:
                continue
            if not isinstance(value, list):
                raise _malformed(file, "contexts is not a list")
            for item in value:
                if not isinstance(item, dict):
                    raise _malformed(file, "a context is not a mapping")
                fields: dict[str, str] = {}
                for field_key, field_value in item.items():
                    if field_key not in _CONTEXT_KEYS:
                        raise _malformed(file, f"unknown key '{field_key}' in a context")
                    if field_value is None:
                        continue
                    if isinstance(field_value, (dict, list)):
                        raise _malformed(file, f"'{field_key}' is not a string")
                    fields[_CONTEXT_KEYS[str(field_key)]] = str(field_value)
                if not fields.get("name"):
                    raise _malformed(file, "a context has no name")
                if any(c.name == fields["name"] for c in contexts):
                    raise _malformed(file, f"context '{fields['name']}' appears twice")
                contexts.append(ClientContext(**fields))
        else:
            raise _malformed(file, f"unknown key '{key}'")
    return ClientConfig(current_context=current, contexts=tuple(contexts))


def read_token_file(path: str | os.PathLike[str], *, what: str = "token_file") -> str:
    """The token in a token file, read as trainctl reads --token-file: its first line that is not
    blank or a '#' comment, without a "NAME:" prefix (trainerd's token files allow one)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{what}: cannot read '{path}': {e.strerror or e}") from e
    for raw in text.split("\n"):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        colon = line.find(":")
        if colon > 0 and all(c in _TOKEN_NAME_CHARS for c in line[:colon]):
            line = line[colon + 1 :]
        if line:
            return line
        break
    raise ConfigError(f"{what}: '{path}' holds no token")


def _read_pem(what: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"{what}: cannot read '{path}': {e.strerror or e}") from e


def resolve_settings(
    address: str | None = None,
    *,
    context: str | None = None,
    token: str | None = None,
    token_file: str | os.PathLike[str] | None = None,
    tls_ca: str | os.PathLike[str] | None = None,
    tls_cert: str | os.PathLike[str] | None = None,
    tls_key: str | os.PathLike[str] | None = None,
    tls_server_name: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """The address and credentials a client uses, decided as trainctl decides them (see the
    module's documentation). Reads the files named (token, TLS); :class:`ConfigError` when one
    cannot be read, when the context is not in the config file, or for a certificate without its
    key."""
    env = os.environ if environ is None else environ
    address_given = bool(address)
    env_address = env.get("TRAINERD_ADDR", "")
    resolved_address = address or env_address or DEFAULT_ADDRESS
    address_source = (
        "argument" if address_given else ("$TRAINERD_ADDR" if env_address else "default")
    )
    files = {
        "token_file": os.fspath(token_file) if token_file else "",
        "tls_ca": os.fspath(tls_ca) if tls_ca else "",
        "tls_cert": os.fspath(tls_cert) if tls_cert else "",
        "tls_key": os.fspath(tls_key) if tls_key else "",
    }
    server_name = tls_server_name or ""

    # The config file is read only when a context may be wanted: a client given an address works
    # whatever state the file is in (as trainctl with --addr).
    applied: ClientContext | None = None
    if context or (not address_given and not env_address):
        path = config_path(env)
        config = load_config(path)
        if context:
            applied = config.find(context)
            if applied is None:
                raise ConfigError(
                    f"no context '{context}' in {path} (see trainctl config get-contexts)"
                )
        elif config.current_context:
            applied = config.find(config.current_context)
            if applied is None:
                raise ConfigError(
                    f"the current context '{config.current_context}' is not in {path} "
                    "(see trainctl config use-context)"
                )
    if applied is not None:
        if not address_given and applied.address:
            resolved_address = applied.address
            address_source = f"context {applied.name}"
        for key in files:
            if not files[key]:
                files[key] = getattr(applied, key)
        server_name = server_name or applied.tls_server_name

    resolved_token = ""
    token_source = ""
    if token:
        resolved_token, token_source = token.strip(), "token"
    elif files["token_file"]:
        resolved_token, token_source = read_token_file(files["token_file"]), "token_file"
    elif env.get("TRAINERD_TOKEN") is not None:
        resolved_token = env["TRAINERD_TOKEN"].strip()
        token_source = "$TRAINERD_TOKEN" if resolved_token else ""

    if bool(files["tls_cert"]) != bool(files["tls_key"]):
        raise ConfigError("a client certificate needs both tls_cert and tls_key")
    use_tls = bool(files["tls_ca"] or files["tls_cert"] or server_name)
    return Settings(
        address=with_default_port(resolved_address),
        token=resolved_token,
        token_source=token_source,
        use_tls=use_tls,
        tls_ca_pem=_read_pem("tls_ca", files["tls_ca"]) if files["tls_ca"] else None,
        tls_cert_pem=_read_pem("tls_cert", files["tls_cert"]) if files["tls_cert"] else None,
        tls_key_pem=_read_pem("tls_key", files["tls_key"]) if files["tls_key"] else None,
        tls_server_name=server_name,
        context=applied.name if applied is not None else "",
        address_source=address_source,
    )
