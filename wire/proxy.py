"""The proxy extension's vocabulary, shared by the frontend's `proxy` tool and its clients.

The tool's definition, its actions and capability types, the annotations of its answers, and the
validation of its arguments. Pure: no I/O, no MCP session.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

Action = Literal["list", "info", "call"]
CapabilityType = Literal["tool", "resource", "prompt"]

PROXY_TOOL_NAME: Final = "proxy"
ACTIONS: Final[tuple[Action, ...]] = ("list", "info", "call")
CAPABILITY_TYPES: Final[tuple[CapabilityType, ...]] = ("tool", "resource", "prompt")
DEFAULT_LIMIT: Final = 100
MAX_LIMIT: Final = 1000

# The type identifiers of a `list` answer (`many: true`). A resource listing mixes resources and
# resource templates, hence the union.
PYTHON_TYPES: Final[dict[CapabilityType, str]] = {
    "tool": "Tool",
    "resource": "Resource | ResourceTemplate",
    "prompt": "Prompt",
}

JSON_MIME_TYPE: Final = "application/json"

_PARAMETERS: Final = ("action", "type", "path", "args", "limit", "offset", "filter_server")

PROXY_TOOL: Final[dict[str, Any]] = {
    "name": PROXY_TOOL_NAME,
    "description": (
        "Unified access to every tool, resource and prompt of the upstream servers through one tool.\n"
        "\n"
        "- action 'list': list the capabilities of `type` (tool, resource or prompt). Paginated with "
        "`limit` (1-1000, default 100) and `offset` (default 0); `filter_server` keeps only names "
        "starting with a server prefix such as 'github:'.\n"
        "- action 'info': the full definition of the one capability named by `path`.\n"
        "- action 'call': call the tool, read the resource (`path` is its URI) or get the prompt named "
        "by `path`, passing `args` (an object or a JSON string) to tools and prompts.\n"
        "\n"
        "'list' and 'info' answer with one embedded JSON resource annotated with proxyAction, proxyType, "
        "pythonType and many ('list' adds totalCount, offset and limit). 'call' answers with the "
        "capability's own result, each item annotated with proxyType, proxyAction and proxyPath."
    ),
    "inputSchema": {
        "type": "object",
        "properties": {
            "action": {
                "type": "string",
                "enum": list(ACTIONS),
                "description": "Action to perform: list, info, or call.",
            },
            "type": {
                "type": "string",
                "enum": list(CAPABILITY_TYPES),
                "description": "Type of MCP capability to interact with: tool, resource, or prompt.",
            },
            "path": {
                "type": "string",
                "description": (
                    "Name or URI of the specific tool/resource/prompt, as 'list' shows it. "
                    "Required for 'info' and 'call' actions; not allowed for 'list'."
                ),
            },
            "args": {
                "anyOf": [{"type": "object", "additionalProperties": True}, {"type": "string"}],
                "description": (
                    "Arguments for a 'call' action (call tool, read resource, or get prompt). "
                    "Can be an object or a JSON string. Only allowed for 'call'."
                ),
            },
            "limit": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_LIMIT,
                "default": DEFAULT_LIMIT,
                "description": "Maximum number of items to return (for 'list' action only). Default: 100",
            },
            "offset": {
                "type": "integer",
                "minimum": 0,
                "default": 0,
                "description": "Number of items to skip (for 'list' action only). Default: 0",
            },
            "filter_server": {
                "type": "string",
                "description": "Filter results by server name prefix (for 'list' action only)",
            },
        },
        "required": ["action", "type"],
        "additionalProperties": False,
    },
    # The proxy reaches every upstream tool, destructive and open-world ones included, so its
    # hints are the most cautious ones; a client must not auto-approve it as read-only.
    "annotations": {
        "title": "MCP proxy",
        "readOnlyHint": False,
        "destructiveHint": True,
        "idempotentHint": False,
        "openWorldHint": True,
    },
}


class ProxyError(Exception):
    """A proxy request that cannot be served; the message goes to the client as it is.

    `run_proxy` raises it for invalid arguments and a `ProxyBackend` raises it for unknown names
    and similar faults. The message must be safe to show: no internal paths, tracebacks or secrets.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True)
class ProxyRequest:
    """The validated arguments of one proxy tool call."""

    action: Action
    type: CapabilityType
    path: str | None = None
    args: dict[str, Any] | None = None
    limit: int = DEFAULT_LIMIT
    offset: int = 0
    filter_server: str | None = None


def parse_proxy_arguments(arguments: Mapping[str, Any] | None) -> ProxyRequest:
    """Validate the proxy tool's arguments; raise `ProxyError` with the spec's message if invalid.

    Types and ranges are checked first, then the combinations the extension forbids, in the order
    of the reference implementation so that a request with several faults gets the same message.
    An explicit `null` counts as absent, and so do an empty `path` and empty `args`, as in Magg.
    """
    arguments = arguments or {}
    for key in arguments:
        if key not in _PARAMETERS:
            raise ProxyError(f"Unknown parameter '{key}'. Allowed parameters are {_quoted(_PARAMETERS)}.")

    action = arguments.get("action")
    if action is None:
        raise ProxyError("Parameter 'action' is required")
    if action not in ACTIONS:
        raise ProxyError(f"Invalid proxy action '{action}'. Supported actions are {_quoted(ACTIONS)}.")
    capability_type = arguments.get("type")
    if capability_type is None:
        raise ProxyError("Parameter 'type' is required")
    if capability_type not in CAPABILITY_TYPES:
        raise ProxyError(f"Invalid proxy type '{capability_type}'. Supported types are {_quoted(CAPABILITY_TYPES)}.")

    path = arguments.get("path")
    if path is not None and not isinstance(path, str):
        raise ProxyError("Parameter 'path' must be a string")
    args = arguments.get("args")
    if args is not None and not isinstance(args, dict | str):
        raise ProxyError("Parameter 'args' must be an object or a JSON string")
    limit = _integer(arguments, "limit", minimum=1, maximum=MAX_LIMIT)
    offset = _integer(arguments, "offset", minimum=0)
    filter_server = arguments.get("filter_server")
    if filter_server is not None and not isinstance(filter_server, str):
        raise ProxyError("Parameter 'filter_server' must be a string")

    if action in ("info", "call") and not path:
        raise ProxyError(f"Parameter 'path' is required for action '{action}'")
    if action in ("list", "info") and args:
        raise ProxyError(f"Parameter 'args' should not be provided for action '{action}'")
    if action == "list" and path:
        raise ProxyError("Parameter 'path' should not be provided for action 'list'")
    if action != "list" and (limit is not None or offset is not None or filter_server is not None):
        raise ProxyError("Parameters 'limit', 'offset', and 'filter_server' are only allowed for 'list' action")

    return ProxyRequest(
        action=cast(Action, action),
        type=cast(CapabilityType, capability_type),
        path=path or None,
        args=_call_arguments(args) if action == "call" else None,
        limit=DEFAULT_LIMIT if limit is None else limit,
        offset=0 if offset is None else offset,
        filter_server=filter_server or None,
    )


def _integer(arguments: Mapping[str, Any], key: str, *, minimum: int, maximum: int | None = None) -> int | None:
    value = arguments.get(key)
    if value is None:
        return None
    # JSON has one number type, so 50.0 is the integer 50; bool is an int subclass but not a number.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    in_range = (
        isinstance(value, int)
        and not isinstance(value, bool)
        and value >= minimum
        and (maximum is None or value <= maximum)
    )
    if not in_range:
        bounds = f"from {minimum} to {maximum}" if maximum is not None else f"of {minimum} or more"
        raise ProxyError(f"Parameter '{key}' must be an integer {bounds}")
    return value


def _call_arguments(args: dict[str, Any] | str | None) -> dict[str, Any]:
    if args is None or args == "":
        return {}
    if isinstance(args, dict):
        return args
    try:
        decoded = json.loads(args, parse_constant=reject_json_constant)
    except ValueError as error:
        raise ProxyError(f"Parameter 'args' is not valid JSON: {error}") from None
    if not isinstance(decoded, dict):
        raise ProxyError("Parameter 'args' must encode a JSON object")
    return decoded


def reject_json_constant(name: str) -> Any:
    # NaN and Infinity are accepted by Python's json module but are not JSON.
    raise ValueError(f"{name} is not valid JSON")


def _quoted(names: Sequence[str]) -> str:
    quoted = [f"'{name}'" for name in names]
    return ", ".join(quoted[:-1]) + ", and " + quoted[-1]
