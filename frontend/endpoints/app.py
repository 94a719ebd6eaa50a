"""The frontend's HTTP app: who is asking, then what: MCP endpoints, health, metrics, logins."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from mcpvisor.frontend.door.metrics import Metrics, endpoint_label
from mcpvisor.frontend.endpoints.auth import Authenticator, Principal, principal_of
from mcpvisor.frontend.endpoints.boundary import Boundary
from mcpvisor.frontend.endpoints.console import PREFIX as CONSOLE_PREFIX
from mcpvisor.frontend.endpoints.http_server import Receive, Scope, Send
from mcpvisor.frontend.endpoints.limits import TenantLimits
from mcpvisor.frontend.endpoints.oauth_callback import PATH as OAUTH_CALLBACK
from mcpvisor.frontend.endpoints.oauth_callback import serve_oauth_callback, serve_oauth_start
from mcpvisor.frontend.endpoints.oauth_resource import ResourceMetadata
from mcpvisor.frontend.endpoints.server_endpoint import PREFIX as SERVERS_PREFIX
from mcpvisor.frontend.endpoints.server_endpoint import ServerEndpoints
from mcpvisor.frontend.endpoints.serving import McpEndpoint
from mcpvisor.runtime.trust import is_loopback
from mcpvisor.store.oauth_store import START_PATH

if TYPE_CHECKING:
    from mcpvisor.frontend.stacks import Stacks

log = logging.getLogger(__name__)

CONSOLE_PATH = f"{CONSOLE_PREFIX}/"  # the web console, where `GET /` sends a browser

ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


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


class FrontendApp:
    """One stack's MCP endpoints: dispatches an admitted request by path (frontend/stacks.py)."""

    def __init__(self, engines: dict[str, McpEndpoint], servers: ServerEndpoints) -> None:
        self.engines = engines
        # /mcp/servers/NAME: one upstream under its own names, built on its first request.
        self.servers = servers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Serve a request the gateway admitted; False when no endpoint of this stack is at its path."""
        path = scope["path"].rstrip("/") or "/"
        endpoint = self.engines.get(path)
        if endpoint is None and path.startswith(SERVERS_PREFIX):
            endpoint = await self.servers.endpoint_for(path[len(SERVERS_PREFIX) :])
        if endpoint is None:
            return False
        await endpoint(scope, receive, send)
        return True

    def endpoints(self) -> list[str]:
        return sorted(self.engines)


class Gateway:
    """The HTTP listener's app: who is asking (the boundary), then that tenant's stack.

    Health, metrics and the admin surfaces are answered here, before any stack is chosen.
    """

    def __init__(
        self,
        stacks: Stacks,
        host: str,
        max_body: int,
        *,
        local_users_only: bool = True,
        authenticator: Authenticator | None = None,
        metrics: Metrics | None = None,
        operator_surfaces: dict[str, ASGIApp] | None = None,
        resource_metadata: ResourceMetadata | None = None,
        sandboxed: Callable[[], bool] = lambda: False,
    ) -> None:
        self.stacks = stacks
        self.metrics = metrics
        self.resource_metadata = resource_metadata  # RFC 9728's document, with [oauth]
        # Path prefix -> app (/api/v1, /ui): each admits its requests itself, the boundary included.
        self.operator_surfaces = operator_surfaces or {}
        # Without tokens, a loopback listener serves only the user running mcpvisor (runtime/trust.py).
        self.boundary = Boundary(
            local_users_only=local_users_only and is_loopback(host),
            max_body=max_body,
            authenticator=authenticator,
            sandboxed=sandboxed,
        )
        self.limits = TenantLimits(stacks.shared.tenants)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if self.metrics is not None:
            send = _counted(send, self.metrics, endpoint_label(scope["path"]))
        for prefix, surface in self.operator_surfaces.items():
            if scope["path"] == prefix or scope["path"].startswith(prefix + "/"):
                await surface(scope, receive, send)
                return
        if (admitted := await self.boundary(scope, receive, send)) is None:
            return
        receive = admitted
        principal = principal_of(scope)
        path = scope["path"].rstrip("/") or "/"
        if path == "/healthz":
            await _send_json(send, 200, self._health(principal))
            return
        if self.resource_metadata is not None and self.resource_metadata.serves(path):
            await self.resource_metadata(scope, receive, send)
            return
        if path == OAUTH_CALLBACK:
            return await serve_oauth_callback(self.stacks.shared.router, self.stacks.shared.servers, scope, send)
        if path.startswith(START_PATH):
            settings = self.stacks.shared.settings
            secure = (settings.public_url or "").startswith("https://")
            return await serve_oauth_start(self.stacks.shared.logins, scope, send, secure=secure)
        if path == "/metrics" and self.metrics is not None:
            if principal is None or not principal.admin:
                await _send_json(send, 403, {"error": "forbidden", "message": "metrics are for operators"})
                return
            body, content_type = await self.metrics.render()
            headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        if path == "/" and scope["method"] in ("GET", "HEAD"):
            await self._front_door(send)
            return
        if principal is None or not path.startswith("/mcp"):
            await self._not_found(send, path)
            return
        tenant = principal.tenant or ""
        if path.startswith(SERVERS_PREFIX) and path.count("/") == 4:
            # /mcp/servers/TENANT/NAME: a tenant's own worker of NAME, under its own names. Another
            # tenant's path answers as a server that does not exist would.
            owner, _, name = path[len(SERVERS_PREFIX) :].partition("/")
            if owner != tenant and not (principal.admin and owner in self.stacks.shared.tenants):
                await self._not_found(send, path)
                return
            tenant = owner
            scope = {**scope, "path": f"{SERVERS_PREFIX}{name}", "raw_path": f"{SERVERS_PREFIX}{name}".encode()}
        stack = await self.stacks.of(tenant)
        refusal = self.limits.admit(tenant, scope)
        if refusal is not None:
            await refusal.send(send)
            return
        stack.in_flight += 1
        try:
            await stack.in_use()
            if not await stack.app(scope, receive, send):
                await self._not_found(send, path)
        finally:
            stack.done()
            self.limits.done(tenant, scope)

    async def _front_door(self, send: Send) -> None:
        """`GET /`: a browser goes on to the console; a program reads where things are."""
        plain = self.stacks.get("")
        body = {
            "console": CONSOLE_PATH,
            "endpoints": plain.app.endpoints() if plain is not None else [],
            "health": "/healthz",
        }
        data = json.dumps(body).encode()
        headers = [
            (b"location", CONSOLE_PATH.encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(data)).encode()),
        ]
        await send({"type": "http.response.start", "status": 302, "headers": headers})
        await send({"type": "http.response.body", "body": data})

    async def _not_found(self, send: Send, path: str) -> None:
        # Every stack has the same endpoints; every 404 looks the same, whoever asks and why.
        plain = self.stacks.get("")
        endpoints = plain.app.endpoints() if plain is not None else []
        await _send_json(send, 404, {"error": f"no endpoint at {path}", "endpoints": endpoints})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _health(self, principal: Principal | None) -> dict[str, Any]:
        """Liveness for anyone; the servers' states only for an operator (they name every server)."""
        if principal is None or not principal.admin:
            return {"status": "ok"}
        servers = {
            worker: {"state": str(view.state), "alive": view.alive, "tools": len(view.tools)}
            for worker, view in self.stacks.shared.router.catalogs.workers()
        }
        ready = sum(1 for s in servers.values() if s["alive"] and s["state"] == "ready")
        plain = self.stacks.get("")
        search = plain.upstreams.search_status if plain is not None else "not started"
        health = {"status": "ok", "servers_ready": ready, "servers": servers, "search": search}
        if plain is not None and plain.upstreams.ranking is not None:
            # Searches the embedding service did not rank (down, too slow, or still taking in a change).
            health["search_fallbacks"] = plain.upstreams.ranking.fallbacks
        return health
