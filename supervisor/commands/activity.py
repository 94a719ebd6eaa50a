"""`activity [-f] [--server NAME] [--since DURATION] [-n N]`: the frontend's activity log, read-only.

The frontend is the log's one writer; the supervisor opens the same SQLite file read-only. With
a shared store (`state_url`) the log is every replica's, read from PostgreSQL.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final

import msgspec
import trio

from mcpvisor.store import audit_chain
from mcpvisor.store.state_db import STATE_FILE
from mcpvisor.store.state_url import StateStoreError
from mcpvisor.supervisor.commands import EXIT_USAGE, Args, CommandError, command

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor

MAX_ROWS: Final = 10_000
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_SECONDS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_COLUMNS: Final = ("id", *audit_chain.HASHED)  # every column but the chain's own


class ActivityArgs(Args):
    server: str | None = None
    since: str | None = None
    lines: Annotated[int, msgspec.Meta(ge=1, le=MAX_ROWS)] = 50
    after: Annotated[int, msgspec.Meta(ge=0)] | None = None  # rows with a larger id (how -f follows)


def parse_duration(text: str) -> float:
    """`90s`, `15m`, `2h`, `7d` -> seconds; a clear error for anything else."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise CommandError(f"activity: --since takes a duration such as 30s, 15m, 2h or 7d, got {text!r}", EXIT_USAGE)
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def _query(args: ActivityArgs, now: float) -> tuple[str, tuple[Any, ...]]:
    where: list[str] = []
    values: list[Any] = []
    if args.server is not None:
        where.append("server = ?")
        values.append(args.server)
    if args.since is not None:
        where.append("time >= ?")
        values.append(now - parse_duration(args.since))
    if args.after is not None:
        where.append("id > ?")
        values.append(args.after)
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    # Only fixed column names are interpolated; every value is a parameter.
    query = f"SELECT {', '.join(_COLUMNS)} FROM calls {clause} ORDER BY id DESC LIMIT ?"
    return query, (*values, args.lines)


def read_shared_rows(store: Any, args: ActivityArgs, now: float) -> list[dict[str, Any]]:
    """`read_rows` of the shared store (a `PostgresState`)."""
    try:
        rows = store.execute(*_query(args, now)).fetchall()
    except StateStoreError as exc:
        raise CommandError(f"activity: cannot read the activity log: {exc}") from None
    return [dict(zip(_COLUMNS, row, strict=True)) for row in reversed(rows)]


def read_rows(path: Path, args: ActivityArgs, now: float) -> list[dict[str, Any]]:
    """The matching rows, oldest first (the newest `lines` of them, or all after `after`)."""
    if not path.exists():
        return []
    query, values = _query(args, now)
    db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=2.0)
    try:
        rows = db.execute(query, values).fetchall()
    except sqlite3.OperationalError as exc:
        raise CommandError(f"activity: cannot read the activity log: {exc}") from None
    finally:
        db.close()
    return [dict(zip(_COLUMNS, row, strict=True)) for row in reversed(rows)]


def render_row(row: dict[str, Any]) -> str:
    when = datetime.fromtimestamp(row["time"], UTC).strftime("%Y-%m-%d %H:%M:%S")
    what = f"{row['server']}:{row['tool']}"
    client = row["client"] or "-"
    line = (
        f"{when} {row['request_id'][:12]:<12} {row['outcome']:<7} {row['duration_ms']:>9.1f}ms"
        f" {row['result_bytes']:>8}B {row['endpoint'] or '-':<14} {row['variant']:<16} {client:<16} {what}"
    )
    if row.get("decision"):  # what the policies decided, and which ones
        line += f"  [{row['decision']}: {', '.join(_policies(row.get('policies')))}]"
    return line


def _policies(text: Any) -> list[str]:
    try:
        value = json.loads(text) if isinstance(text, str) and text else []
    except json.JSONDecodeError:
        return [str(text)]
    return [str(item) for item in value] if isinstance(value, list) else [str(value)]


def render(result: dict[str, Any]) -> str:
    rows = result["rows"]
    if not rows:
        return "" if result.get("follow") else "no activity"
    return "\n".join(render_row(row) for row in rows)


@command(
    "activity",
    args=ActivityArgs,
    options={"--server": "server", "--since": "since", "-n": "lines", "--lines": "lines", "--after": "after"},
    usage="activity [-f] [--server NAME] [--since DURATION] [-n N]",
    render=render,
)
async def activity(sup: Supervisor, args: ActivityArgs) -> dict[str, Any]:
    """Show the calls clients made: tools/call, resources/read and prompts/get, oldest first.

    Each row: time, request id, outcome, duration, result size, endpoint, path (direct,
    call_tool_read, ...), client and `server:tool`. `--server` keeps one server's calls, `--since`
    the last 30s/15m/2h/7d, `-n` the newest N (default 50, at most 10000). `-f` follows new calls.
    Arguments and results appear only when `activity_record_arguments = true`, redacted.
    """
    if sup.shared is not None:
        rows = await trio.to_thread.run_sync(read_shared_rows, sup.shared.store, args, time.time())
    else:
        rows = await trio.to_thread.run_sync(read_rows, sup.data_dir / STATE_FILE, args, time.time())
    last = rows[-1]["id"] if rows else args.after
    if last is None:
        last = 0
    return {"rows": rows, "last": last, "follow": args.after is not None}
