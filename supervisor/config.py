"""The TOML configuration file: read into the Structs of wire/config.py, errors that name the line."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Annotated

import msgspec

from mcpvisor.runtime.trust import exposure_problem
from mcpvisor.store.state_url import check_url
from mcpvisor.wire import sandboxing
from mcpvisor.wire.config import (
    REGISTRY_ID,
    TENANT_NAME,
    ConfigError,
    OAuthResourceConfig,
    PolicyConfig,
    RegistryConfig,
    SearchConfig,
    ServerConfig,
    Settings,
    TelemetryConfig,
    TenantConfig,
    parse_listen,
    server_name_problem,
)
from mcpvisor.wire.secrets import SECRET_REF
from mcpvisor.wire.tenant_secrets import PLACEHOLDER

_SAMPLE_TENANT = "TENANT0"  # a valid tenant name, standing in for `{tenant}` when a reference is checked


class Config(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """The whole file: `[mcpvisor]` settings, then one table per server, registry and tenant.

    An unknown key is an error that names the key and its line; `mcpvisor check -c FILE` checks a
    file without starting anything.
    """

    mcpvisor: Annotated[Settings, msgspec.Meta(description="The listener, the endpoints, limits and the data dir.")] = (
        msgspec.field(default_factory=Settings)
    )
    servers: Annotated[dict[str, ServerConfig], msgspec.Meta(description="The upstream MCP servers, by name.")] = {}
    registries: Annotated[
        dict[str, RegistryConfig],
        msgspec.Meta(description="MCP registries that clients may search for servers to propose, by id."),
    ] = {}
    tenants: Annotated[
        dict[str, TenantConfig],
        msgspec.Meta(description="Tenants of a shared host, by name: each one's servers, limits and tokens."),
    ] = {}
    oauth: Annotated[
        OAuthResourceConfig | None,
        msgspec.Meta(description="Accept JWT access tokens of an OAuth issuer (mcpvisor as a resource server)."),
    ] = None
    search: Annotated[
        SearchConfig,
        msgspec.Meta(description="Tool search: the size of retrieve_tools' answers, an optional embedding service."),
    ] = msgspec.field(default_factory=SearchConfig)
    policy: Annotated[
        PolicyConfig | None,
        msgspec.Meta(description="Cedar policies: who may see and call which tool; operator approvals; tool limits."),
    ] = None
    telemetry: Annotated[
        TelemetryConfig,
        msgspec.Meta(description="OpenTelemetry traces and metrics, as the standard OTEL_* variables set them."),
    ] = msgspec.field(default_factory=TelemetryConfig)

    @property
    def authenticated(self) -> bool:
        """Every client presents a token: tenants or an OAuth issuer are configured."""
        return bool(self.tenants) or self.oauth is not None


def needs_sandbox(config: Config) -> bool:
    """Whether any server's process of this config runs in a sandbox (tenants' always do)."""
    for name, server in config.servers.items():
        tenants = [t for t in config.tenants.values() if name in t.servers]
        if any(sandboxing.wanted(config.mcpvisor, server, tenant) for tenant in [None, *tenants]):
            return True
    return False


def default_data_dir() -> Path:
    """systemd's StateDirectory, else the XDG data dir."""
    if (sd := os.environ.get("STATE_DIRECTORY")) is not None:
        return Path(sd.split(":")[0])
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "mcpvisor"


def data_dir(config: Config, config_path: Path | None = None) -> Path:
    if config.mcpvisor.data_dir:
        path = Path(os.path.expanduser(config.mcpvisor.data_dir))
        if not path.is_absolute() and config_path is not None:
            path = config_path.parent / path
        return path
    return default_data_dir()


def load(path: Path) -> Config:
    """Read and check a config file; raises ConfigError with a one-line message."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return loads(text, source=str(path))


def loads(text: str, *, source: str = "<config>") -> Config:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    try:
        config = msgspec.convert(raw, Config)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {_describe(_locate(raw, str(exc)), text)}") from None
    _check(config, text, source)
    return config


def _check(config: Config, text: str, source: str) -> None:
    try:
        parse_listen(config.mcpvisor.listen)
    except ConfigError as exc:
        raise ConfigError(f"{source}:{_line_of(text, ['mcpvisor', 'listen']) or '?'}: {exc}") from None
    # Here rather than at start-up alone, so that a reload cannot open the listener either.
    if (problem := exposure_problem(config.mcpvisor, authenticated=config.authenticated)) is not None:
        raise ConfigError(f"{source}:{_line_of(text, ['mcpvisor', 'listen']) or '?'}: {problem}")
    if config.mcpvisor.state_url is not None:
        try:
            check_url(config.mcpvisor.state_url)
        except ConfigError as exc:
            raise ConfigError(f"{source}:{_line_of(text, ['mcpvisor', 'state_url']) or '?'}: {exc}") from None
    for name, server in config.servers.items():
        where = f"{source}:{_line_of(text, ['servers', name]) or '?'}"
        if (problem := server_name_problem(name)) is not None:
            raise ConfigError(f"{where}: server name {name!r} {problem}")
        if (problem := server.problem()) is not None:
            raise ConfigError(f"{where}: server {name!r}: {problem}")
        for table in (server.env, server.headers):
            for key, value in table.items():
                # A reference may name the tenant: the variable is checked with a tenant's name in place.
                for kind, ref in SECRET_REF.findall(value.replace(PLACEHOLDER, _SAMPLE_TENANT)):
                    if kind == "env" and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", ref):
                        written = ref.replace(_SAMPLE_TENANT, PLACEHOLDER)
                        raise ConfigError(f"{where}: server {name!r}: {key}: bad variable name in ${{env:{written}}}")
    for rid, registry in config.registries.items():
        _check_registry(rid, registry, f"{source}:{_line_of(text, ['registries', rid]) or '?'}")
    for tenant_name, tenant in config.tenants.items():
        _check_tenant(tenant_name, tenant, config, f"{source}:{_line_of(text, ['tenants', tenant_name]) or '?'}")
    if config.oauth is not None:
        where = f"{source}:{_line_of(text, ['oauth']) or '?'}"
        for key in ("issuer", "resource", "jwks_uri"):
            value = getattr(config.oauth, key)
            if value is not None and not value.startswith(("https://", "http://")):
                raise ConfigError(f"{where}: oauth.{key} must be an http(s) URL")


def _check_tenant(name: str, tenant: TenantConfig, config: Config, where: str) -> None:
    if not TENANT_NAME.match(name):
        raise ConfigError(
            f"{where}: tenant name {name!r} must be letters, digits, '_', '-' or '.' (no ':' or '/'),"
            " at most 63 characters"
        )
    unknown = [server for server in tenant.servers if server not in config.servers]
    if unknown:
        raise ConfigError(f"{where}: tenant {name!r}: no [servers.{unknown[0]}] for the name in its servers list")


def _check_registry(rid: str, registry: RegistryConfig, where: str) -> None:
    if not REGISTRY_ID.match(rid):
        raise ConfigError(f"{where}: registry id {rid!r} must be 1-64 letters, digits, '_' or '-'")
    if not registry.url.startswith(("http://", "https://")):
        raise ConfigError(f"{where}: registry {rid!r}: url must start with http:// or https://")
    if registry.token is not None and not SECRET_REF.fullmatch(registry.token):
        raise ConfigError(
            f"{where}: registry {rid!r}: token must be a secret reference, ${{env:NAME}} or ${{file:PATH}},"
            " never the token itself"
        )


_UNKNOWN_FIELD = re.compile(r"Object contains unknown field `([^`]+)`(?: - at `\$(.*)`)?")
_AT_PATH = re.compile(r" - at `\$(.*)`$")


def _locate(raw: dict, message: str) -> str:
    """msgspec writes dict keys as `[...]`: find the server or registry (and the key within it) that failed."""
    table, struct = ("servers", ServerConfig)
    if "$.registries[...]" in message:
        table, struct = ("registries", RegistryConfig)
    elif "$.tenants[...]" in message:
        table, struct = ("tenants", TenantConfig)
    if f"$.{table}[...]" not in message or not isinstance(raw.get(table), dict):
        return message
    for name, value in raw[table].items():
        try:
            msgspec.convert(value, struct)
        except msgspec.ValidationError as exc:
            inner = str(exc)
            inner = (
                inner.replace("`$", f"`$.{table}['{name}']", 1)
                if " - at `$" in inner
                else f"{inner} - at `$.{table}['{name}']`"
            )
            if "[...]" in inner and isinstance(value, dict):
                for table in ("env", "headers"):
                    bad = [k for k, v in (value.get(table) or {}).items() if not isinstance(v, str)]
                    if bad and f".{table}[...]" in inner:
                        inner = inner.replace(f".{table}[...]", f".{table}['{bad[0]}']")
            return inner
    return message


def _describe(message: str, text: str) -> str:
    """Turn a msgspec message into one naming the TOML key and its line."""
    if m := _UNKNOWN_FIELD.match(message):
        key, path = m.group(1), _split_path(m.group(2) or "")
        line = _line_of(text, [*path, key])
        dotted = ".".join([*path, key])
        return f"line {line}: unknown key `{dotted}`" if line else f"unknown key `{dotted}`"
    if m := _AT_PATH.search(message):
        path = _split_path(m.group(1))
        line = _line_of(text, path)
        what = message[: m.start()]
        dotted = ".".join(path)
        return f"line {line}: `{dotted}`: {what}" if line else f"`{dotted}`: {what}"
    return message


def _split_path(path: str) -> list[str]:
    """`.servers.time.args[0]` or `.servers['a b']` -> ['servers', 'time', 'args']."""
    parts: list[str] = []
    for m in re.finditer(r"\.([A-Za-z0-9_-]+)|\['((?:[^'\\]|\\.)*)'\]|\[\d+\]", path):
        if m.group(1) is not None:
            parts.append(m.group(1))
        elif m.group(2) is not None:
            parts.append(m.group(2))
    return parts


_TABLE = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(?:#.*)?$")
_KEY = re.compile(r"^\s*([A-Za-z0-9_.\"' -]+?)\s*=")


_KEY_PART = re.compile(r"\s*(?:\"((?:[^\"\\]|\\.)*)\"|'([^']*)'|([^.\"'\s]+))\s*")


def _normalize_key(key: str) -> list[str]:
    """`servers."my.server".policy` -> ['servers', 'my.server', 'policy']: a quoted part keeps its dots."""
    return [next(g for g in m.groups() if g is not None) for m in _KEY_PART.finditer(key)]


def _line_of(text: str, path: list[str]) -> int | None:
    """Best-effort line number of the key (or table) at `path`; None when not found."""
    table: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if m := _TABLE.match(line):
            table = _normalize_key(m.group(1))
            if table == path:
                return number
            continue
        if m := _KEY.match(line):
            full = table + _normalize_key(m.group(1))
            if full == path:
                return number
            # An inline table (`policy = { startsecs = 1 }`) holds the deeper key on this line.
            if len(full) < len(path) and path[: len(full)] == full and "{" in line and path[-1] in line:
                return number
    return None
