"""`mcpvisor import`: servers from the `mcpServers` JSON of Claude Desktop, Cursor and VS Code."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from mcpvisor.supervisor import configstore
from mcpvisor.supervisor.config import Config, loads
from mcpvisor.wire.config import SERVER_NAME, ConfigError, ServerConfig

# Literal values under these keys are secrets: they are moved out of the config (see below).
_SECRET_KEY = re.compile(r"token|secret|key|password|credential|authorization", re.I)


def _name(raw: str) -> str:
    """A valid server name from a client's key ("GitHub MCP" -> "GitHub-MCP")."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", raw).strip("-.")[:63] or "server"
    return name if SERVER_NAME.match(name) else f"s-{name}"[:63]


def _table(entry: dict[str, Any]) -> dict[str, Any]:
    """One client entry as a server table; env/header values that look secret become ${env:...}."""
    table: dict[str, Any] = {}
    if "command" in entry:
        table["command"] = entry["command"]
        if entry.get("args"):
            table["args"] = [str(arg) for arg in entry["args"]]
        if entry.get("cwd"):
            table["cwd"] = entry["cwd"]
    url = entry.get("url") or entry.get("serverUrl")
    if url:
        table["url"] = url
        kind = str(entry.get("type") or entry.get("transport") or "").lower()
        if kind == "sse":
            table["transport"] = "sse"
        elif kind in ("http", "streamable-http", "streamablehttp"):
            table["transport"] = "streamable-http"
    for field in ("env", "headers"):
        values = entry.get(field) or {}
        if values:
            table[field] = {key: _reference(key, str(value)) for key, value in values.items()}
    if entry.get("disabled") is True:
        table["enabled"] = False
    return table


def _reference(key: str, value: str) -> str:
    # A secret pasted into a client's JSON is not copied into another file: the config refers to
    # an environment variable of the same name instead, to be set where mcpvisor runs.
    if _SECRET_KEY.search(key) and "${" not in value:
        variable = re.sub(r"[^A-Za-z0-9_]", "_", key).upper()
        prefix = value.split(" ", 1)[0] + " " if value.lower().startswith(("bearer ", "basic ")) else ""
        return f"{prefix}${{env:{variable}}}"
    return value


def import_servers(source: Path, config: Config, *, replace: bool = False) -> tuple[Config, list[str], list[str]]:
    """Merge the servers of `source` into `config`: (new config, names added, names skipped)."""
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source}: line {exc.lineno}: not JSON: {exc.msg}") from None
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if servers is None and isinstance(data, dict):
        servers = data.get("servers")  # VS Code's .vscode/mcp.json
    if not isinstance(servers, dict):
        raise ConfigError(f"{source}: no `mcpServers` (or `servers`) object in it")
    added: list[str] = []
    skipped: list[str] = []
    merged = dict(config.servers)
    for raw_name, entry in servers.items():
        name = _name(str(raw_name))
        if not isinstance(entry, dict) or not ("command" in entry or "url" in entry or "serverUrl" in entry):
            skipped.append(f"{raw_name}: neither a command nor a url")
            continue
        if name in merged and not replace:
            skipped.append(f"{raw_name}: a server named {name!r} exists (use --replace)")
            continue
        try:
            server: ServerConfig = configstore.server_from_table(name, _table(entry), source=str(source))
        except ConfigError as exc:
            skipped.append(f"{raw_name}: {exc}")
            continue
        merged[name] = server
        added.append(name)
    new = loads(configstore.dumps(Config(mcpvisor=config.mcpvisor, servers=merged)), source=str(source))
    return new, added, skipped
