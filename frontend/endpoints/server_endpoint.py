"""`/mcp/servers/NAME`: one supervised upstream under its own names, capabilities and instructions.

What a stdio-to-HTTP proxy gives, with mcpvisor around it: the worker's supervision and restarts,
the gate (quarantine and pinned definitions), the activity log, both protocol eras toward the
client, and `list_changed` notices when that server's lists change. Every call goes through the
door (`Upstreams`), never straight to the router.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types as types
import trio
from mcp.server import CacheHint, NotificationOptions, ServerRequestContext
from mcp.server.models import InitializationOptions
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp_types import INVALID_PARAMS
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcpvisor.frontend.door.calls import ClientCall
from mcpvisor.frontend.door.catalog import ServerView
from mcpvisor.frontend.door.forwarding import complete, decoded, forwardable
from mcpvisor.frontend.door.tasks import TASK_METHODS, TASKS, UnknownTask
from mcpvisor.frontend.door.upstreams import UNAVAILABLE, Refused, ToolTarget, UpstreamError, Upstreams
from mcpvisor.frontend.endpoints import eras, rpc
from mcpvisor.frontend.endpoints.clients import Clients
from mcpvisor.frontend.endpoints.door_handlers import forwarding, listening, session_handlers, task_requests
from mcpvisor.frontend.endpoints.engine import Engine, Security
from mcpvisor.frontend.endpoints.handlers import Context, Handler, Identity, Result, Table, discover
from mcpvisor.frontend.endpoints.mcp_server import AnnouncingServer, SdkRequester
from mcpvisor.frontend.endpoints.notices import Notices
from mcpvisor.frontend.endpoints.pages import paged
from mcpvisor.frontend.endpoints.request_state import StateSeal
from mcpvisor.frontend.endpoints.rpc import RpcError
from mcpvisor.frontend.endpoints.serving import McpEndpoint
from mcpvisor.frontend.endpoints.tasks import TaskParams, call_refused, check_task_request
from mcpvisor.frontend.endpoints.tool_calls import ToolCalls, forwarded
from mcpvisor.frontend.tools.builtins import Builtins
from mcpvisor.frontend.unsieved import keep

log = logging.getLogger(__name__)

PREFIX = "/mcp/servers/"
VIA = "server-endpoint"  # the activity log's name for calls that came this way

ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]

# The upstream's own hints win (the SDK fills only what a result leaves out); without them, its
# lists can change at any restart and each tenant will see its own.
_NO_CACHE = CacheHint(ttl_ms=0, scope="private")
CACHE_HINTS = {
    method: _NO_CACHE
    for method in ("tools/list", "resources/list", "resources/templates/list", "prompts/list", "resources/read")
}
# mcpvisor tells clients when these lists change (the upstream's notices, and its restarts and pins).
_LISTS = ("tools", "resources", "prompts")


class UpstreamServer(AnnouncingServer):
    """An SDK server that introduces itself as the upstream does: serverInfo, capabilities, instructions."""

    def __init__(self, name: str, upstreams: Upstreams, *args: Any, **kwargs: Any) -> None:
        self._upstreams = upstreams
        self._server = name
        self._fallback_instructions: str | None = None
        super().__init__(name, *args, **kwargs)

    def _initialize(self) -> dict[str, Any]:
        view = self._upstreams.catalog.servers.get(self._server)
        return view.initialize if view is not None else {}

    @property  # type: ignore[override]
    def instructions(self) -> str | None:
        found = self._initialize().get("instructions")
        return found if isinstance(found, str) else self._fallback_instructions

    @instructions.setter
    def instructions(self, value: str | None) -> None:
        self._fallback_instructions = value

    @property
    def server_info(self) -> types.Implementation:
        info = self._initialize().get("serverInfo")
        if isinstance(info, dict):
            try:
                return types.Implementation.model_validate(info, by_name=False)
            except ValueError:
                log.warning("server %s has an unusable serverInfo; mcpvisor names it", self._server)
        return types.Implementation(name=self._server, version="")

    @property
    def _server_info_stamp_source(self) -> dict[str, Any]:  # type: ignore[override]
        # The SDK caches its own identity; this one changes when the upstream (re)connects.
        return self.server_info.model_dump(by_alias=True, mode="json", exclude_none=True)

    def get_capabilities(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
        *,
        protocol_version: str | None = None,
    ) -> types.ServerCapabilities:
        upstream = self._initialize().get("capabilities")
        if not isinstance(upstream, dict):
            return super().get_capabilities(
                notification_options, experimental_capabilities, extensions, protocol_version=protocol_version
            )
        capabilities = dict(upstream)
        for key in _LISTS:
            if isinstance(capabilities.get(key), dict):
                capabilities[key] = {**capabilities[key], "listChanged": True}
        # The Tasks extension's handles are routed back (tasks/get, tasks/update, tasks/cancel), for
        # 2026-07-28 clients; its 2025-11-25 predecessor (`capabilities.tasks`) is not carried.
        capabilities.pop("tasks", None)
        if protocol_version not in MODERN_PROTOCOL_VERSIONS and isinstance(
            extensions_of := capabilities.get("extensions"), dict
        ):
            capabilities["extensions"] = {key: value for key, value in extensions_of.items() if key != TASKS}
        if protocol_version in MODERN_PROTOCOL_VERSIONS:
            # Logging is per request in 2026-07-28; the capability belongs to the handshake era.
            capabilities.pop("logging", None)
        try:
            return types.ServerCapabilities.model_validate(capabilities, by_name=False)
        except ValueError:
            log.warning("server %s declares unusable capabilities; mcpvisor derives its own", self._server)
            return super().get_capabilities(
                notification_options, experimental_capabilities, extensions, protocol_version=protocol_version
            )

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        info = self.server_info
        return InitializationOptions(
            server_name=info.name,
            server_version=info.version,
            title=info.title,
            description=info.description,
            capabilities=self.get_capabilities(
                notification_options
                or NotificationOptions(prompts_changed=True, resources_changed=True, tools_changed=True),
                experimental_capabilities,
                extensions,
            ),
            instructions=self.instructions,
            website_url=info.website_url,
            icons=info.icons,
        )


def build_server_endpoint(
    upstreams: Upstreams, name: str, clients: Clients, serves: Callable[[str], bool]
) -> UpstreamServer:
    """The MCP server behind `/mcp/servers/NAME`: the upstream's own names, through the door."""
    page_size = upstreams.settings.page_size

    def view() -> ServerView | None:
        """The server's view when a client may reach it now; NotFound when it may not at all."""
        if not serves(name):
            raise MCPError(code=UNAVAILABLE, message=f"server '{name}' is not available on this endpoint now")
        found = upstreams.catalog.servers.get(name)
        # Listed: ready, or waiting for this tenant's login (its one tool is then `login`).
        return found if found is not None and found.listed else None

    def tools() -> list[dict[str, Any]]:
        if view() is None:
            return []
        return [tool for server, tool in upstreams.tools() if server.id == name]

    async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> dict[str, Any]:
        clients.remember(ctx)
        return complete(paged("tools/list", "tools", tools(), params, page_size))

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> dict[str, Any]:
        clients.remember(ctx)
        view()
        target = upstreams.find_tool(f"{name}:{params.name}")
        try:
            result = await upstreams.call_tool(
                target, forwardable(params, ctx), ClientCall(SdkRequester(ctx), name), via=VIA, tasks=True
            )
        except Refused as refused:
            return refused.answer
        except UpstreamError as exc:
            raise call_refused(exc, target.definition) from None
        return keep(decoded(result))

    async def list_resources(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> dict[str, Any]:
        clients.remember(ctx)
        found = view()
        return complete(paged("resources/list", "resources", found.resources if found else [], params, page_size))

    async def list_templates(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> dict[str, Any]:
        clients.remember(ctx)
        found = view()
        templates = found.templates if found else []
        return complete(paged("resources/templates/list", "resourceTemplates", templates, params, page_size))

    async def task_request(ctx: ServerRequestContext[Any], params: TaskParams) -> dict[str, Any]:
        """tasks/get, tasks/update, tasks/cancel: the handle is the upstream's own id, for this server."""
        check_task_request(ctx, params.taskId)
        view()
        try:
            result = await upstreams.task_request(
                name, ctx.method, forwardable(params, ctx), ClientCall(SdkRequester(ctx), name), handle=params.taskId
            )
        except UnknownTask as exc:
            raise MCPError(code=INVALID_PARAMS, message=exc.message) from None
        return decoded(result)

    async def forward(ctx: ServerRequestContext[Any], method: str, params: dict[str, Any]) -> dict[str, Any]:
        view()
        return keep(decoded(await upstreams.request(name, method, params, ClientCall(SdkRequester(ctx), name))))

    async def read_resource(ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams) -> dict[str, Any]:
        clients.remember(ctx)
        return await forward(ctx, "resources/read", forwardable(params, ctx))

    async def list_prompts(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> dict[str, Any]:
        clients.remember(ctx)
        prompts = [prompt for server, prompt in upstreams.prompts() if server.id == name] if view() else []
        return complete(paged("prompts/list", "prompts", prompts, params, page_size))

    async def get_prompt(ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams) -> dict[str, Any]:
        clients.remember(ctx)
        view()
        upstreams.find_prompt(f"{name}:{params.name}")  # refuses a withheld (changed) prompt
        return await forward(ctx, "prompts/get", forwardable(params, ctx))

    async def completion(ctx: ServerRequestContext[Any], params: types.CompleteRequestParams) -> dict[str, Any]:
        return await forward(ctx, "completion/complete", forwardable(params, ctx))

    async def set_level(ctx: ServerRequestContext[Any], params: types.SetLevelRequestParams) -> dict[str, Any]:
        clients.remember(ctx)
        clients.set_log_level(ctx, params.level)
        return {}

    async def subscribe(ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams) -> dict[str, Any]:
        clients.remember(ctx)
        view()
        await clients.subscribe(ctx, str(params.uri))
        return {}

    async def unsubscribe(ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams) -> dict[str, Any]:
        await clients.unsubscribe(ctx, str(params.uri))
        return {}

    def tool_input_schema(tool: str) -> dict[str, Any] | None:
        found = upstreams.catalog.servers.get(name)
        for definition in found.tools if found is not None else ():
            if definition.get("name") == tool:
                schema = definition.get("inputSchema")
                return schema if isinstance(schema, dict) else None
        return None

    # logging/setLevel is deprecated in 2026-07-28 but is how handshake-era clients ask for logs.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        server = UpstreamServer(
            name,
            upstreams,
            on_set_logging_level=set_level,
            on_subscribe_resource=subscribe,
            on_unsubscribe_resource=unsubscribe,
            on_completion=completion,
            get_tool_input_schema=tool_input_schema,
            on_subscriptions_listen=clients.listen_handler(),
            cache_hints=CACHE_HINTS,
            on_list_tools=list_tools,
            on_call_tool=call_tool,
            on_list_resources=list_resources,
            on_list_resource_templates=list_templates,
            on_read_resource=read_resource,
            on_list_prompts=list_prompts,
            on_get_prompt=get_prompt,
        )
    for method in TASK_METHODS:
        server.add_request_handler(method, TaskParams, task_request)
    return server


class _Endpoint:
    """One server's endpoint: its SDK server, the session manager serving it, and its clients."""

    def __init__(self, app: ASGIApp, manager: StreamableHTTPSessionManager, clients: Clients) -> None:
        self.app = app
        self.manager = manager
        self.clients = clients
        self.started = trio.Event()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with self.manager.run(), trio.open_nursery() as nursery:
            nursery.start_soon(self.clients.serve_notifications)
            self.started.set()
            task_status.started()
            await trio.sleep_forever()


class ServerEndpoints:
    """Every `/mcp/servers/NAME` endpoint, built on a server's first request and kept until shutdown."""

    def __init__(
        self,
        upstreams: Upstreams,
        security: TransportSecuritySettings | None,
        max_body: int,
        *,
        builtins: Builtins,
        engine_security: Security,
        seal: StateSeal | None = None,
        tenant: str = "",
    ) -> None:
        self.upstreams = upstreams
        self.builtins = builtins
        self.engine_security = engine_security
        self.seal = seal
        self.tenant = tenant
        self._security = security
        self._max_body = max_body
        self._endpoints: dict[str, _Endpoint] = {}
        self._engines: dict[str, McpEndpoint] = {}
        self._nursery: trio.Nursery | None = None

    def serves(self, name: str) -> bool:
        """`name` has an endpoint now: configured, enabled, not quarantined, and its endpoint turned on.

        Every refusal looks the same from outside (one 404), so it tells no one which servers exist.
        """
        config = self.upstreams.servers.get(name)
        if config is None or not config.enabled or config.quarantined:
            return False
        return config.endpoint if config.endpoint is not None else self.upstreams.settings.enable_server_endpoints

    async def app_for(self, rest: str) -> ASGIApp | None:
        """The ASGI app for the path after `/mcp/servers/`; None for a 404."""
        # `TENANT/NAME` is kept for tenants (a tenant's own worker of NAME); none exist yet.
        if "/" in rest or not self.serves(rest) or self._nursery is None:
            return None
        endpoint = self._endpoints.get(rest)
        if endpoint is None:
            clients = Clients(self.upstreams)
            server = build_server_endpoint(self.upstreams, rest, clients, self.serves)
            manager = StreamableHTTPSessionManager(
                app=server, security_settings=self._security, max_request_body_size=self._max_body
            )
            endpoint = self._endpoints[rest] = _Endpoint(StreamableHTTPASGIApp(manager), manager, clients)
            await self._nursery.start(endpoint.serve)
        else:
            await endpoint.started.wait()
        return endpoint.app

    async def engine_for(self, rest: str) -> McpEndpoint | None:
        """The engine's endpoint for the path after `/mcp/servers/`; None for a 404."""
        if "/" in rest or not self.serves(rest) or self._nursery is None:
            return None
        engine = self._engines.get(rest)
        if engine is None:
            notices = Notices(self.upstreams)
            table = server_table(self.upstreams, rest, notices, self.builtins, self.serves, self.seal)
            sessions = Engine(table.methods, security=self.engine_security, input_schema=table.input_schema)
            engine = self._engines[rest] = McpEndpoint(table, sessions, notices, tenant=self.tenant)
            await self._nursery.start(engine.serve)
        return engine

    def changed(self, server: str | None = None) -> None:
        """What clients of `server` (None: of every server) see changed: tell them."""
        for name, endpoint in self._endpoints.items():
            if server is None or name == server:
                endpoint.clients.changed()
        for name, engine in self._engines.items():
            if server is None or name == server:
                engine.notices.changed()

    async def on_upstream_notification(self, server: str, method: str, payload: bytes) -> None:
        """An upstream notification not tied to one call: to the clients of that server's endpoint."""
        endpoint = self._endpoints.get(server)
        if endpoint is not None:
            await endpoint.clients.on_upstream_notification(server, method, payload)
        engine = self._engines.get(server)
        if engine is not None:
            engine.notices.upstream_notification(server, method, payload)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the endpoints' session managers until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()


# -- the engine's table ---------------------------------------------------------------------------


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
        "resources/list": listed("resources/list", "resources", lambda found: found.resources),
        "resources/templates/list": listed(
            "resources/templates/list", "resourceTemplates", lambda found: found.templates
        ),
        "resources/read": forwarding(upstreams, "resources/read", here),
        "prompts/list": listed("prompts/list", "prompts", prompts),
        "prompts/get": forwarding(upstreams, "prompts/get", prompt_here),
        "completion/complete": forwarding(upstreams, "completion/complete", here),
        "subscriptions/listen": listening(notices),
        **session_handlers(notices, find),
        **task_requests(upstreams, route),
    }
    return Table(f"{PREFIX}{name}", handlers, Identity(server_info, capabilities, instructions), input_schema, seal)
