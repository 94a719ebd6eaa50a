"""Writing the config file back: atomic replace, previous version kept as `.bak`."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import tomli_w
import tomlkit
import tomlkit.exceptions

from mcpvisor.supervisor.config import Config, loads
from mcpvisor.wire.config import ConfigError, ServerConfig

log = logging.getLogger(__name__)


def temp_path(path: Path) -> Path:
    """Where a new version of `path` is written before it is renamed over it."""
    return path.with_name(f".{path.name}.tmp")


def remove_stale_temp(path: Path) -> None:
    """Remove the temp file a write killed half-way left behind (it may hold secrets)."""
    tmp = temp_path(path)
    try:
        tmp.unlink()
    except FileNotFoundError:
        return
    log.info("removed %s, left by a write that did not finish", tmp)


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` so that readers see the old file or the new one, never half.

    The new file and the `.bak` of the old one get the old file's mode (0600 for a new file), so
    a run-time change never opens a private config to other users.
    """
    tmp = temp_path(path)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = 0o600
    try:
        _write_new(tmp, text.encode("utf-8"), mode)
        if path.exists():
            _write_new(path.with_name(f"{path.name}.bak"), path.read_bytes(), mode)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Create `path` afresh with `data` and `mode`; readable by its owner alone until it is complete."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with open(fd, "wb") as file:
        file.write(data)
        file.flush()
        os.fchmod(fd, mode)
        os.fsync(fd)


def dumps(config: Config) -> str:
    """The config as TOML, defaults left out."""
    return tomli_w.dumps(msgspec.to_builtins(config))


def _checked_dump(path: Path, config: Config) -> str:
    """`config` as TOML, refused (ConfigError) if we would not accept it on reading it back."""
    text = dumps(config)
    loads(text, source=str(path))
    return text


def save(path: Path, config: Config) -> None:
    write_atomic(path, _checked_dump(path, config))


def save_server(
    path: Path, config: Config, name: str, server: ServerConfig | None, *, was: ServerConfig | None = None
) -> None:
    """Write one server's new table (None: its removal) into the file, keeping the rest of it.

    `was`: the table as it ran before the change. Given, only what the change changed is written,
    so an edit of the same server not yet applied (`update`) survives a `ctl disable` of it.
    """
    save_servers(path, config, [name], was=None if was is None else {name: was})


def save_servers(
    path: Path, config: Config, names: list[str], *, was: Mapping[str, ServerConfig] | None = None
) -> None:
    """Write the tables of `names` as `config` has them (absent: removed) into the file, keeping the rest.

    The file is edited in place, so its comments, order and layout survive `ctl disable` and
    the like, and so do edits not yet applied with `update`: of other servers always, and of the
    changed one too for the fields the change leaves alone when `was` says how it ran before. A
    file that cannot be edited that way (missing, unreadable, or broken since it was loaded) is
    replaced by `config` written whole.
    """
    whole = _checked_dump(path, config)  # a change we would not accept is refused before any write
    was = was or {}
    try:
        edited = path.read_text(encoding="utf-8")
        in_file = loads(edited, source=str(path)).servers
        intended = {name: _intended(in_file.get(name), was.get(name), config.servers.get(name)) for name in names}
        for name in names:
            edited = edit_server(edited, name, config.servers.get(name), source=str(path), was=was.get(name))
        edited = _sync_tenant_servers(edited, config)
        reread = loads(edited, source=str(path))
        written = reread.servers
        if reread.tenants != config.tenants or any(written.get(name) != intended[name] for name in names):
            raise ConfigError(f"{path}: editing {', '.join(names)} in place did not give the intended tables")
    except (OSError, ConfigError, tomlkit.exceptions.TOMLKitError) as exc:
        if path.exists():
            log.warning("rewriting %s whole (the previous file is kept as .bak): %s", path, exc)
        edited = whole
    write_atomic(path, edited)


def _intended(in_file: ServerConfig | None, was: ServerConfig | None, new: ServerConfig | None) -> ServerConfig | None:
    """What the file must say of a server after a change from `was` to `new` (no `was`: `new` whole)."""
    if new is None or in_file is None or was is None:
        return new
    table = msgspec.to_builtins(in_file)
    _edit(table, msgspec.to_builtins(was), msgspec.to_builtins(new))
    return msgspec.convert(table, ServerConfig)


def _sync_tenant_servers(text: str, config: Config) -> str:
    """`text` with each tenant's `servers` list as `config` has it (a server added for or removed from one)."""
    doc = tomlkit.parse(text)
    tenants = doc.get("tenants")
    if tenants is None:
        return text
    for tenant, table in config.tenants.items():
        if tenant in tenants and list(tenants[tenant].get("servers", [])) != table.servers:
            tenants[tenant]["servers"] = list(table.servers)
    return doc.as_string()


def edit_server(
    text: str, name: str, server: ServerConfig | None, *, source: str, was: ServerConfig | None = None
) -> str:
    """`text` with server `name` changed to `server` (None: removed), touching only what changed:
    from `was` when given (how it ran), else from what the file says."""
    in_file = loads(text, source=source).servers.get(name)
    before = was if was is not None and in_file is not None else in_file
    doc = tomlkit.parse(text)
    servers = doc.get("servers")
    if server is None:
        if servers is not None and name in servers:
            del servers[name]
        return doc.as_string()
    if servers is None:
        servers = tomlkit.table(is_super_table=True)
        doc["servers"] = servers
    new = msgspec.to_builtins(server)
    if before is None or name not in servers:
        servers[name] = new
    else:
        _edit(servers[name], msgspec.to_builtins(before), new)
    return doc.as_string()


def _edit(table: Any, old: dict[str, Any], new: dict[str, Any]) -> None:
    """Make `table` (a tomlkit table) say `new` where `old` (what it said) differs from it."""
    for key in old.keys() - new.keys():
        if key in table:
            del table[key]  # back to its default, which the file need not spell out
    for key, value in new.items():
        if old.get(key) == value:
            continue
        current = table.get(key)
        if isinstance(value, dict) and isinstance(old.get(key), dict) and isinstance(current, dict):
            _edit(current, old[key], value)
        else:
            table[key] = value


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


def with_server(config: Config, name: str, server: ServerConfig | None, *, tenant: str = "") -> Config:
    """A copy of `config` with one server replaced, added, or (None) removed.

    A removed server leaves every tenant's list; with `tenant`, a server added joins that tenant's.
    """
    servers = dict(config.servers)
    tenants = dict(config.tenants)
    if server is None:
        servers.pop(name, None)
        for key, table in tenants.items():
            if name in table.servers:
                tenants[key] = msgspec.structs.replace(table, servers=[s for s in table.servers if s != name])
    else:
        servers[name] = server
        if tenant and tenant in tenants and name not in tenants[tenant].servers:
            tenants[tenant] = msgspec.structs.replace(tenants[tenant], servers=[*tenants[tenant].servers, name])
    return msgspec.structs.replace(config, servers=servers, tenants=tenants)


def server_table(server: ServerConfig) -> dict[str, Any]:
    return msgspec.to_builtins(server)
