"""The uid each sandbox runs as under a root mcpvisor: one per worker id, kept, never shared.

A uid derived from the worker id alone (a hash) can collide: a server name chosen to collide with
another tenant's would run as that tenant's uid, with its keyring and its process count. So uids
are handed out from a table in the state store (SQLite, or PostgreSQL shared by replicas): the
first start of a worker id takes the next free uid of the range, every later start (on any
replica) reads the same one, and a UNIQUE column makes a second owner of a uid impossible.

The range lies inside the ids this process may switch to (its user namespace's uid_map), at or
above 2^30 where there is room, so no uid a distribution hands out is ever a sandbox's.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from mcpvisor.store.state_db import STATE_FILE, is_shared, open_state_db

UID_FLOOR = 1 << 30
FIRST_OFFSET = 1000  # below it: reserved (code_execution's script process runs as floor + 1)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS sandbox_uids (
    worker TEXT PRIMARY KEY,
    uid BIGINT NOT NULL UNIQUE
)
"""


def open_local(data_dir: str) -> sqlite3.Connection:
    """The data dir's state.sqlite for the uid table: made (0600) as the state store makes it, then a
    connection of its own that the supervisor uses from its loop and from the threads it starts."""
    open_state_db(data_dir).close()
    db = sqlite3.connect(str(Path(data_dir) / STATE_FILE), isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA busy_timeout=2000")
    return db


class UidRangeFull(Exception):
    """Every uid of the range is taken."""


def uid_range(mapped: Sequence[tuple[int, int]] = ((0, 1 << 32),)) -> tuple[int, int]:
    """[first, last) of the uids sandboxes get, inside the widest mapped range."""
    start, count = max(mapped, key=lambda ids: ids[1])
    if start + count > UID_FLOOR + FIRST_OFFSET + (1 << 16):
        low = max(start, UID_FLOOR) + FIRST_OFFSET
        return low, min(start + count, UID_FLOOR * 2)
    # A narrow map (a rootless container's 65536 ids): its top half, below nobody and the script uid.
    return start + count // 2, start + count - 4


class SandboxUids:
    """worker id -> uid, read from and added to the `sandbox_uids` table of a state store."""

    def __init__(self, db: Any, mapped: Sequence[tuple[int, int]] = ((0, 1 << 32),)) -> None:
        self.db = db
        self.first, self.end = uid_range(mapped)
        self.known: dict[str, int] = {}
        if not is_shared(db):
            # A shared store's migrations made the table, one replica at a time; a CREATE here
            # would race another replica's on PostgreSQL's catalog.
            db.execute(_SCHEMA)

    def load(self) -> dict[str, int]:
        rows = self.db.execute("SELECT worker, uid FROM sandbox_uids").fetchall()
        self.known = {worker: int(uid) for worker, uid in rows}
        return self.known

    def uid_for(self, worker: str) -> int:
        """The worker's uid, taking the next free one of the range on its first start."""
        if worker in self.known:
            return self.known[worker]
        for _attempt in range(8):
            row = self.db.execute("SELECT uid FROM sandbox_uids WHERE worker = ?", (worker,)).fetchone()
            if row is not None:
                self.known[worker] = int(row[0])
                return self.known[worker]
            top = self.db.execute(
                "SELECT MAX(uid) FROM sandbox_uids WHERE uid >= ? AND uid < ?", (self.first, self.end)
            )
            highest = top.fetchone()[0]
            uid = self.first if highest is None else int(highest) + 1
            if uid >= self.end:
                uid = self._first_gap()
            # A replica that took this uid (or this worker's) at the same moment makes this a no-op:
            # the SELECT above, run again, tells which.
            self.db.execute(
                "INSERT INTO sandbox_uids (worker, uid) VALUES (?, ?) ON CONFLICT DO NOTHING", (worker, uid)
            )
        raise UidRangeFull(f"no free sandbox uid for {worker} in [{self.first}, {self.end})")

    def _first_gap(self) -> int:
        taken = {int(uid) for (uid,) in self.db.execute("SELECT uid FROM sandbox_uids").fetchall()}
        for uid in range(self.first, self.end):
            if uid not in taken:
                return uid
        raise UidRangeFull(f"every sandbox uid in [{self.first}, {self.end}) is taken")

    def allocate(self, workers: Iterable[str]) -> None:
        """Look up (or take) the uids of these workers now, so a start needs no store."""
        self.load()
        for worker in workers:
            self.uid_for(worker)
