"""`/mcp/servers/NAME`: one supervised upstream under its own names, capabilities and instructions.

What a stdio-to-HTTP proxy gives, with mcpvisor around it: the worker's supervision and restarts,
the gate (quarantine and pinned definitions), the activity log, both protocol eras toward the
client, and `list_changed` notices when that server's lists change. Every call goes through the
door (`Upstreams`), never straight to the router.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import trio

from mcpvisor.frontend.door.catalog import ServerView
from mcpvisor.frontend.door.tasks import TASKS
from mcpvisor.frontend.door.upstreams import UNAVAILABLE, ToolTarget, Upstreams
from mcpvisor.frontend.endpoints import eras, rpc
from mcpvisor.frontend.endpoints.door_handlers import forwarding, listening, session_handlers, task_requests
from mcpvisor.frontend.endpoints.engine import Engine, Security
from mcpvisor.frontend.endpoints.handlers import Context, Handler, Identity, Result, Table, discover
from mcpvisor.frontend.endpoints.notices import Notices
from mcpvisor.frontend.endpoints.pages import paged
from mcpvisor.frontend.endpoints.request_state import StateSeal
from mcpvisor.frontend.endpoints.rpc import RpcError
from mcpvisor.frontend.endpoints.serving import McpEndpoint
from mcpvisor.frontend.endpoints.tool_calls import ToolCalls, forwarded
from mcpvisor.frontend.tools.builtins import Builtins

PREFIX: Final = "/mcp/servers/"
VIA: Final = "server-endpoint"  # the activity log's name for calls that came this way
# mcpvisor tells clients when these lists change (the upstream's notices, and its restarts and pins).
_LISTS: Final = ("tools", "resources", "prompts")


class ServerEndpoints:
    """Every `/mcp/servers/NAME` endpoint of a stack, built on a server's first request and kept."""

    def __init__(
        self,
        upstreams: Upstreams,
        builtins: Builtins,
        *,
        security: Security,
        seal: StateSeal | None = None,
        tenant: str = "",
    ) -> None:
        self.upstreams = upstreams
        self.builtins = builtins
        self.security = security
        self.seal = seal
        self.tenant = tenant
        self._endpoints: dict[str, McpEndpoint] = {}
        self._nursery: trio.Nursery | None = None

    def serves(self, name: str) -> bool:
        """`name` has an endpoint now: configured, enabled, not quarantined, and its endpoint turned on.

        Every refusal looks the same from outside (one 404), so it tells no one which servers exist.
        """
        config = self.upstreams.servers.get(name)
        if config is None or not config.enabled or config.quarantined:
            return False
        return config.endpoint if config.endpoint is not None else self.upstreams.settings.enable_server_endpoints

    async def endpoint_for(self, rest: str) -> McpEndpoint | None:
        """The endpoint for the path after `/mcp/servers/`; None for a 404."""
        # `TENANT/NAME` is the gateway's (a tenant's own worker of NAME), rewritten before here.
        if "/" in rest or not self.serves(rest) or self._nursery is None:
            return None
        endpoint = self._endpoints.get(rest)
        if endpoint is None:
            notices = Notices(self.upstreams)
            table = server_table(self.upstreams, rest, notices, self.builtins, self.serves, self.seal)
            engine = Engine(table.methods, security=self.security, input_schema=table.input_schema)
            endpoint = self._endpoints[rest] = McpEndpoint(table, engine, notices, tenant=self.tenant)
            await self._nursery.start(endpoint.serve)
        return endpoint

    def changed(self, server: str | None = None) -> None:
        """What clients of `server` (None: of every server) see changed: tell them."""
        for name, endpoint in self._endpoints.items():
            if server is None or name == server:
                endpoint.notices.changed()

    def upstream_notification(self, server: str, method: str, payload: bytes) -> None:
        """An upstream notification not tied to one call: to the clients of that server's endpoint."""
        endpoint = self._endpoints.get(server)
        if endpoint is not None:
            endpoint.notices.upstream_notification(server, method, payload)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the endpoints (their sessions' expiry, their notices) until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()


def server_capabilities(initialize: dict[str, Any], version: str) -> dict[str, Any] | None:
    """The upstream's capabilities as its endpoint offers them to a client of `version`; None when
    it gave none mcpvisor can use."""
    upstream = initialize.get("capabilities")
    if not isinstance(upstream, dict):
        return None
    capabilities = dict(upstream)
    for key in _LISTS:
        if isinstance(capabilities.get(key), dict):
            capabilities[key] = {**capabilities[key], "listChanged": True}
    # The Tasks extension's handles are routed back (tasks/get, tasks/update, tasks/cancel), for
    # 2026-07-28 clients; its 2025-11-25 predecessor (`capabilities.tasks`) is not carried.
    capabilities.pop("tasks", None)
    extensions = capabilities.get("extensions")
    if not eras.is_modern(version) and isinstance(extensions, dict):
        capabilities["extensions"] = {key: value for key, value in extensions.items() if key != TASKS}
    if eras.is_modern(version):
        # Logging is per request in 2026-07-28; the capability belongs to the handshake era.
        capabilities.pop("logging", None)
    return capabilities


def server_table(
    upstreams: Upstreams,
    name: str,
    notices: Notices,
    builtins: Builtins,
    serves: Callable[[str], bool],
    seal: StateSeal | None = None,
) -> Table:
    """`/mcp/servers/NAME` for the engine: one upstream under its own names, through the door."""
    page_size = upstreams.settings.page_size

    def view() -> ServerView | None:
        """The server's view when a client may reach it now; an error when it may not at all."""
        if not serves(name):
            raise RpcError(UNAVAILABLE, f"server '{name}' is not available on this endpoint now")
        found = upstreams.catalog.servers.get(name)
        # Listed: ready, or waiting for this tenant's login (its one tool is then `login`).
        return found if found is not None and found.listed else None

    def initialize_result() -> dict[str, Any]:
        found = upstreams.catalog.servers.get(name)
        return found.initialize if found is not None else {}

    def server_info() -> dict[str, Any]:
        info = initialize_result().get("serverInfo")
        if isinstance(info, dict) and isinstance(info.get("name"), str):
            return {**info, "version": info["version"] if isinstance(info.get("version"), str) else ""}
        return {"name": name, "version": ""}

    def capabilities(version: str) -> dict[str, Any]:
        found = server_capabilities(initialize_result(), version)
        if found is not None:
            return found
        return {"tools": {"listChanged": True}, "resources": {"listChanged": True}, "prompts": {"listChanged": True}}

    def instructions() -> str | None:
        found = initialize_result().get("instructions")
        return found if isinstance(found, str) else None

    def listed(method: str, field: str, items: Callable[[ServerView], list[dict[str, Any]]]) -> Handler:
        async def handle(context: Context) -> Result:
            found = view()
            chunk = items(found) if found is not None else []
            if method == "tools/list":
                chunk = eras.tool_definitions(chunk, context.call.version)
            return paged(method, field, chunk, rpc.member(context.params, "cursor") or None, page_size)

        return handle

    def tools(found: ServerView) -> list[dict[str, Any]]:
        return [tool for server, tool in upstreams.tools() if server.id == name]

    def prompts(found: ServerView) -> list[dict[str, Any]]:
        return [prompt for server, prompt in upstreams.prompts() if server.id == name]

    def resources(found: ServerView) -> list[dict[str, Any]]:
        return [resource for resource in found.resources if upstreams.listed("resource", name, resource)]

    def templates(found: ServerView) -> list[dict[str, Any]]:
        return [template for template in found.templates if upstreams.listed("resource", name, template)]

    def resolve(tool: str) -> ToolTarget:
        view()
        return upstreams.find_tool(f"{name}:{tool}")

    def here(context: Context) -> tuple[str, dict[str, Any]]:
        view()
        return name, forwarded(context)

    def prompt_here(context: Context) -> tuple[str, dict[str, Any]]:
        view()
        upstreams.find_prompt(f"{name}:{rpc.member(context.params, 'name')}")  # refuses a withheld (changed) prompt
        return name, forwarded(context)

    def find(uri: str) -> str:
        view()
        return upstreams.find_resource(uri)

    def input_schema(tool: str) -> dict[str, Any] | None:
        found = upstreams.catalog.servers.get(name)
        for definition in found.tools if found is not None else ():
            if definition.get("name") == tool:
                schema = definition.get("inputSchema")
                return schema if isinstance(schema, dict) else None
        return None

    def route(handle: str) -> tuple[str, str]:
        view()
        return name, handle

    handlers: dict[str, Handler] = {
        "server/discover": discover,
        "tools/list": listed("tools/list", "tools", tools),
        "tools/call": ToolCalls(upstreams, builtins, resolve, via=VIA, tasks=True),
        "resources/list": listed("resources/list", "resources", resources),
        "resources/templates/list": listed("resources/templates/list", "resourceTemplates", templates),
        "resources/read": forwarding(upstreams, "resources/read", here),
        "prompts/list": listed("prompts/list", "prompts", prompts),
        "prompts/get": forwarding(upstreams, "prompts/get", prompt_here),
        "completion/complete": forwarding(upstreams, "completion/complete", here),
        "subscriptions/listen": listening(notices),
        **session_handlers(notices, find),
        **task_requests(upstreams, route),
    }
    return Table(f"{PREFIX}{name}", handlers, Identity(server_info, capabilities, instructions), input_schema, seal)
