"""Handshake-era sessions: what `initialize` settled, kept by `Mcp-Session-Id` until DELETE or idleness.

Pure state, no I/O: the engine (engine.py) opens, finds and ends sessions; the serving loop
(serving.py) counts the requests in flight on them and ends the idle ones it is told of.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from mcpvisor.frontend.endpoints.eras import DEFAULT_HANDSHAKE

IDLE_TIMEOUT: Final = 30 * 60.0  # seconds a session lives with no request in flight
MAX_SESSIONS: Final = 10_000  # per endpoint: past it, a new session is refused with 503


@dataclass(eq=False)
class Session:
    """One client's handshake-era session with one endpoint."""

    id: str
    owner: str  # who opened it: only the same credential may use it
    version: str = DEFAULT_HANDSHAKE
    capabilities: dict[str, Any] = field(default_factory=dict)
    client_info: dict[str, Any] = field(default_factory=dict)
    initialized: bool = False  # `initialize` was answered (or `notifications/initialized` came)
    log_level: str | None = None  # set by logging/setLevel: upstream log lines at and above it
    stream_open: bool = False  # its GET stream is open
    in_flight: int = 0  # requests being served, its GET stream included
    last_active: float = 0.0
    ended: bool = False

    @property
    def client_name(self) -> str:
        name = self.client_info.get("name")
        return name if isinstance(name, str) else ""

    def declares(self, capability: str) -> bool:
        return isinstance(self.capabilities.get(capability), dict)


class Sessions:
    """One endpoint's sessions by id."""

    def __init__(
        self,
        *,
        idle_timeout: float = IDLE_TIMEOUT,
        limit: int = MAX_SESSIONS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.idle_timeout = idle_timeout
        self.limit = limit
        self._clock = clock
        self._by_id: dict[str, Session] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[Session]:
        return iter(list(self._by_id.values()))

    def open(self, owner: str) -> Session | None:
        """A new session for `owner`; None when the endpoint holds as many as it may."""
        if len(self._by_id) >= self.limit:
            return None
        session = Session(uuid.uuid4().hex, owner, last_active=self._clock())
        self._by_id[session.id] = session
        return session

    def known(self, session_id: str) -> bool:
        return session_id in self._by_id

    def find(self, session_id: str, owner: str) -> Session | None:
        """The live session `session_id` of `owner`; None for one that is unknown, ended or another's."""
        session = self._by_id.get(session_id)
        if session is None or session.ended or session.owner != owner:
            return None
        return session

    def end(self, session: Session) -> None:
        session.ended = True
        self._by_id.pop(session.id, None)

    def begin(self, session: Session) -> None:
        """A request of the session is being served: it is not idle."""
        session.in_flight += 1
        session.last_active = self._clock()

    def finish(self, session: Session) -> None:
        session.in_flight -= 1
        session.last_active = self._clock()

    def idle(self) -> list[Session]:
        """The sessions with nothing in flight for longer than the idle timeout."""
        cutoff = self._clock() - self.idle_timeout
        return [s for s in self._by_id.values() if s.in_flight <= 0 and s.last_active < cutoff]
