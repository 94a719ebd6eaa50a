"""The HTTP side of the frontend: MCP endpoints, health, served by hypercorn on trio."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

from mcp.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

from mcpvisor.frontend.door.metrics import Metrics, endpoint_label
from mcpvisor.frontend.door.upstreams import Upstreams
from mcpvisor.frontend.endpoints.boundary import Boundary, replay
from mcpvisor.frontend.endpoints.direct import shortcuts_of
from mcpvisor.frontend.endpoints.fastpath import FastPath
from mcpvisor.frontend.endpoints.server_endpoint import PREFIX as SERVERS_PREFIX
from mcpvisor.frontend.endpoints.server_endpoint import ServerEndpoints
from mcpvisor.frontend.endpoints.session_path import SessionPath
from mcpvisor.wire.trust import is_loopback

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _security(host: str) -> TransportSecuritySettings | None:
    # On loopback, refuse other Host/Origin headers: a web page must not reach the gateway by
    # DNS rebinding. On other addresses the operator fronts it with their own proxy and names.
    if host in _LOOPBACK:
        return TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
        )
    return None


async def _send_json(send: Send, status: int, body: object) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": data})


def _counted(send: Send, metrics: Metrics, endpoint: str) -> Send:
    """`send`, counting the response's status under `endpoint`."""

    async def counting(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            metrics.requests.labels(endpoint, str(message["status"])).inc()
        await send(message)

    return counting


def _modern(scope: Scope) -> bool:
    """The request names no session: a 2026-07-28 one, for the stateless fast path."""
    return not any(name == b"mcp-session-id" for name, _ in scope["headers"])


class FrontendApp:
    """Dispatches requests by path to the MCP endpoints and the health endpoint."""

    def __init__(
        self,
        upstreams: Upstreams,
        endpoints: dict[str, Server[Any]],
        host: str,
        max_body: int,
        *,
        local_users_only: bool = True,
        metrics: Metrics | None = None,
    ) -> None:
        self.upstreams = upstreams
        self.metrics = metrics
        security = _security(host)
        # Without tokens, a loopback listener serves only the user running mcpvisor (wire/trust.py).
        self.boundary = Boundary(local_users_only=local_users_only and is_loopback(host), max_body=max_body)
        self.fast = FastPath(
            upstreams,
            max_body=max_body,
            allowed_hosts=security.allowed_hosts if security is not None else None,
            allowed_origins=security.allowed_origins if security is not None else None,
            server_info={"name": "mcpvisor-direct", "version": "0.1.0"},
        )
        # /mcp/servers/NAME: one upstream under its own names, built on its first request.
        self.servers = ServerEndpoints(upstreams, security, max_body)
        self._managers: dict[str, StreamableHTTPSessionManager] = {}
        self._apps: dict[str, ASGIApp] = {}
        for path, server in endpoints.items():
            manager = StreamableHTTPSessionManager(
                app=server,
                security_settings=_security(host),
                max_request_body_size=max_body,
            )
            self._managers[path] = manager
            self._apps[path] = StreamableHTTPASGIApp(manager)
        # Short paths of /mcp/direct: answered without the SDK's server when nothing can stream.
        self.sessions: SessionPath | None = None
        direct = endpoints.get("/mcp/direct")
        if direct is not None and (shortcuts := shortcuts_of(direct)) is not None:
            self.fast.listings = shortcuts.listings
            self.sessions = SessionPath(
                upstreams,
                self._managers["/mcp/direct"],
                shortcuts.sessions,
                shortcuts.listings,
                sdk_tools=shortcuts.sdk_tools,
                max_body=max_body,
                allowed_hosts=self.fast.allowed_hosts,
                allowed_origins=self.fast.allowed_origins,
            )

    async def run(self, stack: AsyncExitStack) -> None:
        """Start every endpoint's session manager on `stack`."""
        for manager in self._managers.values():
            await stack.enter_async_context(manager.run())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if self.metrics is not None:
            send = _counted(send, self.metrics, endpoint_label(scope["path"]))
        if (admitted := await self.boundary(scope, receive, send)) is None:
            return
        receive = admitted
        path = scope["path"].rstrip("/") or "/"
        if (app := self._apps.get(path)) is not None:
            if path == "/mcp/direct":
                short = self.fast if self.sessions is None or _modern(scope) else self.sessions
                answered, body = await short(scope, receive, send)
                if answered:
                    return
                if body:
                    receive = replay(body, receive)
            await app(scope, receive, send)
        elif path.startswith(SERVERS_PREFIX) and (app := await self.servers.app_for(path[len(SERVERS_PREFIX) :])):
            await app(scope, receive, send)
        elif path == "/healthz":
            await _send_json(send, 200, self._health())
        elif path == "/metrics" and self.metrics is not None:
            body, content_type = await self.metrics.render()
            headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
        else:
            await _send_json(send, 404, {"error": f"no endpoint at {path}", "endpoints": sorted(self._apps)})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _health(self) -> dict[str, Any]:
        servers = {
            view.id: {"state": str(view.state), "alive": view.alive, "tools": len(view.tools)}
            for view in self.upstreams.catalog.servers.values()
        }
        ready = sum(1 for s in servers.values() if s["alive"] and s["state"] == "ready")
        return {"status": "ok", "servers_ready": ready, "servers": servers, "search": self.upstreams.index.status}
