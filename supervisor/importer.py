"""`mcpvisor import`: the servers other MCP clients are configured with.

Reads the `mcpServers` JSON of Claude Desktop, Cursor and VS Code (`servers`), Claude Code's
`~/.claude.json` (its own `mcpServers` and every project's), the Codex CLI's
`~/.codex/config.toml` (`[mcp_servers.NAME]`) and the Gemini CLI's `~/.gemini/settings.json`.
The format is recognised from the file; `fmt` forces one.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mcpvisor.supervisor import configstore
from mcpvisor.supervisor.config import Config, loads
from mcpvisor.wire.config import SERVER_NAME, ConfigError, ServerConfig

FORMATS = ("auto", "mcpservers", "claude-code", "codex", "gemini")

# Literal values under these keys are secrets: they are moved out of the config (see below).
_SECRET_KEY = re.compile(r"token|secret|key|password|credential|authorization", re.I)
# How clients write an environment variable inside a value: ${VAR}, ${VAR:-default}, ${env:VAR}; and a
# value that is just $VAR (a `$` inside other text is left alone: it may be part of a password).
_ENV_REFERENCE = re.compile(r"\$\{(?:env:)?([A-Za-z_][A-Za-z0-9_]*)(?::-[^}]*)?\}")
_WHOLE_ENV_REFERENCE = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
# Top-level keys only the Gemini CLI's settings.json has next to `mcpServers`.
_GEMINI_KEYS = {"mcp", "general", "ui", "model", "security", "tools", "context", "selectedAuthType", "theme"}
# Server keys only the Gemini CLI uses.
_GEMINI_SERVER_KEYS = {"httpUrl", "trust", "includeTools", "excludeTools", "oauth", "authProviderType"}


def _name(raw: str) -> str:
    """A valid server name from a client's key ("GitHub MCP" -> "GitHub-MCP")."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", raw).strip("-.")[:63] or "server"
    return name if SERVER_NAME.match(name) else f"s-{name}"[:63]


def _reference(key: str, value: str) -> str:
    if whole := _WHOLE_ENV_REFERENCE.fullmatch(value):
        return f"${{env:{whole.group(1)}}}"
    if "${" in value:
        return _ENV_REFERENCE.sub(lambda match: f"${{env:{match.group(1)}}}", value)
    # A secret pasted into a client's file is not copied into another file: the config refers to
    # an environment variable of the same name instead, to be set where mcpvisor runs.
    if _SECRET_KEY.search(key):
        variable = re.sub(r"[^A-Za-z0-9_]", "_", key).upper()
        prefix = value.split(" ", 1)[0] + " " if value.lower().startswith(("bearer ", "basic ")) else ""
        return f"{prefix}${{env:{variable}}}"
    return value


def _values(entry: dict[str, Any], field: str) -> dict[str, str]:
    values = entry.get(field) or {}
    if not isinstance(values, dict):
        raise ConfigError(f"`{field}` must be an object")
    return {str(key): _reference(str(key), str(value)) for key, value in values.items()}


def _table(entry: dict[str, Any], *, url_means_sse: bool = False) -> dict[str, Any]:
    """One client entry (the JSON shape all these clients share) as a server table."""
    table: dict[str, Any] = {}
    if entry.get("command"):
        table["command"] = str(entry["command"])
        if entry.get("args"):
            table["args"] = [str(arg) for arg in entry["args"]]
        if entry.get("cwd"):
            table["cwd"] = str(entry["cwd"])
    kind = str(entry.get("type") or entry.get("transport") or "").lower()
    if entry.get("httpUrl"):  # Gemini: streamable HTTP
        table["url"] = str(entry["httpUrl"])
        table["transport"] = "streamable-http"
    elif url := entry.get("url") or entry.get("serverUrl"):
        table["url"] = str(url)
        if kind == "sse" or (url_means_sse and kind not in ("http", "streamable-http")):
            table["transport"] = "sse"
        elif kind in ("http", "streamable-http", "streamablehttp"):
            table["transport"] = "streamable-http"
    for field in ("env", "headers"):
        if values := _values(entry, field):
            table[field] = values
    if entry.get("disabled") is True or entry.get("enabled") is False:
        table["enabled"] = False
    return table


def _codex_table(entry: dict[str, Any]) -> dict[str, Any]:
    """A Codex CLI `[mcp_servers.NAME]` table as a server table."""
    table = _table({key: value for key, value in entry.items() if key not in ("http_headers", "env_http_headers")})
    if "url" in table:
        table["transport"] = "streamable-http"
    headers = _values(entry, "http_headers")
    env_headers = entry.get("env_http_headers") or {}
    if not isinstance(env_headers, dict):
        raise ConfigError("`env_http_headers` must be a table")
    headers.update({str(key): f"${{env:{variable}}}" for key, variable in env_headers.items()})
    if variable := entry.get("bearer_token_env_var"):
        headers["Authorization"] = f"Bearer ${{env:{variable}}}"
    if headers:
        table["headers"] = headers
    return table


def _read(source: Path) -> str:
    try:
        return source.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{source}: not a text file") from None


def detect_format(source: Path, text: str) -> str:
    """Which client's file this is, from its content (and, for the Gemini CLI, its place)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        # A broken JSON object is reported as such; anything else is read as the Codex CLI's TOML.
        return "mcpservers" if text.lstrip().startswith("{") else "codex"
    if not isinstance(data, dict):
        return "mcpservers"
    if isinstance(data.get("projects"), dict):
        return "claude-code"
    servers = data.get("mcpServers")
    entries = [entry for entry in servers.values() if isinstance(entry, dict)] if isinstance(servers, dict) else []
    if (
        source.parent.name == ".gemini"
        or _GEMINI_KEYS & data.keys()
        or any(_GEMINI_SERVER_KEYS & entry.keys() for entry in entries)
    ):
        return "gemini"
    return "mcpservers"


def _json_entries(source: Path, text: str, fmt: str) -> Iterator[tuple[str, Any, str]]:
    """(name, entry, where) of each server of a JSON file."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source}: line {exc.lineno}: not JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: no `mcpServers` (or `servers`) object in it")
    servers = data.get("mcpServers")
    if servers is None and fmt == "mcpservers":
        servers = data.get("servers")  # VS Code's .vscode/mcp.json
    projects = data.get("projects") if fmt == "claude-code" else None
    if servers is None and isinstance(projects, dict):
        servers = {}
    if not isinstance(servers, dict):
        raise ConfigError(f"{source}: no `mcpServers` (or `servers`) object in it")
    for name, entry in servers.items():
        yield str(name), entry, ""
    if isinstance(projects, dict):
        for project, settings in projects.items():
            project_servers = settings.get("mcpServers") if isinstance(settings, dict) else None
            if isinstance(project_servers, dict):
                for name, entry in project_servers.items():
                    yield str(name), entry, str(project)


def _codex_entries(source: Path, text: str) -> Iterator[tuple[str, Any, str]]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not TOML: {exc}") from None
    servers = data.get("mcp_servers")
    if not isinstance(servers, dict):
        raise ConfigError(f"{source}: no [mcp_servers] tables in it")
    for name, entry in servers.items():
        yield str(name), entry, ""


def read_servers(source: Path, fmt: str = "auto") -> tuple[str, list[tuple[str, dict[str, Any] | str]]]:
    """The format of `source` and its servers as (name, server table or the reason it was skipped)."""
    if fmt not in FORMATS:
        raise ConfigError(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")
    text = _read(source)
    if fmt == "auto":
        fmt = detect_format(source, text)
    entries = _codex_entries(source, text) if fmt == "codex" else _json_entries(source, text, fmt)
    found: list[tuple[str, dict[str, Any] | str]] = []
    tables: dict[str, dict[str, Any]] = {}
    for raw_name, entry, project in entries:
        label = f"{raw_name} (project {project})" if project else raw_name
        if not isinstance(entry, dict) or not any(entry.get(key) for key in ("command", "url", "serverUrl", "httpUrl")):
            found.append((label, "neither a command nor a url"))
            continue
        try:
            table = _codex_table(entry) if fmt == "codex" else _table(entry, url_means_sse=fmt == "gemini")
        except ConfigError as exc:
            found.append((label, str(exc)))
            continue
        name = _name(raw_name)
        if project and name in tables:
            if tables[name] == table:
                continue  # the same server configured for several projects
            name = _name(f"{raw_name}-{Path(project).name}")
        tables[name] = table
        found.append((name, table))
    return fmt, found


def import_servers(
    source: Path, config: Config, *, replace: bool = False, fmt: str = "auto"
) -> tuple[Config, list[str], list[str]]:
    """Merge the servers of `source` into `config`: (new config, names added, names skipped)."""
    _fmt, found = read_servers(source, fmt)
    added: list[str] = []
    skipped: list[str] = []
    merged = dict(config.servers)
    for name, table in found:
        if isinstance(table, str):
            skipped.append(f"{name}: {table}")
            continue
        if name in merged and not replace:
            skipped.append(f"{name}: a server named {name!r} exists (use --replace)")
            continue
        try:
            server: ServerConfig = configstore.server_from_table(name, table, source=str(source))
        except ConfigError as exc:
            skipped.append(f"{name}: {exc}")
            continue
        merged[name] = server
        added.append(name)
    new = loads(configstore.dumps(Config(mcpvisor=config.mcpvisor, servers=merged)), source=str(source))
    return new, added, skipped
