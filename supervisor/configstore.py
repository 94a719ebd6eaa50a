"""Writing the config file back: atomic replace, previous version kept as `.bak`."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import msgspec
import tomli_w

from mcpvisor.supervisor.config import Config, ConfigError, ServerConfig, loads


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` so that readers see the old file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        if path.exists():
            shutil.copy2(path, path.with_name(f"{path.name}.bak"))
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def dumps(config: Config) -> str:
    """The config as TOML, defaults left out."""
    return tomli_w.dumps(msgspec.to_builtins(config))


def save(path: Path, config: Config) -> None:
    text = dumps(config)
    loads(text, source=str(path))  # what we write must be what we would accept
    write_atomic(path, text)


def server_from_table(name: str, table: Any, *, source: str) -> ServerConfig:
    """Check one server table as if it stood in the file; ConfigError names the problem."""
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: server {name!r} must be a table (object)")
    try:
        text = tomli_w.dumps({"servers": {name: table}})
    except TypeError as exc:  # a JSON null, which TOML cannot hold
        raise ConfigError(f"{source}: server {name!r}: {exc}; leave the key out instead") from None
    config = loads(text, source=source)
    return config.servers[name]


def with_server(config: Config, name: str, server: ServerConfig | None) -> Config:
    """A copy of `config` with one server replaced, added, or (None) removed."""
    servers = dict(config.servers)
    if server is None:
        servers.pop(name, None)
    else:
        servers[name] = server
    return msgspec.structs.replace(config, servers=servers)


def server_table(server: ServerConfig) -> dict[str, Any]:
    return msgspec.to_builtins(server)
