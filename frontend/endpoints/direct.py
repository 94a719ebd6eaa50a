"""`/mcp/direct`: every upstream tool, resource and prompt, named `server:tool` (seed 003)."""

from __future__ import annotations

import warnings
from typing import Any, Final

import mcp_types as types
from mcp.server import CacheHint, NotificationOptions, Server, ServerRequestContext
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcpvisor.frontend.door.calls import ClientCall
from mcpvisor.frontend.door.forwarding import complete, decoded, forwardable
from mcpvisor.frontend.door.tasks import TASK_METHODS, TASKS, UnknownTask, created_task, exposed_task_id, split_task_id
from mcpvisor.frontend.door.upstreams import Refused, ToolTarget, UpstreamError, Upstreams
from mcpvisor.frontend.endpoints import eras, rpc
from mcpvisor.frontend.endpoints.clients import Clients
from mcpvisor.frontend.endpoints.door_handlers import forwarding, listening, session_handlers, task_requests
from mcpvisor.frontend.endpoints.handlers import Context, Handler, Identity, Result, Table, discover
from mcpvisor.frontend.endpoints.listings import Listing
from mcpvisor.frontend.endpoints.mcp_server import AnnouncingServer, SdkRequester
from mcpvisor.frontend.endpoints.notices import Notices
from mcpvisor.frontend.endpoints.pages import paged
from mcpvisor.frontend.endpoints.request_state import StateSeal
from mcpvisor.frontend.endpoints.tasks import TaskParams, call_refused, check_task_request
from mcpvisor.frontend.endpoints.tool_calls import Builtin, ToolCalls, forwarded
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


class DirectServer(AnnouncingServer):
    """`/mcp/direct`'s server: offers the Tasks extension while a visible upstream offers it."""

    def __init__(self, upstreams: Upstreams, *args: Any, **kwargs: Any) -> None:
        self._upstreams = upstreams
        super().__init__(*args, **kwargs)

    def get_capabilities(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
        *,
        protocol_version: str | None = None,
    ) -> types.ServerCapabilities:
        if protocol_version in MODERN_PROTOCOL_VERSIONS and any(
            self._upstreams.offers_tasks(view.id) for view in self._upstreams.visible()
        ):
            extensions = {**(extensions if extensions is not None else self.extensions), TASKS: {}}
        return super().get_capabilities(
            notification_options, experimental_capabilities, extensions, protocol_version=protocol_version
        )


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
            return await builtins.call(params.name, params.arguments, SdkRequester(ctx))
        target = upstreams.find_tool(params.name)
        forwarded = forwardable(params, ctx)
        forwarded["name"] = target.tool
        try:
            call = ClientCall(SdkRequester(ctx), target.server)
            result = await upstreams.call_tool(target, forwarded, call, via="direct", tasks=True)
        except Refused as refused:
            return refused.answer
        except UpstreamError as exc:
            raise call_refused(exc, target.definition) from None
        answer = decoded(result)
        if (task_id := created_task(answer)) is not None:
            # Upstreams mint their own ids, which may collide: the client holds `server:id`.
            answer["taskId"] = exposed_task_id(target.server, task_id)
        return keep(answer)

    async def task_request(ctx: ServerRequestContext[Any], params: TaskParams) -> dict[str, Any]:
        """tasks/get, tasks/update, tasks/cancel: a `server:id` handle goes to that server as `id`."""
        check_task_request(ctx, params.taskId)
        found = split_task_id(params.taskId)
        if found is None:
            raise MCPError(code=types.INVALID_PARAMS, message=UnknownTask(params.taskId).message)
        server, task_id = found
        forwarded = {**forwardable(params, ctx), "taskId": task_id}
        try:
            raw = await upstreams.task_request(
                server, ctx.method, forwarded, ClientCall(SdkRequester(ctx), server), handle=params.taskId
            )
        except UnknownTask as exc:
            raise MCPError(code=types.INVALID_PARAMS, message=exc.message) from None
        answer = decoded(raw)
        if answer.get("taskId") == task_id:
            answer["taskId"] = params.taskId
        return answer

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
        call = ClientCall(SdkRequester(ctx), server)
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
        return keep(
            decoded(await upstreams.request(server, "prompts/get", forwarded, ClientCall(SdkRequester(ctx), server)))
        )

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
        return keep(
            decoded(
                await upstreams.request(server, "completion/complete", forwarded, ClientCall(SdkRequester(ctx), server))
            )
        )

    def tool_input_schema(name: str) -> dict[str, Any] | None:
        # Lets the 2026-07-28 HTTP path check Mcp-Param headers without listing every tool per call.
        if name in MANAGEMENT_TOOLS:
            return builtins.input_schema(name)
        tool = upstreams.catalog.tool_definition(name)
        return tool.get("inputSchema") if tool is not None else None

    # logging/setLevel is deprecated in 2026-07-28 but is how handshake-era clients ask for logs.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        server = DirectServer(
            upstreams,
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
    for method in TASK_METHODS:
        server.add_request_handler(method, TaskParams, task_request)
    server.middleware += [clients.remembering]
    return server


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


# -- the engine's table ---------------------------------------------------------------------------

DIRECT_INFO: Final = {"name": "mcpvisor-direct", "version": "0.1.0"}
DIRECT_INSTRUCTIONS: Final = "Every tool of every connected upstream MCP server, named server:tool."


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
