"""The state store in PostgreSQL (`[mcpvisor] state_url`), shared by every replica of mcpvisor.

The tables are those of the SQLite store (store/state_db.py), plus what replicas must agree on that
a single host keeps in files: the operator's run-time changes to the servers and the clients'
pending proposals. `PostgresState` answers the same `execute` calls as an `sqlite3.Connection`
(with `?` placeholders), so the code above the store is one; each call takes a connection of a
pool, so threads calling at once do not queue behind one another. The calls block: the frontend
makes them from worker threads (trio.to_thread), never from its event loop.

A change other replicas must see is announced with NOTIFY on one channel (`CHANNEL`); each
process that holds such state LISTENs (`Listener`) and also re-reads periodically, as a safety net
for a notification lost with a dropped connection.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, Final, TypeVar

import psycopg
import psycopg_pool
import trio

from mcpvisor.store.state_db import CHANNEL
from mcpvisor.store.state_url import StateStoreError, resolve_url
from mcpvisor.wire.redaction import redact_url

log = logging.getLogger(__name__)
_T = TypeVar("_T")

# pg_advisory_xact_lock key that serializes schema upgrades: replicas starting at once on an empty
# database would otherwise both create the tables (the text "mcpvisor" as a number).
MIGRATION_LOCK: Final = 0x6D637076_69736F72
CONNECT_TIMEOUT: Final = 10  # seconds, per connection attempt
# Seconds a statement waits for a connection of the pool: with the store down, a request is
# refused this soon (a 503 to retry) rather than held.
POOL_WAIT: Final = 3.0
# Seconds a statement of the pool may run (a lock held elsewhere, a server that stopped
# answering): the caller gets an error, not a wait without end. Not on connect()'s connections:
# a migration waits for another replica's, and LISTEN waits by design.
STATEMENT_TIMEOUT: Final = 10.0
# A server gone without closing its connections (a host lost, a network cut) is found out by TCP
# within about this many seconds, on every connection, rather than after the kernel's hours.
_KEEPALIVE: Final = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 15_000,  # milliseconds that data sent may stay unacknowledged
}
RESYNC_EVERY: Final = 5.0  # seconds between full re-reads by `follow`, whatever was notified
WAIT_SLICE: Final = 0.5  # seconds a wait for notifications blocks its thread (bounds the wait at shutdown)


# Each entry upgrades the schema by one version; `mcpvisor_schema.version` records how far it got.
_MIGRATIONS: Final[tuple[str, ...]] = (
    """
    CREATE TABLE calls (
        id BIGSERIAL PRIMARY KEY,
        request_id TEXT NOT NULL DEFAULT '',
        time DOUBLE PRECISION NOT NULL,
        client TEXT NOT NULL DEFAULT '',
        tenant TEXT NOT NULL DEFAULT '',
        endpoint TEXT NOT NULL DEFAULT '',
        kind TEXT NOT NULL DEFAULT 'tool',
        server TEXT NOT NULL,
        tool TEXT NOT NULL,
        variant TEXT NOT NULL,
        intent TEXT,
        outcome TEXT NOT NULL,
        duration_ms DOUBLE PRECISION NOT NULL,
        result_bytes BIGINT NOT NULL DEFAULT 0,
        arguments TEXT,
        result TEXT,
        traceparent TEXT NOT NULL DEFAULT '',
        tracestate TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX calls_by_time ON calls (time);
    CREATE INDEX calls_by_server ON calls (server, time);
    CREATE TABLE pins (
        server TEXT NOT NULL,
        kind TEXT NOT NULL,
        name TEXT NOT NULL,
        hash TEXT NOT NULL,
        approved_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (server, kind, name)
    );
    CREATE TABLE approved_definitions (
        server TEXT NOT NULL,
        name TEXT NOT NULL,
        hash TEXT NOT NULL,
        definition TEXT NOT NULL,
        PRIMARY KEY (server, name)
    );
    CREATE TABLE tokens (
        id TEXT PRIMARY KEY,
        hash TEXT NOT NULL UNIQUE,
        tenant TEXT NOT NULL,
        admin INTEGER NOT NULL,
        created DOUBLE PRECISION NOT NULL,
        expires DOUBLE PRECISION,
        last_used DOUBLE PRECISION
    );
    -- The operator's run-time changes to the servers, over the config file: the latest per
    -- server (its table as JSON, NULL: removed), applied in `seq` order.
    CREATE TABLE server_changes (
        name TEXT PRIMARY KEY,
        server TEXT,
        tenant TEXT NOT NULL DEFAULT '',
        seq BIGSERIAL NOT NULL,
        changed_at DOUBLE PRECISION NOT NULL
    );
    -- Small documents kept whole (the pending proposals).
    CREATE TABLE documents (
        name TEXT PRIMARY KEY,
        body TEXT NOT NULL
    );
    """,
    """
    -- Upstream OAuth logins (store/oauth_pg.py), one per worker id: the record a worker of that id
    -- reads on every replica. `version` takes a new value of its sequence at every write.
    CREATE TABLE oauth_logins (
        worker TEXT PRIMARY KEY,
        body TEXT NOT NULL,
        version BIGSERIAL NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL
    );
    """,
    """
    -- Policies' decisions, and the activity log's hash chain (store/audit_chain.py).
    ALTER TABLE calls ADD COLUMN decision TEXT NOT NULL DEFAULT '';
    ALTER TABLE calls ADD COLUMN policies TEXT NOT NULL DEFAULT '';
    ALTER TABLE calls ADD COLUMN prev_hash TEXT;
    ALTER TABLE calls ADD COLUMN hash TEXT;
    CREATE TABLE calls_anchor (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        last_id BIGINT NOT NULL,
        hash TEXT
    );
    -- Calls waiting for an operator's approval, on whichever replica holds them
    -- (store/held_calls.py): any replica lists them and records a verdict, the holder runs it.
    CREATE TABLE held_calls (
        id TEXT PRIMARY KEY,
        replica TEXT NOT NULL,
        tenant TEXT NOT NULL,
        tool TEXT NOT NULL,
        arguments TEXT NOT NULL,
        since DOUBLE PRECISION NOT NULL,
        expires DOUBLE PRECISION NOT NULL,
        policies TEXT NOT NULL,
        endpoint TEXT NOT NULL DEFAULT '',
        client TEXT NOT NULL DEFAULT '',
        verdict TEXT,
        reason TEXT NOT NULL DEFAULT '',
        decided_by TEXT NOT NULL DEFAULT ''
    );
    """,
    """
    -- The uid each worker's sandbox runs as under a root mcpvisor (store/sandbox_uids.py): made
    -- here, under the migration lock, since replicas starting at once would both create it.
    CREATE TABLE IF NOT EXISTS sandbox_uids (
        worker TEXT PRIMARY KEY,
        uid BIGINT NOT NULL UNIQUE
    );
    """,
)


def _placeholders(sql: str) -> str:
    """SQLite's `?` placeholders as psycopg's `%s` (the statements here hold no literal ? or %)."""
    return sql.replace("%", "%%").replace("?", "%s")


class Rows:
    """What an `execute` gives back, read whole: rows, `rowcount`, and the sqlite3 cursor's fetch calls."""

    def __init__(self, rows: list[tuple[Any, ...]], rowcount: int) -> None:
        self.rows = rows
        self.rowcount = rowcount

    def fetchone(self) -> tuple[Any, ...] | None:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self.rows

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self.rows)


class _Session:
    """Statements on one connection (a transaction's), with the same calls as the store."""

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self.connection = connection

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        cursor = self.connection.execute(_placeholders(sql), tuple(params))
        rows = cursor.fetchall() if cursor.description is not None else []
        return Rows(rows, cursor.rowcount)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> Rows:
        with self.connection.cursor() as cursor:
            cursor.executemany(_placeholders(sql), [tuple(row) for row in rows])
            return Rows([], cursor.rowcount)

    def notify(self, topic: str) -> None:
        """Tell every listening replica that `topic` changed (sent when the transaction commits)."""
        self.connection.execute("SELECT pg_notify(%s, %s)", (CHANNEL, topic))


class PostgresState:
    """The shared store: a pool of autocommit connections behind sqlite3-like calls."""

    remote: Final = True

    def __init__(self, url: str, *, max_size: int = 4) -> None:
        self.shown = redact_url(url)
        self._url, self._redactor = resolve_url(url)
        self._pool: psycopg_pool.ConnectionPool[Any] | None = None
        self._max_size = max_size
        self._lock = threading.Lock()

    def describe(self, exc: BaseException) -> str:
        """An error of the store as one line that names it, never with its password."""
        text = " ".join(str(exc).split()) or type(exc).__name__
        return f"state store {self.shown}: {self._redactor(text)}"

    def connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        """One connection of its own (migrations, LISTEN); StateStoreError says why there is none."""
        try:
            return psycopg.connect(
                self._url, connect_timeout=CONNECT_TIMEOUT, autocommit=True, **{**_KEEPALIVE, **kwargs}
            )
        except psycopg.Error as exc:
            raise StateStoreError(self.describe(exc)) from None

    def migrate(self) -> int:
        """Bring the schema up to date, one replica at a time; the version reached."""
        with self.connect() as connection:
            try:
                with connection.transaction():
                    connection.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
                    connection.execute("CREATE TABLE IF NOT EXISTS mcpvisor_schema (version INTEGER NOT NULL)")
                    row = connection.execute("SELECT version FROM mcpvisor_schema").fetchone()
                    version = row[0] if row is not None else 0
                    if row is None:
                        connection.execute("INSERT INTO mcpvisor_schema (version) VALUES (0)")
                    if version > len(_MIGRATIONS):
                        raise StateStoreError(
                            f"state store {self.shown}: its schema is version {version}, newer than this mcpvisor"
                            f" knows ({len(_MIGRATIONS)}); upgrade mcpvisor"
                        )
                    for number, script in enumerate(_MIGRATIONS[version:], start=version + 1):
                        connection.execute(script)
                        connection.execute("UPDATE mcpvisor_schema SET version = %s", (number,))
                        log.info("state store %s: schema upgraded to version %d", self.shown, number)
                    return max(version, len(_MIGRATIONS))
            except psycopg.Error as exc:
                raise StateStoreError(self.describe(exc)) from None

    @property
    def pool(self) -> psycopg_pool.ConnectionPool[Any]:
        with self._lock:
            if self._pool is None:
                self._pool = psycopg_pool.ConnectionPool(
                    self._url,
                    min_size=1,
                    max_size=self._max_size,
                    kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT, **_KEEPALIVE},
                    configure=_limit_statements,
                    timeout=POOL_WAIT,
                    name="mcpvisor-state",
                    open=True,
                )
            return self._pool

    @contextlib.contextmanager
    def session(self) -> Iterator[_Session]:
        """A checked connection of the pool for a few statements; StateStoreError when the store fails.

        A connection the server dropped (a restart, a failover) is only found out when used: it is
        tried first, and replaced once, so the statements are not given a dead connection.
        """
        try:
            for attempt in (1, 2):
                with self.pool.connection() as connection:
                    try:
                        psycopg_pool.ConnectionPool.check_connection(connection)
                    except psycopg.OperationalError:
                        if attempt == 2:
                            raise
                        continue  # returned broken, the pool drops it
                    yield _Session(connection)
                    return
        except psycopg.Error as exc:
            raise StateStoreError(self.describe(exc)) from None

    @contextlib.contextmanager
    def transaction(self) -> Iterator[_Session]:
        """Statements that commit together (and their NOTIFYs with them), or not at all."""
        with self.session() as session, session.connection.transaction():
            yield session

    def _call(self, call: Callable[[_Session], _T]) -> _T:
        """`call` on a connection of the pool, once more on another if the first was dropped by the server.

        Unlike `session`, nothing is checked first: a round trip saved on every token check and
        activity row. A statement that found its connection dead was not run, so it is run again.
        """
        try:
            for attempt in (1, 2):
                try:
                    with self.pool.connection() as connection:
                        return call(_Session(connection))
                except psycopg_pool.PoolTimeout:
                    raise
                except psycopg.OperationalError:
                    if attempt == 2:
                        raise
            raise AssertionError("unreachable")
        except psycopg.Error as exc:
            raise StateStoreError(self.describe(exc)) from None

    # The calls of an sqlite3.Connection that the code above the store makes.

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        return self._call(lambda session: session.execute(sql, params))

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> Rows:
        return self._call(lambda session: session.executemany(sql, rows))

    def notify(self, topic: str) -> None:
        self._call(lambda session: session.notify(topic))

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None


def _limit_statements(connection: psycopg.Connection[Any]) -> None:
    # SET rather than `options` in the URL's place: options the operator gave in the URL are kept.
    connection.execute(f"SET statement_timeout = {int(STATEMENT_TIMEOUT * 1000)}")


class Listener:
    """LISTENs on CHANNEL on a connection of its own; `wait` blocks (in a thread) for the next topics."""

    def __init__(self, store: PostgresState) -> None:
        self.store = store
        self._connection: psycopg.Connection[Any] | None = None

    def wait(self, timeout: float) -> set[str] | None:
        """The topics notified within `timeout` seconds (maybe none); None when the connection was
        (re)made, so anything may have changed unseen. StateStoreError when the store is unreachable."""
        connection = self._connection
        fresh = connection is None or connection.closed
        topics: set[str] = set()
        try:
            if connection is None or connection.closed:
                # The server may end a new connection before it listens (a restart, a failover).
                connection = self._connection = self.store.connect()
                connection.execute(f"LISTEN {CHANNEL}")
            # Wake at the first notification, then take those already there: a change is applied
            # as soon as it is known, and a burst of them once.
            for notice in connection.notifies(timeout=timeout, stop_after=1):
                topics.add(notice.payload)
            if topics:
                for notice in connection.notifies(timeout=0.01, stop_after=64):
                    topics.add(notice.payload)
        except psycopg.Error as exc:
            self.close()
            raise StateStoreError(self.store.describe(exc)) from None
        return None if fresh else topics

    def close(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(psycopg.Error):
                self._connection.close()
            self._connection = None


async def follow(
    store: PostgresState,
    topics: frozenset[str],
    on_change: Callable[[frozenset[str]], Awaitable[None]],
    *,
    waiting: str,
) -> None:
    """Call `on_change` with those of `topics` another process announced, as soon as it does.

    Every RESYNC_EVERY seconds, and whenever the listening connection was made again, it is called
    with all of `topics`: a notification lost with a dropped connection is made good that way.
    While the store cannot be reached it says so once (naming `waiting`, what is held up) and tries
    again every second; a StateStoreError from `on_change` is logged, and the next re-read retries.
    """
    listener = Listener(store)
    last_full = -RESYNC_EVERY
    failing = False
    try:
        while True:
            try:
                heard = await trio.to_thread.run_sync(listener.wait, WAIT_SLICE)
            except StateStoreError as exc:
                if not failing:
                    log.warning("%s; retrying (%s wait)", exc, waiting)
                failing = True
                await trio.sleep(1.0)
                continue
            if failing:
                log.info("state store %s reachable again", store.shown)
                failing = False
            if heard is None or trio.current_time() - last_full >= RESYNC_EVERY:
                moved = topics
                last_full = trio.current_time()
            else:
                moved = topics.intersection(heard)
                if not moved:
                    continue
            try:
                await on_change(moved)
            except StateStoreError as exc:
                log.warning("%s; the next re-read tries again", exc)
    finally:
        listener.close()
