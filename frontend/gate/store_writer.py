"""Writes to the state store, kept off the event loop when the store is shared (PostgreSQL).

SQLite in the data dir is written in place, as it always was: a local write in WAL mode costs
less than handing it to a thread. The shared store is a network round trip: its writes queue
here and one task runs them in order in a worker thread, so a call never waits for the database
and the order of writes (a pin, then the quarantine lifted) is kept.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Final

import trio

from mcpvisor.store.state_db import STORE_ERRORS, is_shared

log = logging.getLogger(__name__)

QUEUE_LIMIT: Final = 10_000  # writes waiting; beyond it the store is down or far too slow: they are dropped
BATCH: Final = 256  # writes run in one trip to a thread
SHUTDOWN_BUDGET: Final = 2.0  # seconds a stopping frontend spends on writes still queued


class StoreWriter:
    """Runs writes to `db` now (SQLite) or in order in a worker thread (the shared store)."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self.deferred = is_shared(db)
        self._send, self._receive = trio.open_memory_channel[Callable[[], None]](QUEUE_LIMIT)

    def submit(
        self, write: Callable[[], None], what: str, done: Callable[[BaseException | None], None] | None = None
    ) -> None:
        """Run `write` (now, raising as it does; or soon, its failure logged). `what` names it in a log line.

        `done` is told how a deferred write ended (None: written), from the thread that ran it.
        """
        if not self.deferred:
            write()
            return

        def logged() -> None:
            try:
                write()
            except STORE_ERRORS as exc:
                log.error("state store: cannot record %s: %s", what, exc)
                if done is not None:
                    done(exc)
            else:
                if done is not None:
                    done(None)

        try:
            self._send.send_nowait(logged)
        except trio.WouldBlock:
            log.error("state store: %d writes are waiting; %s is not recorded", QUEUE_LIMIT, what)
            if done is not None:
                done(OverflowError(f"{QUEUE_LIMIT} writes are waiting"))

    async def flush(self) -> None:
        """Wait until every write submitted so far is done."""
        if not self.deferred:
            return
        done = trio.Event()
        token = trio.lowlevel.current_trio_token()
        await self._send.send(lambda: token.run_sync_soon(done.set))
        await done.wait()

    async def serve(self) -> None:
        """Run the queued writes, a batch per trip to a worker thread."""
        if not self.deferred:
            return
        async for write in self._receive:
            batch = [write]
            while len(batch) < BATCH:
                try:
                    batch.append(self._receive.receive_nowait())
                except trio.WouldBlock:
                    break
            await trio.to_thread.run_sync(_run_all, batch)

    def run_pending(self, budget: float = SHUTDOWN_BUDGET) -> None:
        """Run what is still queued, here and now (blocking), for at most `budget` seconds: at shutdown,
        so the last calls are logged, without a store that is down holding the stop up."""
        deadline = time.monotonic() + budget
        while time.monotonic() < deadline:
            try:
                write = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return
            write()


def _run_all(batch: list[Callable[[], None]]) -> None:
    for write in batch:
        write()
