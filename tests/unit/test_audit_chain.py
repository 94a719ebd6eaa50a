"""The activity log's hash chain on SQLite: intact as written, and the first row that does not match named.

Given a log of calls, editing any column of a row, deleting a row (first, middle), removing a
row's hash or reordering is found at the first row that no longer matches; retention's deletions
of the oldest rows are not.
"""

from __future__ import annotations

import time

import pytest

from mcpvisor.frontend.gate.activity import ActivityLog
from mcpvisor.store import audit_chain
from mcpvisor.store.state_db import open_state_db


def a_log(rows: int = 6) -> tuple[object, ActivityLog]:
    db = open_state_db("")
    log = ActivityLog(db, max_rows=1000)
    for n in range(rows):
        log.record(
            server="github",
            tool=f"t{n}",
            variant="direct",
            intent=None,
            outcome="ok",
            duration=0.002,
            tenant="alice",
            decision="allow",
            policies=("base",),
        )
    return db, log


def ids(db: object) -> list[int]:
    return [row[0] for row in db.execute("SELECT id FROM calls ORDER BY id")]  # type: ignore[attr-defined]


def test_a_log_as_written_is_intact() -> None:
    db, _ = a_log()
    verdict = audit_chain.verify(db)
    assert verdict.intact
    assert (verdict.rows, verdict.first_id, verdict.last_id) == (6, 1, 6)
    assert verdict.head == db.execute("SELECT hash FROM calls ORDER BY id DESC LIMIT 1").fetchone()[0]  # type: ignore[attr-defined]


@pytest.mark.parametrize("column", ["tool", "outcome", "tenant", "decision", "policies", "time", "result_bytes"])
def test_an_edited_row_is_the_first_that_does_not_match(column: str) -> None:
    db, _ = a_log()
    value = 12345 if column in ("time", "result_bytes") else "changed"
    db.execute(f"UPDATE calls SET {column} = ? WHERE id = 4", (value,))  # type: ignore[attr-defined]
    verdict = audit_chain.verify(db)
    assert verdict.bad_id == 4
    assert verdict.problem == "row 4: its contents do not match its hash: it was changed after it was written"
    assert verdict.last_id == 3  # the last row that matched


def test_an_edited_row_given_a_new_hash_shows_at_the_next_row() -> None:
    db, _ = a_log()
    db.execute("UPDATE calls SET outcome = 'error' WHERE id = 3")  # type: ignore[attr-defined]
    columns = ", ".join(audit_chain.HASHED)
    prev, *values = db.execute(f"SELECT prev_hash, {columns} FROM calls WHERE id = 3").fetchone()  # type: ignore[attr-defined]
    db.execute("UPDATE calls SET hash = ? WHERE id = 3", (audit_chain.row_hash(prev, values),))  # type: ignore[attr-defined]
    verdict = audit_chain.verify(db)
    assert verdict.bad_id == 4
    assert "does not follow row 3" in verdict.problem


def test_a_deleted_row_is_named_by_the_row_after_it() -> None:
    db, _ = a_log()
    db.execute("DELETE FROM calls WHERE id = 3")  # type: ignore[attr-defined]
    verdict = audit_chain.verify(db)
    assert verdict.bad_id == 4
    assert verdict.problem == (
        "row 4: it does not follow row 2: a row between them was deleted, or row 2 was changed and given a new hash"
    )


def test_the_first_row_deleted_shows() -> None:
    db, _ = a_log()
    db.execute("DELETE FROM calls WHERE id = 1")  # type: ignore[attr-defined]
    verdict = audit_chain.verify(db)
    assert verdict.bad_id == 2
    assert "does not start the chain" in verdict.problem


def test_a_removed_hash_shows() -> None:
    db, _ = a_log()
    db.execute("UPDATE calls SET hash = NULL WHERE id = 5")  # type: ignore[attr-defined]
    assert audit_chain.verify(db).bad_id == 5


def test_retention_deletes_the_oldest_rows_and_the_chain_still_verifies_then_a_deletion_before_shows() -> None:
    db, log = a_log(10)
    log.max_rows = 4
    assert log.prune() == 6
    assert ids(db) == [7, 8, 9, 10]
    assert audit_chain.verify(db).intact
    log.record(server="github", tool="later", variant="direct", intent=None, outcome="ok", duration=0.0)
    assert audit_chain.verify(db).intact
    db.execute("DELETE FROM calls WHERE id = 7")  # type: ignore[attr-defined]
    verdict = audit_chain.verify(db)
    assert verdict.bad_id == 8
    assert "the last one retention deleted" in verdict.problem


def test_every_row_pruned_the_next_one_follows_the_anchor() -> None:
    db, log = a_log(3)
    log.retention_days = 1
    assert log.prune(now=time.time() + 2 * 86400) == 3
    assert ids(db) == []
    log.record(server="github", tool="after", variant="direct", intent=None, outcome="ok", duration=0.0)
    assert audit_chain.verify(db).intact
    assert ids(db) == [4]


def test_rows_from_before_the_chain_are_a_prefix_counted_apart() -> None:
    db = open_state_db("")
    for n in range(3):  # as an older mcpvisor wrote them: no hash
        db.execute(
            "INSERT INTO calls (time, server, tool, variant, outcome, duration_ms) VALUES (?, 's', ?, 'direct', 'ok', 1)",
            (1.0 + n, f"old{n}"),
        )
    log = ActivityLog(db)
    log.record(server="s", tool="new", variant="direct", intent=None, outcome="ok", duration=0.0)
    verdict = audit_chain.verify(db)
    assert verdict.intact
    assert (verdict.unchained, verdict.rows) == (3, 1)
