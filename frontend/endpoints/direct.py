"""`/mcp/direct`: every upstream tool, resource and prompt, named `server:tool` (seed 003)."""

from __future__ import annotations

from typing import Any, Final

from mcpvisor.frontend.door.tasks import TASKS, split_task_id
from mcpvisor.frontend.door.upstreams import ToolTarget, Upstreams
from mcpvisor.frontend.endpoints import eras, rpc
from mcpvisor.frontend.endpoints.door_handlers import forwarding, listening, session_handlers, task_requests
from mcpvisor.frontend.endpoints.handlers import Context, Handler, Identity, Result, Table, discover
from mcpvisor.frontend.endpoints.listings import Listing
from mcpvisor.frontend.endpoints.notices import Notices
from mcpvisor.frontend.endpoints.pages import paged
from mcpvisor.frontend.endpoints.request_state import StateSeal
from mcpvisor.frontend.endpoints.tool_calls import Builtin, ToolCalls, forwarded
from mcpvisor.frontend.tools.builtins import MANAGEMENT_TOOLS, Builtins

DIRECT_INFO: Final = {"name": "mcpvisor-direct", "version": "0.1.0"}
DIRECT_INSTRUCTIONS: Final = "Every tool of every connected upstream MCP server, named server:tool."


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


def direct_table(upstreams: Upstreams, notices: Notices, builtins: Builtins, seal: StateSeal | None = None) -> Table:
    """`/mcp/direct` for the engine: every upstream tool, resource and prompt, and the management tools."""
    page_size = upstreams.settings.page_size
    listings = direct_listings(upstreams, builtins)

    def listed(method: str) -> Handler:
        listing = listings[method]

        async def handle(context: Context) -> Result:
            return listing.result(rpc.member(context.params, "cursor") or None, context.call.version)

        return handle

    async def templates(context: Context) -> Result:
        cursor = rpc.member(context.params, "cursor") or None
        return paged("resources/templates/list", "resourceTemplates", upstreams.templates(), cursor, page_size)

    def resolve(name: str) -> Builtin | ToolTarget:
        if name in MANAGEMENT_TOOLS and builtins.offers(name):
            return Builtin(name)
        return upstreams.find_tool(name)

    def read_target(context: Context) -> tuple[str, dict[str, Any]]:
        return upstreams.find_resource(rpc.member(context.params, "uri")), forwarded(context)

    def prompt_target(context: Context) -> tuple[str, dict[str, Any]]:
        server, prompt = upstreams.find_prompt(rpc.member(context.params, "name"))
        return server, forwarded(context, prompt)

    def completion_target(context: Context) -> tuple[str, dict[str, Any]]:
        params = forwarded(context)
        ref = dict(rpc.member(context.params, "ref"))
        if ref.get("type") == "ref/prompt":
            server, ref["name"] = upstreams.find_prompt(str(ref.get("name")))
        else:
            server = upstreams.find_resource(str(ref.get("uri")))
        params["ref"] = ref
        return server, params

    def capabilities(version: str) -> dict[str, Any]:
        found: dict[str, Any] = {
            "completions": {},
            "logging": {},
            "prompts": {"listChanged": True},
            "resources": {"listChanged": True, "subscribe": True},
            "tools": {"listChanged": True},
        }
        if eras.is_modern(version) and any(upstreams.offers_tasks(view.id) for view in upstreams.visible()):
            found["extensions"] = {TASKS: {}}
        return found

    def input_schema(name: str) -> dict[str, Any] | None:
        # The 2026-07-28 path checks Mcp-Param headers without listing every tool per call.
        if name in MANAGEMENT_TOOLS:
            return builtins.input_schema(name)
        tool = upstreams.catalog.tool_definition(name)
        return tool.get("inputSchema") if tool is not None else None

    handlers: dict[str, Handler] = {
        "server/discover": discover,
        "tools/list": listed("tools/list"),
        "tools/call": ToolCalls(upstreams, builtins, resolve, via="direct", tasks=True, task_handles=True),
        "resources/list": listed("resources/list"),
        "resources/templates/list": templates,
        "resources/read": forwarding(upstreams, "resources/read", read_target),
        "prompts/list": listed("prompts/list"),
        "prompts/get": forwarding(upstreams, "prompts/get", prompt_target),
        "completion/complete": forwarding(upstreams, "completion/complete", completion_target),
        "subscriptions/listen": listening(notices),
        **session_handlers(notices, upstreams.find_resource),
        **task_requests(upstreams, split_task_id),
    }
    identity = Identity(lambda: dict(DIRECT_INFO), capabilities, lambda: DIRECT_INSTRUCTIONS)
    return Table("/mcp/direct", handlers, identity, input_schema, seal)
