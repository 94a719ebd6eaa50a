"""The connected clients: their log levels, resource subscriptions, and `list_changed` notices.

Handshake-era clients hear of changes on their connection's standalone stream; 2026-07-28 clients
on their `subscriptions/listen` stream, fed by the subscription bus.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from typing import Any, get_args

import msgspec
import trio
from mcp.server.connection import Connection
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler
from mcp.shared.subscriptions import PromptsListChanged, ResourcesListChanged, ResourceUpdated, ToolsListChanged
from mcp_types import LoggingLevel

from mcpvisor.frontend.door.calls import tag_log
from mcpvisor.frontend.door.upstreams import NotFound, UpstreamError, Upstreams

log = logging.getLogger(__name__)

_decode = msgspec.json.Decoder(dict[str, Any])

LIST_CHANGED = (
    "notifications/tools/list_changed",
    "notifications/resources/list_changed",
    "notifications/prompts/list_changed",
)

_LEVELS = {name: rank for rank, name in enumerate(get_args(LoggingLevel))}


class _Listener:
    """Stands for one subscriptions/listen stream among a URI's subscribers."""


def connection_of(ctx: Any) -> Connection | None:
    """The client connection behind a request context (or a ServerSession)."""
    # The SDK gives handlers a per-request ServerSession; the connection behind it is what
    # outlives the request (it has no public accessor in this SDK version).
    session = getattr(ctx, "session", ctx)
    connection = getattr(session, "_connection", None)
    return connection if isinstance(connection, Connection) else None


class Clients:
    """Who is connected, what each wants to hear, and telling them when their view changes."""

    def __init__(self, upstreams: Upstreams) -> None:
        self.upstreams = upstreams
        self.bus = InMemorySubscriptionBus()
        self._connections: weakref.WeakSet[Connection] = weakref.WeakSet()
        self._log_levels: weakref.WeakKeyDictionary[Connection, str] = weakref.WeakKeyDictionary()
        self._subscribers: dict[str, weakref.WeakSet[Any]] = {}
        self._changed = trio.Event()

    def remember(self, ctx: Any) -> None:
        """Track a client's connection (from a request context) to announce catalog changes to it.

        Its standalone stream may open later: a notice to a connection without one is dropped.
        """
        connection = connection_of(ctx)
        if connection is not None:
            self._connections.add(connection)

    async def remembering(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        """Server middleware: every connection the SDK serves a request of hears of changes.

        Requests answered on a short path never reach the SDK's handlers, so the connection is
        noted here, on whatever request of it the SDK does serve (`initialize` at least).
        """
        self.remember(ctx)
        return await call_next(ctx)

    # -- logging (handshake era: per connection) -------------------------------------------------

    def set_log_level(self, ctx: Any, level: str) -> None:
        """logging/setLevel: this client gets upstream log lines at `level` and above."""
        connection = connection_of(ctx)
        if connection is not None:
            self._log_levels[connection] = level

    # -- resource subscriptions ------------------------------------------------------------------

    async def subscribe(self, ctx: Any, uri: str) -> None:
        """resources/subscribe (handshake era): the client's connection hears of updates to `uri`."""
        await self._subscribe(connection_of(ctx) or _Listener(), uri)

    async def unsubscribe(self, ctx: Any, uri: str) -> None:
        self.upstreams.find_resource(uri)
        connection = connection_of(ctx)
        if connection is not None:
            await self._unsubscribe(connection, uri)

    async def _subscribe(self, subscriber: object, uri: str) -> None:
        """The upstream is subscribed once per URI, however many subscribers there are."""
        server = self.upstreams.find_resource(uri)
        subscribers = self._subscribers.setdefault(uri, weakref.WeakSet())
        first = len(subscribers) == 0
        subscribers.add(subscriber)
        if first:
            await self.upstreams.request(server, "resources/subscribe", {"uri": uri})

    async def _unsubscribe(self, subscriber: object, uri: str) -> None:
        subscribers = self._subscribers.get(uri)
        if subscribers is None:
            return
        subscribers.discard(subscriber)
        if len(subscribers) == 0:
            del self._subscribers[uri]
            with contextlib.suppress(NotFound, UpstreamError):
                server = self.upstreams.find_resource(uri)
                await self.upstreams.request(server, "resources/unsubscribe", {"uri": uri})

    def listen_handler(self) -> Any:
        """`subscriptions/listen` (2026-07-28): the SDK's stream, plus the upstream subscriptions
        its resource URIs need for as long as the stream is open."""
        inner = ListenHandler(self.bus)

        async def listen(ctx: ServerRequestContext[Any], params: Any) -> Any:
            listener = _Listener()
            uris = list(params.notifications.resource_subscriptions or ())
            subscribed = []
            try:
                for uri in uris:
                    # A URI no server offers just never updates.
                    with contextlib.suppress(NotFound, UpstreamError):
                        await self._subscribe(listener, uri)
                        subscribed.append(uri)
                return await inner(ctx, params)
            finally:
                with trio.CancelScope(shield=True):
                    for uri in subscribed:
                        await self._unsubscribe(listener, uri)

        return listen

    # -- upstream notifications ------------------------------------------------------------------

    async def on_upstream_notification(self, server: str, method: str, payload: bytes) -> None:
        """An upstream notification not tied to one call: fan it out to the clients that want it."""
        try:
            params = _decode.decode(payload)
        except msgspec.DecodeError:
            return
        if method == "notifications/message":
            tagged = tag_log(server, params)
            rank = _LEVELS.get(str(tagged.get("level")), 0)
            for connection, level in list(self._log_levels.items()):
                if rank >= _LEVELS.get(level, 0):
                    await connection.notify(method, tagged)
        elif method == "notifications/resources/updated" and isinstance(uri := params.get("uri"), str):
            for subscriber in list(self._subscribers.get(uri, ())):
                if isinstance(subscriber, Connection):  # 2026-07-28 listeners hear it from the bus
                    await subscriber.notify(method, params)
            await self.bus.publish(ResourceUpdated(uri=uri))

    # -- list_changed ----------------------------------------------------------------------------

    def changed(self) -> None:
        """What clients see changed: tell them soon (bursts are coalesced)."""
        self._changed.set()

    async def serve_notifications(self) -> None:
        """Tell every connected client that the lists changed, coalescing bursts."""
        while True:
            await self._changed.wait()
            self._changed = trio.Event()
            for event in (ToolsListChanged(), ResourcesListChanged(), PromptsListChanged()):
                await self.bus.publish(event)
            for connection in list(self._connections):
                for method in LIST_CHANGED:
                    # Best effort by design: a closed stream drops the notice without raising.
                    await connection.notify(method, None)
                    if self.upstreams.metrics is not None:
                        self.upstreams.metrics.list_changed.inc()
