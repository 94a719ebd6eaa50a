"""What both MCP endpoints share: the catalog, routing to workers, and client notifications."""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Iterable, Mapping
from typing import Any, get_args

import msgspec
import trio
from mcp.server import NotificationOptions, Server
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.server.models import InitializationOptions
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import PromptsListChanged, ResourcesListChanged, ResourceUpdated, ToolsListChanged
from mcp_types import LoggingLevel

from mcpvisor.frontend.calls import ClientCall, tag_log
from mcpvisor.frontend.catalog import Catalog, split_name
from mcpvisor.frontend.control import ControlClient
from mcpvisor.frontend.rounds import ROUND_METHODS, ROUND_TTL, Rounds
from mcpvisor.frontend.router import Router
from mcpvisor.frontend.search import ToolIndex
from mcpvisor.frontend.unsieved import KeepUnsieved
from mcpvisor.wire.config import ServerConfig
from mcpvisor.wire.errors import INVALID_PARAMS, WireError
from mcpvisor.wire.frontend_spec import FrontendSpec

log = logging.getLogger(__name__)

_decode_result = msgspec.json.Decoder(dict[str, Any])


# `_meta` keys that describe the client's own connection to mcpvisor (the 2026-07-28 envelope):
# they must not reach an upstream, whose connection is the worker's.
ENVELOPE_PREFIX = "io.modelcontextprotocol/"


def forwardable(params: Any, ctx: Any = None) -> dict[str, Any]:
    """Request params as wire JSON for an upstream, without the client's connection envelope.

    The params exactly as the client sent them (`ctx.params`, already validated by the SDK) are
    preferred to a dump of the parsed model: cheaper, and nothing the client sent is lost.
    """
    raw = getattr(ctx, "params", None)
    if isinstance(raw, Mapping):
        data: dict[str, Any] = dict(raw)
    else:
        data = params.model_dump(by_alias=True, mode="json", exclude_none=True)
    meta = data.get("_meta")
    if meta:
        meta = {key: value for key, value in meta.items() if not key.startswith(ENVELOPE_PREFIX)}
        if meta:
            data["_meta"] = meta
        else:
            del data["_meta"]
    return data


LIST_CHANGED = (
    "notifications/tools/list_changed",
    "notifications/resources/list_changed",
    "notifications/prompts/list_changed",
)


def complete(result: dict[str, Any]) -> dict[str, Any]:
    """Mark a forwarded result as final; 2026-07-28 clients require `resultType`, older ones drop it."""
    result.setdefault("resultType", "complete")
    return result


class _Listener:
    """Stands for one subscriptions/listen stream among a URI's subscribers."""


_LEVELS = {name: rank for rank, name in enumerate(get_args(LoggingLevel))}


def _connection_of(ctx: Any) -> Connection | None:
    """The client connection behind a request context (or a ServerSession)."""
    # The SDK gives handlers a per-request ServerSession; the connection behind it is what
    # outlives the request (it has no public accessor in this SDK version).
    session = getattr(ctx, "session", ctx)
    connection = getattr(session, "_connection", None)
    return connection if isinstance(connection, Connection) else None


class AnnouncingServer(Server[Any]):
    """An SDK server that tells clients its lists change (they do, whenever an upstream's does)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The SDK's OpenTelemetry middleware opens a span per message even with no exporter
        # installed; on a proxy's hot path that is pure cost. The boundary seals the
        # `requestState` of 2026-07-28 calls carried over rounds (see frontend/rounds.py).
        security = RequestStateSecurity.ephemeral(ttl=ROUND_TTL)
        self.middleware = [RequestStateBoundary(security, default_audience="mcpvisor"), KeepUnsieved()]

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options
            or NotificationOptions(prompts_changed=True, resources_changed=True, tools_changed=True),
            experimental_capabilities,
            extensions,
        )


class Gateway:
    """Routes MCP operations to workers and keeps connected clients informed of catalog changes."""

    def __init__(self, spec: FrontendSpec, catalog: Catalog) -> None:
        self.spec = spec
        self.catalog = catalog
        self.index = ToolIndex()
        self.router: Router | None = None
        self.control: ControlClient | None = None
        self._connections: weakref.WeakSet[Connection] = weakref.WeakSet()
        self._log_levels: weakref.WeakKeyDictionary[Connection, str] = weakref.WeakKeyDictionary()
        self._subscribers: dict[str, weakref.WeakSet[Connection]] = {}
        self.bus = InMemorySubscriptionBus()
        self._changed = trio.Event()
        self.rounds = Rounds(ROUND_TTL)

    # -- routing ---------------------------------------------------------------------------------

    def call_timeout(self, server: str) -> float:
        config = self.spec.servers.get(server)
        if config is not None and config.policy.call_timeout is not None:
            return config.policy.call_timeout
        return self.spec.settings.call_timeout

    async def forward(
        self,
        server: str,
        method: str,
        params: dict[str, Any],
        ctx: ServerRequestContext[Any] | None = None,
        *,
        what: str = "",
    ) -> dict[str, Any]:
        """Run one request on a server's upstream; MCPError with a clear message on failure.

        With the client's request context, the upstream's progress, logs and questions (sampling,
        elicitation, roots) during the request go back to that client.
        """
        router = self.router
        assert router is not None
        call = ClientCall(ctx, server) if ctx is not None else None
        timeout = self.call_timeout(server)
        try:
            if call is not None and call.modern and method in ROUND_METHODS:

                async def request(params: dict[str, Any], call: ClientCall) -> bytes:
                    return await router.request(server, method, params, timeout, call)

                outcome = await self.rounds.forward(request, server, method, params, call)
                if isinstance(outcome, dict):
                    return outcome  # input required: the client answers and calls again
                raw = outcome
            else:
                raw = await router.request(server, method, params, timeout, call)
        except WireError as exc:
            # Name what was called ("Tool 'github:create_issue': ..."), not only the server.
            message = f"{what}: {exc.message}" if what else exc.message
            raise MCPError(code=exc.jsonrpc_code, message=message) from None
        return complete(_decode_result.decode(raw))

    def visible_servers(self) -> Iterable[str] | None:
        """Servers a client may see: enabled and not quarantined (None: all)."""
        hidden = {name for name, server in self.spec.servers.items() if server.quarantined or not server.enabled}
        return [name for name in self.catalog.servers if name not in hidden] if hidden else None

    def resolve_tool(self, name: str) -> tuple[str, str]:
        """Exposed tool name -> (server, tool), or an MCPError that says what is wrong."""
        target = self.catalog.resolve_tool(name)
        visible = self.visible_servers()
        if target is not None and (visible is None or target[0] in visible):
            return target
        parts = split_name(name) if ":" in name else None
        if parts is None and "__" in name:
            server, _, tool = name.partition("__")
            parts = (server, tool) if server and tool else None
        if parts is None:
            raise MCPError(
                code=INVALID_PARAMS,
                message=f"Unknown tool '{name}': upstream tools are named 'server:tool'",
            )
        server, tool = parts
        view = self.catalog.servers.get(server)
        if view is None or (visible is not None and server not in visible):
            known = ", ".join(sorted(self.catalog.servers)) or "none"
            raise MCPError(
                code=INVALID_PARAMS, message=f"Unknown tool '{name}': no server '{server}' (servers: {known})"
            )
        if not view.ready:
            raise MCPError(
                code=-32000,
                message=f"Tool '{name}' is unavailable: {self.catalog.describe_unavailable(server)}",
            )
        raise MCPError(code=INVALID_PARAMS, message=f"Unknown tool '{name}': server '{server}' has no tool '{tool}'")

    def apply_config(self, servers: dict[str, ServerConfig]) -> None:
        """The supervisor changed the servers table: forget removed servers, re-filter, notify."""
        for name in set(self.catalog.servers) - set(servers):
            if self.router is not None:
                self.router.fail_worker(name, "the server was removed")
            self.catalog.remove(name)
        self.spec = msgspec.structs.replace(self.spec, servers=servers)
        self.catalog_changed()

    # -- notifications ---------------------------------------------------------------------------

    # -- logging and subscriptions (handshake era: per connection) -------------------------------

    def set_log_level(self, ctx: Any, level: str) -> None:
        """logging/setLevel: this client gets upstream log lines at `level` and above."""
        connection = _connection_of(ctx)
        if connection is not None:
            self._log_levels[connection] = level

    async def subscribe(self, ctx: Any, uri: str) -> None:
        """resources/subscribe (handshake era): the client's connection hears of updates to `uri`."""
        await self._subscribe(_connection_of(ctx) or _Listener(), uri)

    async def unsubscribe(self, ctx: Any, uri: str) -> None:
        self._resource_server(uri)
        connection = _connection_of(ctx)
        if connection is not None:
            await self._unsubscribe(connection, uri)

    async def _subscribe(self, subscriber: object, uri: str) -> None:
        """The upstream is subscribed once per URI, however many subscribers there are."""
        server = self._resource_server(uri)
        subscribers = self._subscribers.setdefault(uri, weakref.WeakSet())
        first = len(subscribers) == 0
        subscribers.add(subscriber)
        if first:
            await self.forward(server, "resources/subscribe", {"uri": uri})

    async def _unsubscribe(self, subscriber: object, uri: str) -> None:
        subscribers = self._subscribers.get(uri)
        if subscribers is None:
            return
        subscribers.discard(subscriber)
        if len(subscribers) == 0:
            del self._subscribers[uri]
            server = self.catalog.resolve_resource(uri)
            if server is not None:
                with contextlib.suppress(MCPError):
                    await self.forward(server, "resources/unsubscribe", {"uri": uri})

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
                    with contextlib.suppress(MCPError):  # a URI no server offers just never updates
                        await self._subscribe(listener, uri)
                        subscribed.append(uri)
                return await inner(ctx, params)
            finally:
                with trio.CancelScope(shield=True):
                    for uri in subscribed:
                        await self._unsubscribe(listener, uri)

        return listen

    def _resource_server(self, uri: str) -> str:
        server = self.catalog.resolve_resource(uri)
        allowed = self.visible_servers()
        if server is None or (allowed is not None and server not in allowed):
            raise MCPError(code=INVALID_PARAMS, message=f"Unknown resource '{uri}': no connected server offers it")
        return server

    async def on_upstream_notification(self, server: str, method: str, payload: bytes) -> None:
        """An upstream notification not tied to one call: fan it out to the clients that want it."""
        try:
            params = _decode_result.decode(payload)
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

    def remember(self, ctx: Any) -> None:
        """Track a client's connection (from a request context) to announce catalog changes to it.

        Handshake-era clients are told on their connection's standalone stream; 2026-07-28 clients
        hear it on their `subscriptions/listen` stream, fed by `self.bus`.
        """
        connection = _connection_of(ctx)
        if connection is not None and connection.has_standalone_channel:
            self._connections.add(connection)

    def catalog_changed(self, server: str | None = None) -> None:
        """What clients see changed (for one server, or for all when None): reindex and notify."""
        servers = [server] if server is not None else list(self.catalog.servers)
        for name in servers:
            view = self.catalog.servers.get(name)
            if view is not None and view.ready:
                self.index.set_server_tools(name, view.tools)
            else:
                self.index.remove_server(name)
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
