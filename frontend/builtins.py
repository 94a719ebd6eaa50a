"""The built-in tools of both MCP endpoints, sharing one state store and one response cache per gateway."""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Final

from mcp.shared.exceptions import MCPError

from mcpvisor.frontend.activity import ActivityLog
from mcpvisor.frontend.approvals import ToolApprovals
from mcpvisor.frontend.builtin_calls import VARIANTS, ToolCaller, call_tool_definition
from mcpvisor.frontend.gateway import Gateway
from mcpvisor.frontend.management import UPSTREAM_SERVERS_TOOL, UPSTREAM_TOOL_NAME, UpstreamServers
from mcpvisor.frontend.proxy_backend import GatewayProxyBackend, serve_proxy
from mcpvisor.frontend.quarantine import QUARANTINE_SECURITY_TOOL, QUARANTINE_TOOL_NAME, QuarantineSecurity
from mcpvisor.frontend.response_cache import READ_CACHE_TOOL, READ_CACHE_TOOL_NAME, ResponseCache, read_cache
from mcpvisor.frontend.retrieval import RETRIEVE_TOOL_NAME, retrieve_tool, retrieve_tools
from mcpvisor.frontend.state_db import open_state_db
from mcpvisor.frontend.tool_args import ToolInputError, error_result
from mcpvisor.wire.errors import INVALID_PARAMS
from mcpvisor.wire.proxy import PROXY_TOOL, PROXY_TOOL_NAME

# The search workflow only makes sense where upstream tools are not listed (seed 003, FR-003).
SEARCH_WORKFLOW_TOOLS: Final = (RETRIEVE_TOOL_NAME, *VARIANTS)
MANAGEMENT_TOOLS: Final = (UPSTREAM_TOOL_NAME, QUARANTINE_TOOL_NAME, READ_CACHE_TOOL_NAME)
SEARCH_ENDPOINT_TOOLS: Final = (*SEARCH_WORKFLOW_TOOLS, *MANAGEMENT_TOOLS, PROXY_TOOL_NAME)

Handler = Callable[[Mapping[str, Any]], Awaitable[dict[str, Any]]]


class Builtins:
    """Definitions and handlers of every built-in tool."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.db = open_state_db(gateway.spec.data_dir)
        self.activity = ActivityLog(self.db)
        self.approvals = ToolApprovals(self.db)
        self.cache = ResponseCache()
        caller = ToolCaller(gateway, self.activity, self.approvals, self.cache)
        proxy_backend = GatewayProxyBackend(gateway, self.activity, self.approvals)

        async def retrieve(arguments: Mapping[str, Any]) -> dict[str, Any]:
            return retrieve_tools(gateway, self.approvals, arguments)

        async def page(arguments: Mapping[str, Any]) -> dict[str, Any]:
            return read_cache(self.cache, arguments, page_size=gateway.spec.settings.tool_response_limit)

        async def proxy(arguments: Mapping[str, Any]) -> dict[str, Any]:
            return await serve_proxy(proxy_backend, arguments)

        def variant(name: str) -> Handler:
            async def call(arguments: Mapping[str, Any], ctx: Any = None) -> dict[str, Any]:
                return await caller.call(name, arguments, ctx)

            return call

        self._handlers: dict[str, Handler] = {
            RETRIEVE_TOOL_NAME: retrieve,
            **{name: variant(name) for name in VARIANTS},
            UPSTREAM_TOOL_NAME: UpstreamServers(gateway),
            QUARANTINE_TOOL_NAME: QuarantineSecurity(gateway, self.approvals),
            READ_CACHE_TOOL_NAME: page,
            PROXY_TOOL_NAME: proxy,
        }
        self._definitions: dict[str, dict[str, Any]] = {
            RETRIEVE_TOOL_NAME: retrieve_tool(gateway.spec.settings.tools_limit),
            **{name: call_tool_definition(name) for name in VARIANTS},
            UPSTREAM_TOOL_NAME: UPSTREAM_SERVERS_TOOL,
            QUARANTINE_TOOL_NAME: QUARANTINE_SECURITY_TOOL,
            READ_CACHE_TOOL_NAME: READ_CACHE_TOOL,
            PROXY_TOOL_NAME: PROXY_TOOL,
        }

    def definitions(self, names: Iterable[str]) -> list[dict[str, Any]]:
        """Tool definitions (MCP wire dicts) of the named built-ins, in that order."""
        return [self._definitions[name] for name in names]

    def input_schema(self, name: str) -> dict[str, Any] | None:
        definition = self._definitions.get(name)
        return definition["inputSchema"] if definition is not None else None

    async def call(self, name: str, arguments: Mapping[str, Any] | None, ctx: Any = None) -> dict[str, Any]:
        """Run a built-in tool; a problem the caller can fix comes back as an `isError` result.

        `ctx`, the client's request context, lets an upstream call report progress, logs and
        questions back to that client.
        """
        handler = self._handlers.get(name)
        if handler is None:
            raise MCPError(code=INVALID_PARAMS, message=f"Unknown tool '{name}'")
        try:
            if name in VARIANTS:
                return await handler(arguments or {}, ctx)
            return await handler(arguments or {})
        except ToolInputError as exc:
            return error_result(exc.message)

    def close(self) -> None:
        self.db.close()


_by_gateway: weakref.WeakKeyDictionary[Gateway, Builtins] = weakref.WeakKeyDictionary()


def builtins_for(gateway: Gateway) -> Builtins:
    """The gateway's built-in tools, created on first use and shared by both endpoints."""
    builtins = _by_gateway.get(gateway)
    if builtins is None:
        builtins = _by_gateway[gateway] = Builtins(gateway)
    return builtins
