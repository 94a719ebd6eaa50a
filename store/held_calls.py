"""Calls waiting for an operator, in the shared store: any replica lists them and records a verdict.

The replica holding a call (its client's connection, the upstream request it will make) writes
one row; an operator's `ctl allow`/`deny` or the admin API on any replica sets its `verdict` once
(`WHERE verdict IS NULL`: the first verdict wins, a timeout too) and NOTIFYs; the holder hears it
and runs or refuses the call, then deletes the row. Rows of a replica that died are past their
`expires` and are neither listed nor decidable; `prune` drops them.
"""

from __future__ import annotations

import time
from typing import Any, Final

import msgspec

from mcpvisor.store.state_db import HELD_CALLS, notify

COLUMNS: Final = ("id", "tenant", "tool", "arguments", "since", "expires", "policies", "endpoint", "client")
STALE_AFTER: Final = 60.0  # seconds past `expires` before a row left by a gone replica is deleted


class HeldRow(msgspec.Struct, frozen=True, kw_only=True):
    """A waiting call as listed: never its raw arguments (`arguments` is the redacted text)."""

    id: str
    tenant: str
    tool: str
    arguments: str
    since: float
    expires: float
    policies: list[str]
    endpoint: str = ""
    client: str = ""


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    verdict: str  # allow, deny, timeout
    reason: str = ""
    decided_by: str = ""


def insert(store: Any, replica: str, row: HeldRow) -> None:
    store.execute(
        f"INSERT INTO held_calls (replica, {', '.join(COLUMNS)}) VALUES (?, {', '.join('?' * len(COLUMNS))})",
        (
            replica,
            row.id,
            row.tenant,
            row.tool,
            row.arguments,
            row.since,
            row.expires,
            msgspec.json.encode(row.policies).decode(),
            row.endpoint,
            row.client,
        ),
    )


def waiting(store: Any, now: float | None = None) -> list[HeldRow]:
    """Every call waiting on any replica, oldest first."""
    rows = store.execute(
        f"SELECT {', '.join(COLUMNS)} FROM held_calls WHERE verdict IS NULL AND expires > ? ORDER BY since",
        (time.time() if now is None else now,),
    ).fetchall()
    return [_row(row) for row in rows]


def decide(store: Any, call_id: str, verdict: str, reason: str, decided_by: str) -> HeldRow | None:
    """Record the verdict on a call still waiting (and tell the holder); None when no such call waits."""
    with store.transaction() as session:
        found = session.execute(
            f"UPDATE held_calls SET verdict = ?, reason = ?, decided_by = ?"
            f" WHERE id = ? AND verdict IS NULL AND expires > ? RETURNING {', '.join(COLUMNS)}",
            (verdict, reason, decided_by, call_id, time.time()),
        ).fetchone()
        if found is not None:
            notify(session, HELD_CALLS)
    return None if found is None else _row(found)


def decided(store: Any, replica: str) -> list[Verdict]:
    """The verdicts recorded on calls this replica holds."""
    rows = store.execute(
        "SELECT id, verdict, reason, decided_by FROM held_calls WHERE replica = ? AND verdict IS NOT NULL", (replica,)
    ).fetchall()
    return [Verdict(id=row[0], verdict=row[1], reason=row[2], decided_by=row[3]) for row in rows]


def verdict_of(store: Any, call_id: str) -> Verdict | None:
    row = store.execute(
        "SELECT id, verdict, reason, decided_by FROM held_calls WHERE id = ? AND verdict IS NOT NULL", (call_id,)
    ).fetchone()
    return None if row is None else Verdict(id=row[0], verdict=row[1], reason=row[2], decided_by=row[3])


def remove(store: Any, call_id: str) -> None:
    store.execute("DELETE FROM held_calls WHERE id = ?", (call_id,))


def prune(store: Any, now: float | None = None) -> int:
    cutoff = (time.time() if now is None else now) - STALE_AFTER
    return store.execute("DELETE FROM held_calls WHERE expires < ?", (cutoff,)).rowcount


def _row(row: tuple[Any, ...]) -> HeldRow:
    values = dict(zip(COLUMNS, row, strict=True))
    values["policies"] = msgspec.json.decode(values["policies"] or "[]")
    return msgspec.convert(values, HeldRow)
