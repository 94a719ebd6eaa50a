"""`/mcp`: the search-first endpoint (seed 004). A handful of built-in tools; upstream tools are found by search.

Clients see `retrieve_tools`, `describe_tools`, the three call tools, `upstream_servers`, `quarantine_security`,
`read_cache` and the `proxy` tool, however many upstream tools there are.
"""

from __future__ import annotations

from typing import Any, Final

from mcpvisor.frontend.door.upstreams import NotFound, Upstreams
from mcpvisor.frontend.endpoints import eras
from mcpvisor.frontend.endpoints.handlers import Context, Handler, Identity, Result, Table, discover
from mcpvisor.frontend.endpoints.request_state import StateSeal
from mcpvisor.frontend.endpoints.tool_calls import Builtin, ToolCalls
from mcpvisor.frontend.tools.builtins import SEARCH_ENDPOINT_TOOLS, Builtins

INSTRUCTIONS = (
    "mcpvisor aggregates many upstream MCP servers behind a few tools. "
    "DISCOVER: call retrieve_tools with keywords to find upstream tools (named server:tool); "
    "do this before assuming a capability is missing. Its best matches come in full, the next ones by name and "
    "summary: describe_tools gives their schemas. "
    "CALL: use the variant named by each result's call_with field: call_tool_read, call_tool_write or "
    "call_tool_destructive, with the tool's arguments in args and an intent whose operation_type matches. "
    "A long response is cut; read the rest with read_cache. "
    "MANAGE: upstream_servers lists servers and proposes changes to them, which wait for an operator; "
    "quarantine_security inspects and blocks quarantined servers (only an operator approves one, with mcpvisor ctl). "
    "The proxy tool lists, describes and calls tools, resources and prompts in one interface."
)


SEARCH_INFO: Final = {"name": "mcpvisor", "version": "0.1.0"}


def search_table(upstreams: Upstreams, builtins: Builtins, seal: StateSeal | None = None) -> Table:
    """`/mcp` for the engine: mcpvisor's own tools only; upstream tools are found by search."""

    async def list_tools(context: Context) -> Result:
        return {"tools": builtins.definitions(SEARCH_ENDPOINT_TOOLS)}

    def resolve(name: str) -> Builtin:
        if name in SEARCH_ENDPOINT_TOOLS and builtins.offers(name):
            return Builtin(name)
        raise NotFound(
            "tool",
            name,
            f"this endpoint offers {', '.join(SEARCH_ENDPOINT_TOOLS)}. Find upstream tools with retrieve_tools and "
            "call them with call_tool_read, call_tool_write or call_tool_destructive.",
        )

    def capabilities(version: str) -> dict[str, Any]:
        # Its list is mcpvisor's own and changes only with the config; 2026-07-28 clients have no
        # listen stream here to hear of it.
        return {"tools": {"listChanged": not eras.is_modern(version)}}

    def input_schema(name: str) -> dict[str, Any] | None:
        return builtins.input_schema(name) if name in SEARCH_ENDPOINT_TOOLS else None

    handlers: dict[str, Handler] = {
        "server/discover": discover,
        "tools/list": list_tools,
        "tools/call": ToolCalls(upstreams, builtins, resolve, via="search"),
    }
    identity = Identity(lambda: dict(SEARCH_INFO), capabilities, lambda: INSTRUCTIONS)
    return Table("/mcp", handlers, identity, input_schema, seal)
