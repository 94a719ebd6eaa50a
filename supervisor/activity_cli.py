"""`mcpvisor activity verify` and `activity export`: the activity log read straight from the state store.

Both work offline, with or without a running mcpvisor, on the data dir's `state.sqlite` (opened
read-only) or on the shared store of `state_url`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, TextIO

from mcpvisor.store import audit_chain
from mcpvisor.store.state_db import STATE_FILE
from mcpvisor.store.state_url import StateStoreError
from mcpvisor.supervisor import config as config_mod
from mcpvisor.supervisor.commands import CommandError
from mcpvisor.supervisor.commands.activity import parse_duration
from mcpvisor.wire.config import ConfigError

EXIT_OK, EXIT_BROKEN, EXIT_USAGE = 0, 1, 2
EXPORTED: Final = (
    "id",
    *audit_chain.HASHED,
    "prev_hash",
    "hash",
)
PAGE: Final = 2000

ConfigPath = Callable[[str | None], Path]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], config_help: str, find: ConfigPath) -> None:
    activity = sub.add_parser(
        "activity",
        help="check the activity log's hash chain, or export it as JSON lines (offline)",
        description="The activity log (calls, policy decisions, approvals, logins) is a hash chain: each row's hash "
        "covers the row before it. These work on the state store directly, whether mcpvisor runs or not.",
    )
    actions = activity.add_subparsers(dest="activity_command", metavar="ACTION", required=True)
    verify = actions.add_parser(
        "verify",
        help="check the whole chain; name the first row that does not match (exit 0 intact, 1 otherwise)",
        description="Check every row's hash and its link to the row before it, oldest first. An edited row is named "
        "itself; a deleted row is named by the row after it. Exit 0 when intact, 1 when a row does not match, 2 for a "
        "config error. The newest hash is printed: kept elsewhere, it also shows rows cut from the end.",
    )
    verify.add_argument("-c", "--config", help=config_help)
    verify.add_argument("--json", action="store_true", help="print the verdict as JSON")
    verify.set_defaults(func=lambda args: cmd_verify(args, find(args.config)))
    export = actions.add_parser(
        "export",
        help="write the activity log as JSON lines (for a SIEM), oldest first",
        description="One JSON object per row, oldest first, with its hash and the previous row's hash, so the "
        "export itself can be checked.",
    )
    export.add_argument("-c", "--config", help=config_help)
    export.add_argument("--since", help="only the last 30s, 15m, 2h, 7d")
    export.add_argument("--after", type=int, default=0, metavar="ID", help="only rows with a larger id")
    export.add_argument("-o", "--output", help="write to this file instead of standard output")
    export.set_defaults(func=lambda args: cmd_export(args, find(args.config)))


@contextlib.contextmanager
def _open(path: Path) -> Iterator[Any]:
    """The config's state store, for reading: None when this host has no activity log yet."""
    config = config_mod.load(path)
    if config.mcpvisor.state_url:
        from mcpvisor.store.state_pg import PostgresState  # the driver loads only where it is used

        store = PostgresState(config.mcpvisor.state_url)
        try:
            yield store
        finally:
            store.close()
        return
    location = config_mod.data_dir(config, path.resolve()) / STATE_FILE
    if not location.exists():
        yield None
        return
    db = sqlite3.connect(f"{location.resolve().as_uri()}?mode=ro", uri=True, timeout=5.0)
    try:
        yield db
    finally:
        db.close()


def cmd_verify(args: argparse.Namespace, path: Path) -> int:
    try:
        with _open(path) as db:
            if db is None:
                print("activity log: empty (no state store yet): nothing to verify")
                return EXIT_OK
            verdict = audit_chain.verify(db)
            bad = _describe_row(db, verdict.bad_id) if verdict.bad_id is not None else ""
    except ConfigError as exc:
        print(f"mcpvisor: config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (StateStoreError, sqlite3.Error) as exc:
        print(f"mcpvisor: activity verify: cannot read the activity log: {_store_error(exc)}", file=sys.stderr)
        return EXIT_BROKEN
    if args.json:
        print(
            json.dumps(
                {
                    "intact": verdict.intact,
                    "rows": verdict.rows,
                    "unchained": verdict.unchained,
                    "first_id": verdict.first_id,
                    "last_good_id": verdict.last_id,
                    "head": verdict.head,
                    "bad_id": verdict.bad_id,
                    "problem": verdict.problem,
                },
                indent=2,
            )
        )
        return EXIT_OK if verdict.intact else EXIT_BROKEN
    if verdict.intact:
        span = f" (ids {verdict.first_id} to {verdict.last_id})" if verdict.rows else ""
        print(f"activity log intact: {verdict.rows} rows chained{span}")
        if verdict.unchained:
            print(f"{verdict.unchained} older rows were written before the chain and are not covered")
        print(f"newest hash: {verdict.head or '(none yet)'}")
        return EXIT_OK
    print(f"activity log: NOT intact: {verdict.problem}")
    if bad:
        print(f"  row {verdict.bad_id} is: {bad}")
    upto = f" (up to id {verdict.last_id})" if verdict.last_id else ""
    print(f"  rows checked and matching before it: {verdict.rows}{upto}")
    return EXIT_BROKEN


def _describe_row(db: Any, row_id: int) -> str:
    row = db.execute("SELECT time, kind, server, tool, outcome FROM calls WHERE id = ?", (row_id,)).fetchone()
    if row is None:
        return ""
    when = datetime.fromtimestamp(row[0], UTC).strftime("%Y-%m-%d %H:%M:%S") if isinstance(row[0], float | int) else "?"
    return f"{when} {row[1]} {row[2]}:{row[3]} {row[4]}"


def cmd_export(args: argparse.Namespace, path: Path) -> int:
    try:
        since = time.time() - parse_duration(args.since) if args.since else None
    except CommandError as exc:
        print(f"mcpvisor: activity export: {exc.message.removeprefix('activity: ')}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with _open(path) as db, _output(args.output) as out:
            if db is None:
                return EXIT_OK
            count = 0
            for row in _rows(db, args.after, since):
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
                count += 1
    except ConfigError as exc:
        print(f"mcpvisor: config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # the reader stopped (`| head`): not an error of the export
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except OSError as exc:
        print(f"mcpvisor: activity export: {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_BROKEN
    except (StateStoreError, sqlite3.Error) as exc:
        print(f"mcpvisor: activity export: cannot read the activity log: {_store_error(exc)}", file=sys.stderr)
        return EXIT_BROKEN
    if args.output:
        print(f"{args.output}: {count} rows", file=sys.stderr)
    return EXIT_OK


@contextlib.contextmanager
def _output(name: str | None) -> Iterator[TextIO]:
    if not name:
        yield sys.stdout
        return
    with open(name, "w", encoding="utf-8") as out:
        yield out


def _rows(db: Any, after: int, since: float | None) -> Iterator[dict[str, Any]]:
    while True:
        where = "id > ?" + (" AND time >= ?" if since is not None else "")
        values: tuple[Any, ...] = (after, since) if since is not None else (after,)
        page = db.execute(
            f"SELECT {', '.join(EXPORTED)} FROM calls WHERE {where} ORDER BY id LIMIT {PAGE}", values
        ).fetchall()
        for values_row in page:
            row = dict(zip(EXPORTED, values_row, strict=True))
            row["timestamp"] = datetime.fromtimestamp(row["time"], UTC).isoformat(timespec="milliseconds")
            yield row
        if len(page) < PAGE:
            return
        after = page[-1][0]


def _store_error(exc: BaseException) -> str:
    text = str(exc)
    if "no such column" in text or "does not exist" in text:
        return f"{text} (the log was written by an older mcpvisor: start this one once to upgrade it)"
    return text
