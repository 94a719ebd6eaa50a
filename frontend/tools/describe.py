"""`describe_tools`: the full definitions of tools named by a client, for the compact entries of a search.

What a client may see here is exactly what it may call: a name resolves as `call_tool_*` resolves
it (the client's tenant, its servers, enabled and connected), a quarantined server's tools and a
tool whose definition changed since approval are named with the reason and no definition, as a
call to them would be refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from mcpvisor.frontend.door.gatekeeper import approve_command
from mcpvisor.frontend.door.upstreams import NotFound, Upstreams
from mcpvisor.frontend.tool_args import ToolInputError, check_parameters, json_result, json_type
from mcpvisor.frontend.tools.retrieval import DESCRIBE_TOOL_NAME, RETRIEVE_TOOL_NAME, full_entry

# Enough for every compact entry an agent could want at once, few enough that one call cannot
# ask for a whole catalog of schemas.
MAX_NAMES: Final = 20
MAX_NAME_CHARS: Final = 300

DESCRIBE_TOOL: Final[dict[str, Any]] = {
    "name": DESCRIBE_TOOL_NAME,
    "description": (
        f"Give the full definitions (description, input schema, annotations, call_with) of upstream tools by "
        f"name, e.g. those {RETRIEVE_TOOL_NAME} lists under `more`. Ask for all you need in one call."
    ),
    "inputSchema": {
        "type": "object",
        "properties": {
            "names": {
                "type": "array",
                "items": {"type": "string"},
                "minItems": 1,
                "maxItems": MAX_NAMES,
                "description": "Tool names in server:tool form, e.g. ['github:create_issue'].",
            }
        },
        "required": ["names"],
        "additionalProperties": False,
    },
    "annotations": {"title": "Describe tools", "readOnlyHint": True, "openWorldHint": False},
}


def _names(arguments: Mapping[str, Any]) -> list[str]:
    names = arguments.get("names")
    if isinstance(names, str):  # one name given bare: the intent is plain
        names = [names]
    if not isinstance(names, list) or not names:
        raise ToolInputError("Parameter 'names' must be a non-empty array of tool names in server:tool form")
    if len(names) > MAX_NAMES:
        raise ToolInputError(f"Parameter 'names' holds {len(names)} names; ask for at most {MAX_NAMES} at once")
    for name in names:
        if not isinstance(name, str):
            raise ToolInputError(f"Parameter 'names' must hold strings, got {json_type(name)}")
        if len(name) > MAX_NAME_CHARS:
            raise ToolInputError(f"A tool name in 'names' is longer than {MAX_NAME_CHARS} characters")
    return list(dict.fromkeys(names))


def describe(upstreams: Upstreams, name: str) -> dict[str, Any]:
    """One name's entry: the tool in full, or the name and why it is not shown."""
    try:
        target = upstreams.find_tool(name, quarantined=True)
    except NotFound as exc:
        return {"name": name, "error": exc.message}
    if target.quarantined:
        return {
            "name": target.name,
            "error": (
                f"Server '{target.server}' is quarantined: its tools are not shown or run until an operator "
                f"approves it with `{approve_command(target.server)}`."
            ),
        }
    view = upstreams.catalog.servers[target.server]
    if target.tool in upstreams.gate.withheld(target.server, view.tools):
        return {
            "name": target.name,
            "error": (
                "Its definition changed since approval, so it is withheld; an operator approves it with "
                f"`{approve_command(target.server)}`."
            ),
        }
    return full_entry(target.server, target.tool, target.definition)


async def describe_tools(upstreams: Upstreams, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Full definitions of the named tools, in the order asked; one per name, with `error` for those not shown."""
    check_parameters(arguments, ("names",), what=DESCRIBE_TOOL_NAME)
    tools = [describe(upstreams, name) for name in _names(arguments)]
    return json_result({"tools": tools, "total": sum("error" not in tool for tool in tools)})
