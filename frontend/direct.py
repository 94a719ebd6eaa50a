"""`/mcp/direct`: every upstream tool, resource and prompt, named `server:tool` (seed 003)."""

from __future__ import annotations

import warnings
from typing import Any

import mcp_types as types
from mcp.server import CacheHint, Server, ServerRequestContext
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

from mcpvisor.frontend.builtins import MANAGEMENT_TOOLS, builtins_for
from mcpvisor.frontend.catalog import exposed_name
from mcpvisor.frontend.gateway import AnnouncingServer, Gateway, complete, forwardable
from mcpvisor.frontend.pages import paged
from mcpvisor.frontend.unsieved import keep
from mcpvisor.wire.errors import INVALID_PARAMS

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


def build_direct_server(gateway: Gateway) -> Server[Any]:
    """The MCP server behind `/mcp/direct`."""
    catalog = gateway.catalog
    page_size = gateway.spec.settings.page_size
    builtins = builtins_for(gateway)  # the management tools, shared with /mcp (seed 003, FR-003)

    def visible():
        return catalog.ready_servers(gateway.visible_servers())

    async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> dict[str, Any]:
        gateway.remember(ctx)
        tools = builtins.definitions(MANAGEMENT_TOOLS)
        for view in visible():
            for tool in view.tools:
                tools.append({**tool, "name": exposed_name(view.id, tool["name"], catalog.name_style)})
        return complete(paged("tools/list", "tools", tools, params, page_size))

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> dict[str, Any]:
        gateway.remember(ctx)
        if params.name in MANAGEMENT_TOOLS:
            return await builtins.call(params.name, params.arguments, ctx)
        server, tool = gateway.resolve_tool(params.name)
        forwarded = forwardable(params, ctx)
        forwarded["name"] = tool
        return keep(await gateway.forward(server, "tools/call", forwarded, ctx, what=f"Tool '{params.name}'"))

    async def list_resources(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> dict[str, Any]:
        gateway.remember(ctx)
        resources = [r for view in visible() for r in view.resources]
        return complete(paged("resources/list", "resources", resources, params, page_size))

    async def list_templates(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> dict[str, Any]:
        gateway.remember(ctx)
        templates = [t for view in visible() for t in view.templates]
        return complete(paged("resources/templates/list", "resourceTemplates", templates, params, page_size))

    async def read_resource(ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams) -> dict[str, Any]:
        gateway.remember(ctx)
        uri = str(params.uri)
        server = catalog.resolve_resource(uri)
        allowed = gateway.visible_servers()
        if server is None or (allowed is not None and server not in allowed):
            raise MCPError(code=INVALID_PARAMS, message=f"Unknown resource '{uri}': no connected server offers it")
        return keep(await gateway.forward(server, "resources/read", forwardable(params, ctx), ctx))

    async def list_prompts(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> dict[str, Any]:
        gateway.remember(ctx)
        prompts = [{**p, "name": f"{view.id}:{p['name']}"} for view in visible() for p in view.prompts]
        return complete(paged("prompts/list", "prompts", prompts, params, page_size))

    async def get_prompt(ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams) -> dict[str, Any]:
        gateway.remember(ctx)
        target = catalog.resolve_prompt(params.name)
        allowed = gateway.visible_servers()
        if target is None or (allowed is not None and target[0] not in allowed):
            raise MCPError(
                code=INVALID_PARAMS,
                message=f"Unknown prompt '{params.name}': prompts are named 'server:prompt'",
            )
        forwarded = forwardable(params, ctx)
        forwarded["name"] = target[1]
        return keep(await gateway.forward(target[0], "prompts/get", forwarded, ctx))

    async def set_level(ctx: ServerRequestContext[Any], params: types.SetLevelRequestParams) -> dict[str, Any]:
        gateway.remember(ctx)
        gateway.set_log_level(ctx, params.level)
        return {}

    async def subscribe(ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams) -> dict[str, Any]:
        gateway.remember(ctx)
        await gateway.subscribe(ctx, str(params.uri))
        return {}

    async def unsubscribe(ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams) -> dict[str, Any]:
        await gateway.unsubscribe(ctx, str(params.uri))
        return {}

    async def completion(ctx: ServerRequestContext[Any], params: types.CompleteRequestParams) -> dict[str, Any]:
        forwarded = forwardable(params, ctx)
        ref = forwarded.get("ref", {})
        if ref.get("type") == "ref/prompt":
            target = catalog.resolve_prompt(str(ref.get("name")))
            if target is None:
                raise MCPError(code=INVALID_PARAMS, message=f"Unknown prompt '{ref.get('name')}' in completion ref")
            server, ref["name"] = target
        else:
            uri = str(ref.get("uri"))
            resolved = catalog.resolve_resource(uri)
            if resolved is None:
                raise MCPError(code=INVALID_PARAMS, message=f"Unknown resource template '{uri}' in completion ref")
            server = resolved
        return keep(await gateway.forward(server, "completion/complete", forwarded, ctx))

    def tool_input_schema(name: str) -> dict[str, Any] | None:
        # Lets the 2026-07-28 HTTP path check Mcp-Param headers without listing every tool per call.
        if name in MANAGEMENT_TOOLS:
            return builtins.input_schema(name)
        tool = catalog.tool_definition(name)
        return tool.get("inputSchema") if tool is not None else None

    # logging/setLevel is deprecated in 2026-07-28 but is how handshake-era clients ask for logs.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        return AnnouncingServer(
            "mcpvisor-direct",
            on_set_logging_level=set_level,
            on_subscribe_resource=subscribe,
            on_unsubscribe_resource=unsubscribe,
            on_completion=completion,
            get_tool_input_schema=tool_input_schema,
            on_subscriptions_listen=gateway.listen_handler(),
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
