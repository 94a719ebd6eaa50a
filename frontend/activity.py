"""The activity log: one row per upstream call made through a built-in tool, with the declared intent.

Arguments and results are never stored: they may hold secrets.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

log = logging.getLogger(__name__)

Outcome = Literal["ok", "error", "blocked"]


@dataclass(frozen=True, slots=True)
class CallRecord:
    time: float
    server: str
    tool: str
    variant: str
    intent: dict[str, Any] | None
    outcome: Outcome
    duration_ms: float


class ActivityLog:
    """Appends calls to the `calls` table of the state store."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def record(
        self,
        *,
        server: str,
        tool: str,
        variant: str,
        intent: Mapping[str, Any] | None,
        outcome: Outcome,
        duration: float,
    ) -> None:
        """Log one call (`duration` in seconds); a failing disk is logged, never fails the call."""
        try:
            self._db.execute(
                "INSERT INTO calls (time, server, tool, variant, intent, outcome, duration_ms)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    time.time(),
                    server,
                    tool,
                    variant,
                    None if intent is None else json.dumps(dict(intent), ensure_ascii=False),
                    outcome,
                    round(duration * 1000, 3),
                ),
            )
        except sqlite3.Error as exc:
            log.error("activity log: cannot record a call to %s:%s: %s", server, tool, exc)

    def recent(self, limit: int = 100) -> list[CallRecord]:
        """The last `limit` calls, newest first."""
        rows = self._db.execute(
            "SELECT time, server, tool, variant, intent, outcome, duration_ms FROM calls ORDER BY id DESC LIMIT ?",
            (limit,),
        ).fetchall()
        return [
            CallRecord(row[0], row[1], row[2], row[3], None if row[4] is None else json.loads(row[4]), row[5], row[6])
            for row in rows
        ]
