"""Access tokens of tenants and operators: random 256-bit secrets of which only a hash is kept.

`mcpvisor token add` prints a token once; the state store keeps its SHA-256 (a slow hash buys
nothing for a random 256-bit secret). A presented token is looked up by its hash and the stored
hash compared in constant time, so every check reads the store: a revocation holds at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import secrets
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import trio

from mcpvisor.store.state_db import is_shared
from mcpvisor.store.state_url import StateStoreError

_T = TypeVar("_T")

PREFIX: Final = "mcpv_"  # tells a token of this store from a JWT, and makes leaked ones easy to find
# `last_used` is written at most this often per token: a call must not wait for a disk write.
TOUCH_INTERVAL: Final = 60.0


class TokenError(Exception):
    """A token command that cannot be done; the message says why."""


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """One stored token, never the token itself."""

    id: str
    tenant: str
    admin: bool
    created: float
    expires: float | None
    last_used: float | None

    def as_row(self) -> dict[str, object]:
        return {
            "id": self.id,
            "tenant": self.tenant,
            "admin": self.admin,
            "created": self.created,
            "expires": self.expires,
            "last_used": self.last_used,
        }


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


class TokenStore:
    """The `tokens` table of the state store (store/state_db.py), SQLite's or the shared one.

    The `a*` methods are for an event loop: on the shared store they run in a worker thread.
    """

    def __init__(self, db: Any) -> None:
        self.db = db
        self._touched: dict[str, float] = {}

    async def _off_loop(self, call: Callable[[], _T]) -> _T:
        return await trio.to_thread.run_sync(call) if is_shared(self.db) else call()

    async def acheck(self, token: str) -> TokenInfo | None:
        return await self._off_loop(lambda: self.check(token))

    async def alist(self) -> list[TokenInfo]:
        return await self._off_loop(self.list)

    async def aadd(self, tenant: str, *, admin: bool = False, expires: float | None = None) -> tuple[TokenInfo, str]:
        return await self._off_loop(lambda: self.add(tenant, admin=admin, expires=expires))

    async def arevoke(self, token_id: str) -> TokenInfo:
        return await self._off_loop(lambda: self.revoke(token_id))

    def add(self, tenant: str, *, admin: bool = False, expires: float | None = None) -> tuple[TokenInfo, str]:
        """A new token for `tenant`: its row, and the token (shown once, never stored)."""
        token = PREFIX + secrets.token_urlsafe(32)
        info = TokenInfo(secrets.token_hex(4), tenant, admin, time.time(), expires, None)
        self.db.execute(
            "INSERT INTO tokens (id, hash, tenant, admin, created, expires) VALUES (?, ?, ?, ?, ?, ?)",
            (info.id, _digest(token), tenant, int(admin), info.created, expires),
        )
        return info, token

    def list(self) -> list[TokenInfo]:
        rows = self.db.execute(
            "SELECT id, tenant, admin, created, expires, last_used FROM tokens ORDER BY created, id"
        ).fetchall()
        return [TokenInfo(r[0], r[1], bool(r[2]), r[3], r[4], r[5]) for r in rows]

    def revoke(self, token_id: str) -> TokenInfo:
        """Delete one token; TokenError when there is no such id."""
        found = [info for info in self.list() if info.id == token_id]
        if not found:
            raise TokenError(f"no token with id {token_id!r} (see `mcpvisor token list`)")
        self.db.execute("DELETE FROM tokens WHERE id = ?", (token_id,))
        return found[0]

    def check(self, token: str, *, now: float | None = None) -> TokenInfo | None:
        """The stored token `token` is, if it is one and has not expired; None otherwise."""
        if not token.startswith(PREFIX) or len(token) > 200:
            return None
        digest = _digest(token)
        row = self.db.execute(
            "SELECT id, hash, tenant, admin, created, expires, last_used FROM tokens WHERE hash = ?", (digest,)
        ).fetchone()
        if row is None or not hmac.compare_digest(row[1], digest):
            return None
        now = time.time() if now is None else now
        if row[5] is not None and row[5] <= now:
            return None
        if now - self._touched.get(row[0], 0.0) >= TOUCH_INTERVAL:
            self._touched[row[0]] = now
            # Busy, or the shared store failing: the next use records it.
            with contextlib.suppress(sqlite3.OperationalError, StateStoreError):
                self.db.execute("UPDATE tokens SET last_used = ? WHERE id = ?", (now, row[0]))
        return TokenInfo(row[0], row[2], bool(row[3]), row[4], row[5], now)


MIN_TOKEN_LENGTH: Final = 32  # a token from a file must be at least this long: it is all that guards the door


def digest(token: str) -> str:
    """The hash a token is known by."""
    return _digest(token)


def read_token_file(path: str) -> str:
    """The token a secret file holds (surrounding whitespace dropped); TokenError without its content."""
    try:
        with open(path, encoding="utf-8") as file:
            token = file.read(4096).strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenError(
            f"token file {path}: cannot read it ({getattr(exc, 'strerror', None) or type(exc).__name__})"
        ) from None
    if len(token) < MIN_TOKEN_LENGTH or any(c.isspace() for c in token):
        raise TokenError(f"token file {path}: a token must be one word of at least {MIN_TOKEN_LENGTH} characters")
    return token


def parse_expiry(text: str, *, now: float | None = None) -> float:
    """`30d`, `12h`, `90m`, `3600s` or an ISO date/time -> a Unix time; TokenError otherwise."""
    import datetime
    import re

    now = time.time() if now is None else now
    if m := re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip()):
        seconds = float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
        if seconds <= 0:
            raise TokenError("--expires must be in the future")
        return now + seconds
    try:
        when = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise TokenError(
            f"--expires {text!r}: give a duration (30d, 12h, 90m) or an ISO date (2027-01-31, 2027-01-31T12:00Z)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    if when.timestamp() <= now:
        raise TokenError(f"--expires {text!r} is in the past")
    return when.timestamp()
