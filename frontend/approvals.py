"""Approved tools: the hash of each tool definition an operator approved, to catch later changes (rug pulls)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mcpvisor.frontend.security import tool_hash


@dataclass(frozen=True, slots=True)
class Drift:
    """How a server's tools differ from what was approved."""

    changed: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.changed or self.added or self.removed)

    @property
    def unapproved(self) -> set[str]:
        """Tools whose current definition nobody approved."""
        return {*self.changed, *self.added}


class ToolApprovals:
    """The `tool_approvals` table, kept in memory too: calls check it on every request."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self._hashes: dict[str, dict[str, str]] = {}
        for server, tool, digest in db.execute("SELECT server, tool, hash FROM tool_approvals"):
            self._hashes.setdefault(server, {})[tool] = digest

    def approve(self, server: str, tools: Iterable[Mapping[str, Any]]) -> dict[str, str]:
        """Record `tools` as the approved definitions of `server`, replacing earlier approvals."""
        hashes = {tool["name"]: tool_hash(tool) for tool in tools if isinstance(tool.get("name"), str)}
        now = time.time()
        self._db.execute("BEGIN")
        try:
            self._db.execute("DELETE FROM tool_approvals WHERE server = ?", (server,))
            self._db.executemany(
                "INSERT INTO tool_approvals (server, tool, hash, approved_at) VALUES (?, ?, ?, ?)",
                [(server, name, digest, now) for name, digest in hashes.items()],
            )
        except sqlite3.Error:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")
        self._hashes[server] = hashes
        return hashes

    def approved(self, server: str) -> dict[str, str] | None:
        """Approved hashes by tool name; None when the server's tools were never approved here."""
        hashes = self._hashes.get(server)
        return dict(hashes) if hashes is not None else None

    def drift(self, server: str, tools: Iterable[Mapping[str, Any]]) -> Drift:
        """How `tools` differ from the approved definitions (nothing, when there was no approval)."""
        approved = self._hashes.get(server)
        if approved is None:
            return Drift()
        current = {tool["name"]: tool_hash(tool) for tool in tools if isinstance(tool.get("name"), str)}
        return Drift(
            changed=sorted(name for name, digest in current.items() if name in approved and approved[name] != digest),
            added=sorted(name for name in current if name not in approved),
            removed=sorted(name for name in approved if name not in current),
        )
