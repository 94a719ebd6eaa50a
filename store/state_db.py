"""mcpvisor's runtime state in SQLite (`state.sqlite` in the data dir), in WAL mode.

Holds what is not configuration: the activity log of calls, the hashes of approved tools, and
the hashes of access tokens. The frontend writes calls and pins; `mcpvisor token` writes tokens,
whether or not mcpvisor runs (SQLite's locking keeps the writers apart).

With `[mcpvisor] state_url` the same tables live in PostgreSQL instead (store/state_pg.py), shared
by replicas; `open_store` gives whichever the settings name, and the code above it is the same.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from mcpvisor.store.state_url import StateStoreError
from mcpvisor.wire.endpoints import private_dirs

STATE_FILE: Final = "state.sqlite"

# The shared store's NOTIFY channel, and its topics (payloads): what changed.
CHANNEL: Final = "mcpvisor_state"
PINS: Final = "pins"
SERVERS: Final = "servers"
PROPOSALS: Final = "proposals"
HELD_CALLS: Final = "held_calls"

# Each entry upgrades the schema by one version; `PRAGMA user_version` records how far a file got.
_MIGRATIONS: Final[tuple[str, ...]] = (
    """
    CREATE TABLE calls (
        id INTEGER PRIMARY KEY,
        time REAL NOT NULL,
        server TEXT NOT NULL,
        tool TEXT NOT NULL,
        variant TEXT NOT NULL,
        intent TEXT,
        outcome TEXT NOT NULL,
        duration_ms REAL NOT NULL
    );
    CREATE INDEX calls_by_time ON calls (time);
    CREATE TABLE tool_approvals (
        server TEXT NOT NULL,
        tool TEXT NOT NULL,
        hash TEXT NOT NULL,
        approved_at REAL NOT NULL,
        PRIMARY KEY (server, tool)
    );
    """,
    # Pins cover prompts as well as tools; earlier tool approvals are kept as they were.
    """
    CREATE TABLE pins (
        server TEXT NOT NULL,
        kind TEXT NOT NULL,
        name TEXT NOT NULL,
        hash TEXT NOT NULL,
        approved_at REAL NOT NULL,
        PRIMARY KEY (server, kind, name)
    );
    INSERT INTO pins (server, kind, name, hash, approved_at)
        SELECT server, 'tool', tool, hash, approved_at FROM tool_approvals;
    DROP TABLE tool_approvals;
    """,
    # The activity log covers resources/read and prompts/get, and says who asked, where, and how much came back.
    """
    ALTER TABLE calls ADD COLUMN request_id TEXT NOT NULL DEFAULT '';
    ALTER TABLE calls ADD COLUMN kind TEXT NOT NULL DEFAULT 'tool';
    ALTER TABLE calls ADD COLUMN client TEXT NOT NULL DEFAULT '';
    ALTER TABLE calls ADD COLUMN tenant TEXT NOT NULL DEFAULT '';
    ALTER TABLE calls ADD COLUMN endpoint TEXT NOT NULL DEFAULT '';
    ALTER TABLE calls ADD COLUMN result_bytes INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE calls ADD COLUMN arguments TEXT;
    ALTER TABLE calls ADD COLUMN result TEXT;
    CREATE INDEX calls_by_server ON calls (server, time);
    """,
    # W3C trace context of the client's request, so a row can be found from a trace.
    """
    ALTER TABLE calls ADD COLUMN traceparent TEXT NOT NULL DEFAULT '';
    ALTER TABLE calls ADD COLUMN tracestate TEXT NOT NULL DEFAULT '';
    """,
    # Access tokens of tenants and operators: only a hash of each is kept.
    """
    CREATE TABLE tokens (
        id TEXT PRIMARY KEY,
        hash TEXT NOT NULL UNIQUE,
        tenant TEXT NOT NULL,
        admin INTEGER NOT NULL,
        created REAL NOT NULL,
        expires REAL,
        last_used REAL
    );
    """,
    # Policies' decisions on each call, and the hash chain that shows an edited or deleted row
    # (store/audit_chain.py); rows from before it have no hash. The anchor is the hash of the last
    # row retention deleted.
    """
    ALTER TABLE calls ADD COLUMN decision TEXT NOT NULL DEFAULT '';
    ALTER TABLE calls ADD COLUMN policies TEXT NOT NULL DEFAULT '';
    ALTER TABLE calls ADD COLUMN prev_hash TEXT;
    ALTER TABLE calls ADD COLUMN hash TEXT;
    CREATE TABLE calls_anchor (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        last_id INTEGER NOT NULL,
        hash TEXT
    );
    """,
)


def open_state_db(data_dir: str) -> sqlite3.Connection:
    """Open (creating and upgrading as needed) the state store; in memory when there is no data dir."""
    if data_dir:
        private_dirs(Path(data_dir))
        location = str(Path(data_dir) / STATE_FILE)
        # SQLite gives new -wal and -shm files the database's own mode: make it 0600 first. Files
        # an earlier version left readable by others are narrowed too.
        os.close(os.open(location, os.O_RDWR | os.O_CREAT, 0o600))
        for path in (location, f"{location}-wal", f"{location}-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.chmod(path, 0o600)
    else:
        location = ":memory:"
    db = sqlite3.connect(location, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    # With WAL, NORMAL syncs at checkpoints only: a power cut may lose the last calls logged, never
    # corrupt the file; a call must not wait for a disk flush.
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("PRAGMA busy_timeout=2000")
    version = db.execute("PRAGMA user_version").fetchone()[0]
    for number, script in enumerate(_MIGRATIONS[version:], start=version + 1):
        db.executescript(f"BEGIN; {script} PRAGMA user_version = {number}; COMMIT;")
    return db


def open_store(data_dir: str, state_url: str | None) -> Any:
    """The state store the settings name: PostgreSQL at `state_url` (a `PostgresState`), else SQLite.

    Either answers `execute`/`executemany` as an `sqlite3.Connection` does. The shared store's
    schema is brought up to date here (StateStoreError says why it cannot be used).
    """
    if not state_url:
        return open_state_db(data_dir)
    from mcpvisor.store.state_pg import PostgresState  # the driver loads only where it is used

    store = PostgresState(state_url)
    store.migrate()
    return store


def is_shared(db: Any) -> bool:
    """Whether `db` is the shared (network) store, whose calls must stay off an event loop."""
    return bool(getattr(db, "remote", False))


@contextlib.contextmanager
def transaction(db: Any) -> Iterator[Any]:
    """Statements that commit together on either store; yields what to `execute` them on."""
    if is_shared(db):
        with db.transaction() as session:
            yield session
        return
    db.execute("BEGIN")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def notify(session: Any, topic: str) -> None:
    """Tell other replicas that `topic` changed (with the transaction, on the shared store; else nothing)."""
    if hasattr(session, "notify"):
        session.notify(topic)


# What a failing store raises, whichever it is: callers that survive a failing store catch these.
STORE_ERRORS: Final = (sqlite3.Error, StateStoreError)
