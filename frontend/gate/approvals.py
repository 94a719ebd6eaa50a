"""Pins: the hash of each tool and prompt definition an operator approved, to catch later changes (rug pulls)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from mcpvisor.frontend.gate.store_writer import StoreWriter
from mcpvisor.store.state_db import PINS, notify, transaction

Kind = Literal["tool", "prompt"]

# What a model reads of each kind of definition: a change to any of these is a change to approve.
_PINNED_FIELDS: dict[Kind, tuple[str, ...]] = {
    "tool": ("name", "title", "description", "inputSchema", "outputSchema", "annotations"),
    "prompt": ("name", "title", "description", "arguments"),
}
_VERSION = "v2:"
# Pins written before titles and output schemas were pinned: still honoured, compared the old way.
_LEGACY_TOOL_FIELDS = ("name", "description", "inputSchema", "annotations")


def _digest(definition: Mapping[str, Any], fields: tuple[str, ...]) -> str:
    canonical = {key: definition.get(key) for key in fields}
    data = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(data.encode("utf-8")).hexdigest()


def definition_hash(definition: Mapping[str, Any], kind: Kind = "tool") -> str:
    """A stable hash of the parts of a definition the model reads (canonical JSON, sorted keys)."""
    return _VERSION + _digest(definition, _PINNED_FIELDS[kind])


def _matches(pinned: str, definition: Mapping[str, Any], kind: Kind) -> bool:
    if pinned.startswith(_VERSION):
        return pinned == definition_hash(definition, kind)
    return kind == "tool" and pinned == _digest(definition, _LEGACY_TOOL_FIELDS)


@dataclass(frozen=True, slots=True)
class Drift:
    """How a server's definitions differ from what was approved."""

    changed: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.changed or self.added or self.removed)

    @property
    def unapproved(self) -> set[str]:
        """Definitions nobody approved in their current form."""
        return {*self.changed, *self.added}


def _named(items: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    return {item["name"]: item for item in items if isinstance(item.get("name"), str)}


class ToolApprovals:
    """The `pins` table, kept in memory too: listings and calls check it on every request."""

    def __init__(self, db: Any, writer: StoreWriter | None = None) -> None:
        self._db = db
        self._writer = writer or StoreWriter(db)
        self._pins: dict[tuple[str, Kind], dict[str, str]] = read_pins(db)
        self.version = 0  # bumps on every change of the pins: cached listings are rebuilt
        self._drifts: dict[tuple[str, Kind], tuple[object, int, Drift]] = {}

    def approve(self, server: str, items: Iterable[Mapping[str, Any]], kind: Kind = "tool") -> dict[str, str]:
        """Record `items` as the approved definitions of `server`, replacing earlier approvals of that kind."""
        hashes = {name: definition_hash(item, kind) for name, item in _named(items).items()}
        now = time.time()

        def write() -> None:
            with transaction(self._db) as db:
                db.execute("DELETE FROM pins WHERE server = ? AND kind = ?", (server, kind))
                # Replicas that first see a server at once pin it at once: the same rows, written twice.
                db.executemany(
                    "INSERT INTO pins (server, kind, name, hash, approved_at) VALUES (?, ?, ?, ?, ?)"
                    " ON CONFLICT (server, kind, name) DO UPDATE SET hash = excluded.hash,"
                    " approved_at = excluded.approved_at",
                    [(server, kind, name, digest, now) for name, digest in hashes.items()],
                )
                notify(db, PINS)

        self._writer.submit(write, f"the approval of {server}")
        self._pins[server, kind] = hashes
        self.version += 1
        return hashes

    def replace(self, pins: dict[tuple[str, Kind], dict[str, str]]) -> set[str]:
        """Take the pins as another replica left them in the shared store; the servers whose pins changed."""
        changed = {key[0] for key in pins.keys() | self._pins.keys() if pins.get(key) != self._pins.get(key)}
        if changed:
            self._pins = pins
            self.version += 1
        return changed

    async def flush(self) -> None:
        """Wait until the pins recorded so far are in the store (before other replicas act on them)."""
        await self._writer.flush()

    def approved(self, server: str, kind: Kind = "tool") -> dict[str, str] | None:
        """Approved hashes by name; None when the server's definitions of that kind were never approved."""
        hashes = self._pins.get((server, kind))
        return dict(hashes) if hashes is not None else None

    def drift(self, server: str, items: Iterable[Mapping[str, Any]], kind: Kind = "tool") -> Drift:
        """How `items` differ from the approved definitions (nothing, when there was no approval).

        Every listing, search and call asks this; hashing a large server's definitions each time
        would cost more than the call. The catalog replaces a server's list whenever it changes,
        so the answer for the same list object and the same pins is remembered.
        """
        key = (server, kind)
        cached = self._drifts.get(key)
        if cached is not None and cached[0] is items and cached[1] == self.version:
            return cached[2]
        drift = self._compare(server, items, kind)
        if isinstance(items, list):
            self._drifts[key] = (items, self.version, drift)
        return drift

    def _compare(self, server: str, items: Iterable[Mapping[str, Any]], kind: Kind) -> Drift:
        approved = self._pins.get((server, kind))
        if approved is None:
            return Drift()
        current = _named(items)
        return Drift(
            changed=sorted(
                name for name, item in current.items() if name in approved and not _matches(approved[name], item, kind)
            ),
            added=sorted(name for name in current if name not in approved),
            removed=sorted(name for name in approved if name not in current),
        )

    def forget(self, server: str) -> None:
        """Drop every pin of a removed server, so a new server of the same name starts unapproved."""

        def write() -> None:
            with transaction(self._db) as db:
                db.execute("DELETE FROM pins WHERE server = ?", (server,))
                notify(db, PINS)

        self._writer.submit(write, f"forgetting the pins of {server}")
        for key in [key for key in self._pins if key[0] == server]:
            del self._pins[key]
        self.version += 1


def read_pins(db: Any) -> dict[tuple[str, Kind], dict[str, str]]:
    """Every pin in the store, by (server, kind); blocks on the store."""
    pins: dict[tuple[str, Kind], dict[str, str]] = {}
    for server, kind, name, digest in db.execute("SELECT server, kind, name, hash FROM pins"):
        pins.setdefault((server, kind), {})[name] = digest
    return pins
