"""`/mcp/direct`: every upstream tool, resource and prompt, named `server:tool` (seed 003)."""

from __future__ import annotations

import warnings
from typing import Any

import mcp_types as types
from mcp.server import CacheHint, Server, ServerRequestContext
from mcp.shared.exceptions import MCPDeprecationWarning

from mcpvisor.frontend.door.calls import ClientCall
from mcpvisor.frontend.door.forwarding import complete, decoded, forwardable
from mcpvisor.frontend.door.upstreams import Refused, Upstreams
from mcpvisor.frontend.endpoints.clients import Clients
from mcpvisor.frontend.endpoints.listings import Listing
from mcpvisor.frontend.endpoints.mcp_server import AnnouncingServer
from mcpvisor.frontend.endpoints.pages import paged
from mcpvisor.frontend.endpoints.session_path import Sessions, Shortcuts
from mcpvisor.frontend.tools.builtins import MANAGEMENT_TOOLS, Builtins
from mcpvisor.frontend.unsieved import keep

# Lists change whenever an upstream does: clients must not cache them, and each tenant sees its own.
_NO_CACHE = CacheHint(ttl_ms=0, scope="private")
CACHE_HINTS = {
    method: _NO_CACHE
    for method in (
        "tools/list",
        "resources/list",
        "resources/templates/list",
        "prompts/list",
        "resources/read",
    )
}


def build_direct_server(upstreams: Upstreams, clients: Clients, builtins: Builtins) -> Server[Any]:
    """The MCP server behind `/mcp/direct`."""
    page_size = upstreams.settings.page_size
    listings = direct_listings(upstreams, builtins)

    async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> dict[str, Any]:
        clients.remember(ctx)
        return complete(paged("tools/list", "tools", listings["tools/list"].items(), params, page_size))

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> dict[str, Any]:
        clients.remember(ctx)
        if params.name in MANAGEMENT_TOOLS:
            return await builtins.call(params.name, params.arguments, ctx)
        target = upstreams.find_tool(params.name)
        forwarded = forwardable(params, ctx)
        forwarded["name"] = target.tool
        try:
            result = await upstreams.call_tool(target, forwarded, ClientCall(ctx, target.server), via="direct")
        except Refused as refused:
            return refused.answer
        return keep(decoded(result))

    async def list_resources(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> dict[str, Any]:
        clients.remember(ctx)
        resources = listings["resources/list"].items()
        return complete(paged("resources/list", "resources", resources, params, page_size))

    async def list_templates(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> dict[str, Any]:
        clients.remember(ctx)
        templates = upstreams.templates()
        return complete(paged("resources/templates/list", "resourceTemplates", templates, params, page_size))

    async def read_resource(ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams) -> dict[str, Any]:
        clients.remember(ctx)
        server = upstreams.find_resource(str(params.uri))
        call = ClientCall(ctx, server)
        return keep(decoded(await upstreams.request(server, "resources/read", forwardable(params, ctx), call)))

    async def list_prompts(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> dict[str, Any]:
        clients.remember(ctx)
        return complete(paged("prompts/list", "prompts", listings["prompts/list"].items(), params, page_size))

    async def get_prompt(ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams) -> dict[str, Any]:
        clients.remember(ctx)
        server, prompt = upstreams.find_prompt(params.name)
        forwarded = forwardable(params, ctx)
        forwarded["name"] = prompt
        return keep(decoded(await upstreams.request(server, "prompts/get", forwarded, ClientCall(ctx, server))))

    async def set_level(ctx: ServerRequestContext[Any], params: types.SetLevelRequestParams) -> dict[str, Any]:
        clients.remember(ctx)
        clients.set_log_level(ctx, params.level)
        return {}

    async def subscribe(ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams) -> dict[str, Any]:
        clients.remember(ctx)
        await clients.subscribe(ctx, str(params.uri))
        return {}

    async def unsubscribe(ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams) -> dict[str, Any]:
        await clients.unsubscribe(ctx, str(params.uri))
        return {}

    async def completion(ctx: ServerRequestContext[Any], params: types.CompleteRequestParams) -> dict[str, Any]:
        forwarded = forwardable(params, ctx)
        ref = forwarded.get("ref", {})
        if ref.get("type") == "ref/prompt":
            server, ref["name"] = upstreams.find_prompt(str(ref.get("name")))
        else:
            server = upstreams.find_resource(str(ref.get("uri")))
        return keep(decoded(await upstreams.request(server, "completion/complete", forwarded, ClientCall(ctx, server))))

    def tool_input_schema(name: str) -> dict[str, Any] | None:
        # Lets the 2026-07-28 HTTP path check Mcp-Param headers without listing every tool per call.
        if name in MANAGEMENT_TOOLS:
            return builtins.input_schema(name)
        tool = upstreams.catalog.tool_definition(name)
        return tool.get("inputSchema") if tool is not None else None

    # logging/setLevel is deprecated in 2026-07-28 but is how handshake-era clients ask for logs.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        server = AnnouncingServer(
            "mcpvisor-direct",
            on_set_logging_level=set_level,
            on_subscribe_resource=subscribe,
            on_unsubscribe_resource=unsubscribe,
            on_completion=completion,
            get_tool_input_schema=tool_input_schema,
            on_subscriptions_listen=clients.listen_handler(),
            version="0.1.0",
            instructions="Every tool of every connected upstream MCP server, named server:tool.",
            cache_hints=CACHE_HINTS,
            on_list_tools=list_tools,
            on_call_tool=call_tool,
            on_list_resources=list_resources,
            on_list_resource_templates=list_templates,
            on_read_resource=read_resource,
            on_list_prompts=list_prompts,
            on_get_prompt=get_prompt,
        )
    sessions = Sessions()
    server.middleware += [sessions, clients.remembering]
    server.shortcuts = Shortcuts(listings, sessions, sdk_tools=frozenset(MANAGEMENT_TOOLS))  # type: ignore[attr-defined]
    return server


def shortcuts_of(server: Server[Any]) -> Shortcuts | None:
    shortcuts = getattr(server, "shortcuts", None)
    return shortcuts if isinstance(shortcuts, Shortcuts) else None


def direct_listings(upstreams: Upstreams, builtins: Builtins) -> dict[str, Listing]:
    """The lists of `/mcp/direct`, each rebuilt only when what a client may see changes."""
    size = upstreams.settings.page_size

    def version() -> tuple[int, ...]:
        return upstreams.view_version

    def tools() -> list[dict[str, Any]]:
        return builtins.definitions(MANAGEMENT_TOOLS) + upstreams.exposed_tools()

    def prompts() -> list[dict[str, Any]]:
        return [{**prompt, "name": f"{view.id}:{prompt['name']}"} for view, prompt in upstreams.prompts()]

    return {
        "tools/list": Listing("tools/list", "tools", tools, version, size),
        "resources/list": Listing("resources/list", "resources", upstreams.resources, version, size),
        "prompts/list": Listing("prompts/list", "prompts", prompts, version, size),
    }
