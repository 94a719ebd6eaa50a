"""The files `[policy] files` names: read, checked like the config file, handed to the frontend as text.

A broken policy file is a broken config: `serve` does not start, `update`, `reload` and SIGHUP
change nothing, `check` says which file, line and problem.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from mcpvisor.runtime.policies import PolicyError, Rule, load_rules
from mcpvisor.runtime.policy_checks import warnings
from mcpvisor.runtime.policy_vocabulary import LOCAL_TENANT
from mcpvisor.store.state_db import STATE_FILE
from mcpvisor.supervisor.config import Config
from mcpvisor.wire.config import ConfigError
from mcpvisor.wire.policy_sources import PolicyBundle, PolicyText


def policy_path(config_path: Path, name: str) -> Path:
    """A `files` entry as a path: a relative one is relative to the config file."""
    path = Path(name).expanduser()
    return path if path.is_absolute() else config_path.parent / path


def load_policies(config: Config, config_path: Path) -> PolicyBundle | None:
    """The `[policy]` table and its files' text, every policy checked; None without `[policy]`.

    ConfigError names the file and line of the first problem.
    """
    if config.policy is None:
        return None
    if LOCAL_TENANT in config.tenants:
        raise ConfigError(
            f'{config_path}: tenant {LOCAL_TENANT!r}: with [policy], Tenant::"{LOCAL_TENANT}" is the principal of the'
            " plain endpoints (the local user, operators); give the tenant another name"
        )
    sources = []
    for name in config.policy.files:
        path = policy_path(config_path, name)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ConfigError(f"{name}: cannot read the policy file: {reason}") from None
        sources.append(PolicyText(path=name, text=text))
    try:
        load_rules(sources)
    except PolicyError as exc:
        raise ConfigError(str(exc)) from None
    return PolicyBundle(config=config.policy, sources=sources)


def rules_of(bundle: PolicyBundle) -> list[Rule]:
    return load_rules(bundle.sources)


def policy_warnings(bundle: PolicyBundle, config: Config, data_dir: Path) -> list[str]:
    """Names the policies and limits use that the config does not know (see runtime/policy_checks.py)."""
    seen = seen_tools(data_dir)
    servers = {name: seen.get(name) for name in config.servers}
    found = warnings(rules_of(bundle), servers, config.tenants)
    for index, limit in enumerate(bundle.config.limits):
        if limit.tenant not in ("*", LOCAL_TENANT) and limit.tenant not in config.tenants:
            found.append(f"[policy] limits[{index}]: tenant {limit.tenant!r} is not configured")
        server = limit.tools.partition(":")[0]
        if not any(ch in server for ch in "*?[") and server not in config.servers:
            found.append(f"[policy] limits[{index}]: tools {limit.tools!r} names no configured server {server!r}")
    return found


def seen_tools(data_dir: Path) -> dict[str, set[str]]:
    """The tool names pinned per server in this host's state store (SQLite): the tools seen so far."""
    path = data_dir / STATE_FILE
    if not path.exists():
        return {}
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=2.0)
    except sqlite3.Error:
        return {}
    try:
        rows = db.execute("SELECT server, name FROM pins WHERE kind = 'tool'").fetchall()
    except sqlite3.Error:
        return {}
    finally:
        db.close()
    tools: dict[str, set[str]] = {}
    for server, name in rows:
        tools.setdefault(server, set()).add(name)
    return tools
