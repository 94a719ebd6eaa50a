"""`retrieve_tools`: search by words and meaning over the tools a client may call, and which call tool to use."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from mcpvisor.frontend.door.upstreams import Upstreams
from mcpvisor.frontend.tool_args import check_parameters, get_integer, get_string, json_result

RETRIEVE_TOOL_NAME: Final = "retrieve_tools"
MAX_LIMIT: Final = 100


def call_with(annotations: Mapping[str, Any] | None) -> str:
    """The call tool a client should use for a tool with these annotations.

    A tool marked destructive needs `call_tool_destructive` even if it also claims to be read-only:
    the other two refuse it, and the cautious reading of contradictory hints is the safe one.
    """
    annotations = annotations or {}
    if annotations.get("destructiveHint") is True:
        return "call_tool_destructive"
    if annotations.get("readOnlyHint") is True:
        return "call_tool_read"
    return "call_tool_write"


def retrieve_tool(default_limit: int) -> dict[str, Any]:
    """The tool definition, with the configured default number of results."""
    return {
        "name": RETRIEVE_TOOL_NAME,
        "description": (
            "Search the tools of all connected upstream servers by what you want done, in plain words or "
            "keywords. Use it first: upstream "
            "tools are not listed directly. Each result gives the tool's name in server:tool form, its "
            "description, input schema, annotations, a relevance score, and `call_with`: the tool to call it "
            "with (call_tool_read, call_tool_write or call_tool_destructive)."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "query": {
                    "type": "string",
                    "description": "Search keywords, e.g. 'create github issue'.",
                },
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_LIMIT,
                    "default": default_limit,
                    "description": f"Maximum number of results (default {default_limit}, at most {MAX_LIMIT}).",
                },
            },
            "required": ["query"],
            "additionalProperties": False,
        },
        "annotations": {"title": "Search tools", "readOnlyHint": True, "openWorldHint": False},
    }


async def retrieve_tools(upstreams: Upstreams, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Run the search over the tools a client may call (hidden servers and changed tools left out)."""
    check_parameters(arguments, ("query", "limit"), what=RETRIEVE_TOOL_NAME)
    query = get_string(arguments, "query", required=True)
    assert query is not None
    limit = get_integer(arguments, "limit", default=upstreams.settings.tools_limit, minimum=1, maximum=MAX_LIMIT)
    tools = []
    for hit, definition in await upstreams.search(query, limit):
        entry: dict[str, Any] = {
            "name": f"{hit.server}:{hit.tool}",
            "server": hit.server,
            "description": definition.get("description", ""),
            "inputSchema": definition.get("inputSchema", {"type": "object"}),
        }
        if "title" in definition:
            entry["title"] = definition["title"]
        if definition.get("annotations"):
            entry["annotations"] = definition["annotations"]
        entry["score"] = round(hit.score, 4)
        entry["call_with"] = call_with(definition.get("annotations"))
        tools.append(entry)
    return json_result({"query": query, "tools": tools, "total": len(tools)})
