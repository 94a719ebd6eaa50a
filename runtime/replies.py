"""One-shot reply slots: a request waits for exactly one answer, matched by its id.

The task that receives from a socket delivers answers with `PendingReplies.deliver`; the task that
sent the request waits on its `ReplySlot`. An answer for an id nobody waits for any more (it timed
out or was cancelled) is dropped.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

import trio

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class ReplySlot(Generic[T]):
    """Holds the one answer to one request; the first delivery wins."""

    def __init__(self) -> None:
        self._done = trio.Event()
        self._value: T | None = None

    @property
    def delivered(self) -> bool:
        return self._done.is_set()

    def deliver(self, value: T) -> bool:
        """Store the answer and wake the waiter; False when an answer was already delivered."""
        if self._done.is_set():
            return False
        self._value = value
        self._done.set()
        return True

    async def wait(self, timeout: float = float("inf")) -> T:
        """The answer; raises `trio.TooSlowError` when none comes within `timeout` seconds."""
        with trio.fail_after(timeout):
            await self._done.wait()
        return self._value  # type: ignore[return-value]  # set together with _done


class PendingReplies(Generic[K, T]):
    """The slots of the requests in flight, by request id."""

    def __init__(self) -> None:
        self._slots: dict[K, ReplySlot[T]] = {}

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, key: object) -> bool:
        return key in self._slots

    @contextmanager
    def expect(self, key: K) -> Iterator[ReplySlot[T]]:
        """A slot for the answer to request `key`, forgotten when the block ends however it ends."""
        if key in self._slots:
            raise ValueError(f"request id {key!r} is already waiting for an answer")
        slot: ReplySlot[T] = ReplySlot()
        self._slots[key] = slot
        try:
            yield slot
        finally:
            del self._slots[key]

    def deliver(self, key: K, value: T) -> bool:
        """Hand an answer to whoever waits for `key`; False when nobody does (late or unknown)."""
        slot = self._slots.get(key)
        return slot is not None and slot.deliver(value)

    def deliver_all(self, value: T) -> None:
        """Answer every request still waiting (the peer went away)."""
        for slot in self._slots.values():
            slot.deliver(value)
