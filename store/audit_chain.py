"""The activity log as a hash chain: an edited or deleted row shows.

Each row of `calls` carries `prev_hash`, the hash of the row before it, and `hash`, a SHA-256 of
`prev_hash` and the row's own columns. Changing a row breaks its hash; deleting one breaks the
link of the row after it. Rows are appended one writer at a time, reading the last hash and
inserting under one lock (SQLite's write lock, taken at BEGIN IMMEDIATE; on PostgreSQL a
transaction-level advisory lock every replica takes), so replicas append to one chain and never
fork it. Retention deletes only the oldest rows, and keeps the hash of the last one it deleted in
`calls_anchor`, which the first remaining row must follow.

What this cannot show: rows cut from the end (the newest), or a whole chain rewritten by someone
who recomputes every hash. `activity verify` prints the newest hash; kept elsewhere (or the log
exported to a SIEM as it goes), it anchors the chain beyond this database.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from mcpvisor.store.state_db import is_shared

# The columns a row's hash covers, in this order (never change it: old rows would no longer match).
HASHED: Final = (
    "request_id",
    "time",
    "client",
    "tenant",
    "endpoint",
    "kind",
    "server",
    "tool",
    "variant",
    "intent",
    "outcome",
    "duration_ms",
    "result_bytes",
    "arguments",
    "result",
    "traceparent",
    "tracestate",
    "decision",
    "policies",
)
# pg_advisory_xact_lock key of the chain (the text "mcpvchain" as a number, beside MIGRATION_LOCK).
CHAIN_LOCK: Final = 0x6D637076_63686169
PAGE: Final = 2000  # rows read at once by `verify`
_INSERT: Final = (
    f"INSERT INTO calls (id, {', '.join(HASHED)}, prev_hash, hash) VALUES ({', '.join('?' * (len(HASHED) + 3))})"
)


def row_hash(prev_hash: str, values: Sequence[Any]) -> str:
    """The hash of a row: SHA-256 over the previous hash and the row's columns as a JSON array."""
    return hashlib.sha256(prev_hash.encode() + b"\n" + msgspec.json.encode(list(values))).hexdigest()


def append(db: Any, rows: Sequence[Sequence[Any]]) -> None:
    """Append rows (values of HASHED, in order) to the chain, in one transaction under the chain's lock."""
    if not rows:
        return
    if is_shared(db):
        with db.transaction() as session:
            session.execute("SELECT pg_advisory_xact_lock(?)", (CHAIN_LOCK,))
            _append(session, rows)
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        _append(db, rows)
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _append(session: Any, rows: Sequence[Sequence[Any]]) -> None:
    last_id, prev = _head(session)
    for values in rows:
        digest = row_hash(prev, values)
        last_id += 1
        session.execute(_INSERT, (last_id, *values, prev, digest))
        prev = digest


def _head(session: Any) -> tuple[int, str]:
    """The id and hash the next row follows: the newest row's, or the last pruned row's, or (0, "").

    Ids are given here, under the lock, so that they never repeat, even once every row was pruned.
    """
    row = session.execute("SELECT id, hash FROM calls ORDER BY id DESC LIMIT 1").fetchone()
    if row is not None:
        return row[0], row[1] or ""  # a row from before the chain: the chain starts after it
    anchor = session.execute("SELECT last_id, hash FROM calls_anchor WHERE id = 1").fetchone()
    return (anchor[0], anchor[1] or "") if anchor is not None else (0, "")


def prune(db: Any, cutoff: float, max_rows: int) -> int:
    """Delete the oldest rows: those before the first row not older than `cutoff`, and beyond `max_rows`.

    Only a prefix of the chain is deleted (a row's time may be earlier than an older row's when
    replicas' clocks differ), and the last deleted row's hash is kept as the anchor.
    """
    if is_shared(db):
        with db.transaction() as session:
            session.execute("SELECT pg_advisory_xact_lock(?)", (CHAIN_LOCK,))
            return _prune(session, cutoff, max_rows)
    db.execute("BEGIN IMMEDIATE")
    try:
        dropped = _prune(db, cutoff, max_rows)
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
    return dropped


def _prune(session: Any, cutoff: float, max_rows: int) -> int:
    kept = session.execute("SELECT id FROM calls WHERE time >= ? ORDER BY id LIMIT 1", (cutoff,)).fetchone()
    aged = session.execute("SELECT max(id) FROM calls").fetchone()[0] if kept is None else kept[0] - 1
    over = session.execute("SELECT id FROM calls ORDER BY id DESC LIMIT 1 OFFSET ?", (max_rows,)).fetchone()
    boundary = max(aged or 0, over[0] if over is not None else 0)
    last = session.execute("SELECT id, hash FROM calls WHERE id <= ? ORDER BY id DESC LIMIT 1", (boundary,)).fetchone()
    if last is None:
        return 0
    dropped = session.execute("DELETE FROM calls WHERE id <= ?", (boundary,)).rowcount
    session.execute(
        "INSERT INTO calls_anchor (id, last_id, hash) VALUES (1, ?, ?)"
        " ON CONFLICT (id) DO UPDATE SET last_id = excluded.last_id, hash = excluded.hash",
        (last[0], last[1]),
    )
    return dropped


@dataclass(frozen=True, slots=True)
class Verdict:
    """What `verify` found: intact, or the first row that does not match and why."""

    rows: int  # rows checked (chained)
    unchained: int  # rows written before the chain existed (a prefix)
    first_id: int | None
    last_id: int | None
    head: str  # the newest row's hash
    bad_id: int | None = None
    problem: str = ""

    @property
    def intact(self) -> bool:
        return self.bad_id is None and not self.problem


def verify(db: Any) -> Verdict:
    """Check the whole chain, oldest row first; stop at the first row that does not match."""
    anchor = db.execute("SELECT last_id, hash FROM calls_anchor WHERE id = 1").fetchone()
    expected = (anchor[1] or "") if anchor is not None else ""
    chained = bool(expected)  # once a row is chained, every later row must be
    checked = unchained = 0
    first_id: int | None = None
    before: int | None = None  # the id of the last row that matched

    def broken(row_id: int, why: str) -> Verdict:
        return Verdict(checked, unchained, first_id, before, expected, row_id, f"row {row_id}: {why}")

    for row_id, values, prev_hash, digest in _rows(db):
        if first_id is None:
            first_id = row_id
        if digest is None:
            if chained:
                return broken(row_id, "it has no hash: it was written without the chain, or its hash was removed")
            unchained += 1
            continue
        if prev_hash != expected:
            if before is not None:
                why = (
                    f"it does not follow row {before}: a row between them was deleted, or row {before} was changed"
                    " and given a new hash"
                )
            elif anchor is not None:
                why = f"it does not follow row {anchor[0]}, the last one retention deleted: rows before it were deleted"
            else:
                why = "it does not start the chain: rows before it were deleted"
            return broken(row_id, why)
        if row_hash(prev_hash, values) != digest:
            return broken(row_id, "its contents do not match its hash: it was changed after it was written")
        checked += 1
        chained = True
        expected = digest
        before = row_id
    return Verdict(checked, unchained, first_id, before, expected)


def _rows(db: Any) -> Iterator[tuple[int, tuple[Any, ...], str | None, str | None]]:
    """(id, hashed values, prev_hash, hash) of every row, by id, a page at a time."""
    after = -1
    while True:
        page = db.execute(
            f"SELECT id, {', '.join(HASHED)}, prev_hash, hash FROM calls WHERE id > ? ORDER BY id LIMIT ?",
            (after, PAGE),
        ).fetchall()
        for row in page:
            yield row[0], tuple(row[1 : 1 + len(HASHED)]), row[-2], row[-1]
        if len(page) < PAGE:
            return
        after = page[-1][0]
