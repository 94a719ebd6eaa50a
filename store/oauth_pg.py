"""Upstream OAuth logins kept in the shared store (`state_url`): every replica's worker of an id uses one.

Without a shared store each worker keeps its login in a file (store/oauth_store.py). With one, the
same record (a `TokenFile` as JSON) is a row of `oauth_logins`, keyed by the worker id (or the plain
server's for an `oauth.shared` login), so a login done through one replica serves all, and a logout
through one ends it on all.

A refresh is the delicate part: many authorization servers rotate the refresh token and revoke the
whole grant when an old one is used again. So a replica refreshes only while holding the record's
advisory lock (`pg_advisory_xact_lock`, for the transaction), after reading the record again: if
another replica refreshed meanwhile, it takes the stored tokens instead of spending its old refresh
token. The calls block; the worker makes them from threads.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import msgspec
import psycopg

from mcpvisor.store.oauth_store import TokenFile
from mcpvisor.store.state_pg import PostgresState
from mcpvisor.store.state_url import StateStoreError

_decoder = msgspec.json.Decoder(TokenFile)
# The advisory lock of one record: a 64-bit hash of its key, in a namespace of its own.
_LOCK_KEY = "SELECT pg_advisory_xact_lock(hashtextextended('mcpvisor oauth ' || %s, 0))"
_UPSERT = (
    "INSERT INTO oauth_logins (worker, body, updated_at) VALUES (%s, %s, %s)"
    " ON CONFLICT (worker) DO UPDATE SET body = excluded.body, updated_at = excluded.updated_at,"
    " version = nextval(pg_get_serial_sequence('oauth_logins', 'version'))"
    " RETURNING version"
)


def _decode(body: str) -> TokenFile:
    try:
        return _decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return TokenFile()  # unreadable: as if there were no login (never echoed, it holds tokens)


def logins(store: PostgresState) -> list[tuple[str, float | None]]:
    """Every stored login with a token: (worker id, expiry or None), sorted by worker id."""
    found = []
    for worker, body in store.execute("SELECT worker, body FROM oauth_logins ORDER BY worker").fetchall():
        stored = _decode(body)
        if stored.tokens:
            found.append((worker, stored.expires_at))
    return found


def remove(store: PostgresState, key: str) -> bool:
    """Forget a login (a logout while no worker of it runs here); whether there was one with a token."""
    row = store.execute("DELETE FROM oauth_logins WHERE worker = ? RETURNING body", (key,)).fetchone()
    return row is not None and bool(_decode(row[0]).tokens)


class RefreshHold:
    """A refresh in progress: the record's lock held by an open transaction until `commit` or `close`."""

    def __init__(self, connection: psycopg.Connection[Any], key: str) -> None:
        self.connection = connection
        self.key = key

    def commit(self, content: TokenFile) -> object:
        """Write the refreshed record and release the lock; its new version."""
        try:
            row = self.connection.execute(
                _UPSERT, (self.key, msgspec.json.encode(content).decode(), time.time())
            ).fetchone()
            self.connection.execute("COMMIT")
        except psycopg.Error as exc:
            raise StateStoreError(f"the login could not be stored ({type(exc).__name__})") from None
        return row[0] if row else None

    def close(self) -> None:
        """Release the lock (rolling back what was not committed) and the connection."""
        with contextlib.suppress(psycopg.Error):
            self.connection.close()


class SharedRecord:
    """One worker id's login in the shared store: the same calls as `FileRecord`, plus `hold`."""

    shared_store = True

    def __init__(self, store: PostgresState, key: str) -> None:
        self.store = store
        self.key = key

    def version(self) -> object | None:
        row = self.store.execute("SELECT version FROM oauth_logins WHERE worker = ?", (self.key,)).fetchone()
        return row[0] if row is not None else None

    def load(self) -> TokenFile:
        row = self.store.execute("SELECT body FROM oauth_logins WHERE worker = ?", (self.key,)).fetchone()
        return _decode(row[0]) if row is not None else TokenFile()

    def load_versioned(self) -> tuple[TokenFile, object | None]:
        row = self.store.execute("SELECT body, version FROM oauth_logins WHERE worker = ?", (self.key,)).fetchone()
        return (_decode(row[0]), row[1]) if row is not None else (TokenFile(), None)

    def save(self, content: TokenFile) -> object | None:
        body = msgspec.json.encode(content).decode()
        row = self.store.execute(_UPSERT.replace("%s", "?"), (self.key, body, time.time())).fetchone()
        return row[0] if row is not None else None

    def remove(self) -> bool:
        return remove(self.store, self.key)

    def hold(self) -> tuple[RefreshHold, TokenFile, object | None]:
        """Take the record's lock (waiting while another replica refreshes) and read it as it is now."""
        connection = self.store.connect()
        try:
            connection.execute("BEGIN")
            connection.execute(_LOCK_KEY, (self.key,))
            row = connection.execute("SELECT body, version FROM oauth_logins WHERE worker = %s", (self.key,)).fetchone()
        except psycopg.Error as exc:
            with contextlib.suppress(psycopg.Error):
                connection.close()
            raise StateStoreError(self.store.describe(exc)) from None
        except BaseException:
            with contextlib.suppress(psycopg.Error):
                connection.close()
            raise
        stored, version = (_decode(row[0]), row[1]) if row is not None else (TokenFile(), None)
        return RefreshHold(connection, self.key), stored, version
