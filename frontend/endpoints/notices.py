"""What an endpoint says to its clients unasked: list changes, upstream log lines, resource updates.

Handshake-era clients hear it on their session's GET stream (log lines at the `logging/setLevel`
they chose, updates of the resources they subscribed to); 2026-07-28 clients on their
`subscriptions/listen` streams, each with the kinds of notice it asked for. Every notice is best
effort: a client that is not listening, or not reading, misses it and lists again later.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec
import trio

from mcpvisor.frontend.door.calls import tag_log
from mcpvisor.frontend.door.upstreams import NotFound, UpstreamError, Upstreams
from mcpvisor.frontend.endpoints import rpc
from mcpvisor.frontend.endpoints.eras import LOG_LEVELS, SUBSCRIPTION_ID_KEY
from mcpvisor.frontend.endpoints.sessions import Session

log = logging.getLogger(__name__)

LIST_CHANGED: Final = (
    "notifications/tools/list_changed",
    "notifications/resources/list_changed",
    "notifications/prompts/list_changed",
)
# The `subscriptions/listen` filter key that asks for each list's changes.
_LISTEN_KEYS: Final = {
    "notifications/tools/list_changed": "toolsListChanged",
    "notifications/resources/list_changed": "resourcesListChanged",
    "notifications/prompts/list_changed": "promptsListChanged",
}
STREAM_BUFFER: Final = 256  # notices held for a client that reads slowly; past it they are dropped
_decode = msgspec.json.Decoder(dict[str, Any])


@dataclass(eq=False)
class Listener:
    """One `subscriptions/listen` stream and the notices it asked for."""

    subscription_id: rpc.RequestId
    lists: frozenset[str]  # LIST_CHANGED methods it wants
    uris: frozenset[str]  # resources whose updates it wants
    channel: trio.MemorySendChannel[bytes] = field(repr=False, default=None)  # type: ignore[assignment]

    def honored(self) -> dict[str, Any]:
        """The filter as the acknowledgement repeats it: only what will be delivered."""
        found: dict[str, Any] = {key: True for method, key in _LISTEN_KEYS.items() if method in self.lists}
        if self.uris:
            found["resourceSubscriptions"] = sorted(self.uris)
        return found


class Notices:
    """One endpoint's listeners: sessions' GET streams, listen streams, and resource subscribers."""

    def __init__(self, upstreams: Upstreams, *, announce: Callable[[], bool] = lambda: True) -> None:
        self.upstreams = upstreams
        self.announce = announce  # whether list changes are told at all (an endpoint may have none)
        self._streams: dict[Session, trio.MemorySendChannel[bytes]] = {}
        self._listeners: set[Listener] = set()
        self._subscribers: dict[str, weakref.WeakSet[Any]] = {}
        self._changed = trio.Event()

    # -- streams ---------------------------------------------------------------------------------

    def open_stream(self, session: Session) -> trio.MemoryReceiveChannel[bytes]:
        """The session's GET stream opens: what it should hear comes out of the returned channel."""
        send, receive = trio.open_memory_channel[bytes](STREAM_BUFFER)
        self._streams[session] = send
        session.stream_open = True
        return receive

    def close_stream(self, session: Session) -> None:
        channel = self._streams.pop(session, None)
        session.stream_open = False
        if channel is not None:
            channel.close()

    def listen(
        self, subscription_id: rpc.RequestId, wanted: dict[str, Any]
    ) -> tuple[Listener, trio.MemoryReceiveChannel[bytes]]:
        lists = frozenset(method for method, key in _LISTEN_KEYS.items() if wanted.get(key) is True)
        uris = wanted.get("resourceSubscriptions")
        listener = Listener(subscription_id, lists, frozenset(u for u in uris or () if isinstance(u, str)))
        send, receive = trio.open_memory_channel[bytes](STREAM_BUFFER)
        listener.channel = send
        self._listeners.add(listener)
        return listener, receive

    def stop_listening(self, listener: Listener) -> None:
        self._listeners.discard(listener)
        listener.channel.close()

    def _put(self, channel: trio.MemorySendChannel[bytes], message: bytes) -> None:
        with contextlib.suppress(trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            channel.send_nowait(message)

    def tell(self, session: Session, method: str, params: dict[str, Any] | None) -> None:
        """A notice for one session, on its GET stream if it has one open."""
        channel = self._streams.get(session)
        if channel is not None:
            payload = None if params is None else msgspec.json.encode(params)
            self._put(channel, rpc.notification_message(method, payload))

    def sessions_hearing(self) -> int:
        return len(self._streams)

    # -- resource subscriptions ------------------------------------------------------------------

    async def subscribe(self, subscriber: object, uri: str) -> None:
        """The upstream is subscribed once per URI, however many subscribers there are."""
        server = self.upstreams.find_resource(uri)
        subscribers = self._subscribers.setdefault(uri, weakref.WeakSet())
        first = len(subscribers) == 0
        subscribers.add(subscriber)
        if first:
            await self.upstreams.request(server, "resources/subscribe", {"uri": uri})

    async def unsubscribe(self, subscriber: object, uri: str) -> None:
        subscribers = self._subscribers.get(uri)
        if subscribers is None:
            return
        subscribers.discard(subscriber)
        if len(subscribers) == 0:
            del self._subscribers[uri]
            with contextlib.suppress(NotFound, UpstreamError):
                server = self.upstreams.find_resource(uri)
                await self.upstreams.request(server, "resources/unsubscribe", {"uri": uri})

    async def forget(self, subscriber: object) -> None:
        """A session or listener is gone: its subscriptions end with it."""
        for uri in [uri for uri, subscribers in self._subscribers.items() if subscriber in subscribers]:
            await self.unsubscribe(subscriber, uri)

    # -- notices from the upstreams --------------------------------------------------------------

    def upstream_notification(self, server: str, method: str, payload: bytes) -> None:
        """An upstream notification not tied to one call: to the clients that want it."""
        try:
            params = _decode.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return
        if method == "notifications/message":
            tagged = tag_log(server, params)
            level = tagged.get("level")
            rank = LOG_LEVELS.index(level) if level in LOG_LEVELS else 0
            message = rpc.notification_message(method, msgspec.json.encode(tagged))
            for session, channel in list(self._streams.items()):
                wanted = session.log_level
                if wanted is not None and rank >= (LOG_LEVELS.index(wanted) if wanted in LOG_LEVELS else 0):
                    self._put(channel, message)
        elif method == "notifications/resources/updated" and isinstance(uri := params.get("uri"), str):
            subscribers = self._subscribers.get(uri, ())
            message = rpc.notification_message(method, msgspec.json.encode(params))
            for session, channel in list(self._streams.items()):
                if session in subscribers:
                    self._put(channel, message)
            for listener in list(self._listeners):
                if uri in listener.uris:
                    stamped = {**params, "_meta": {SUBSCRIPTION_ID_KEY: listener.subscription_id}}
                    self._put(listener.channel, rpc.notification_message(method, msgspec.json.encode(stamped)))

    # -- list_changed ----------------------------------------------------------------------------

    def changed(self) -> None:
        """What clients see changed: tell them soon (bursts are coalesced)."""
        self._changed.set()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Tell every listening client that the lists changed, coalescing bursts, until cancelled."""
        task_status.started()
        while True:
            await self._changed.wait()
            self._changed = trio.Event()
            if not self.announce():
                continue
            metrics = self.upstreams.metrics
            for method in LIST_CHANGED:
                message = rpc.notification_message(method, None)
                for channel in list(self._streams.values()):
                    self._put(channel, message)
                    if metrics is not None:
                        metrics.list_changed.inc()
                for listener in list(self._listeners):
                    if method in listener.lists:
                        params = msgspec.json.encode({"_meta": {SUBSCRIPTION_ID_KEY: listener.subscription_id}})
                        self._put(listener.channel, rpc.notification_message(method, params))
            await trio.lowlevel.checkpoint()
