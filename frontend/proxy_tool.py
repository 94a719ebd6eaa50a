"""The `proxy` tool of the MCP Proxy Extension: list, describe and call upstream capabilities.

Pure and I/O-free: the frontend plugs in its catalog and call routing as a `ProxyBackend`;
`run_proxy` validates the tool's arguments and shapes every answer as the extension specifies
(embedded JSON resources annotated with `proxyAction`, `proxyType`, `pythonType`, ...).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, cast

__all__ = [
    "ACTIONS",
    "CAPABILITY_TYPES",
    "DEFAULT_LIMIT",
    "JSON_MIME_TYPE",
    "MAX_LIMIT",
    "PROXY_TOOL",
    "PROXY_TOOL_NAME",
    "PYTHON_TYPES",
    "Action",
    "CapabilityType",
    "ProxyBackend",
    "ProxyError",
    "ProxyRequest",
    "objectify_resource",
    "parse_proxy_arguments",
    "run_proxy",
]

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


class ProxyBackend(Protocol):
    """What the `proxy` tool needs from the frontend: its catalog and its call routing.

    Listings are MCP wire dicts with the names and URIs the catalog shows (for example
    `github:create_issue`), in a stable order so that `offset` pages fit together between calls.
    `filter_server` matches the start of each item's `name`, so resources and resource templates
    need the server prefix on their name as well (their URIs stay as the upstream wrote them).
    Results are MCP wire dicts too. Unknown names and other faults a client can fix are raised as
    `ProxyError`.
    """

    async def list_tools(self) -> list[dict[str, Any]]:
        """Every tool of the catalog (`Tool` wire dicts)."""
        ...

    async def list_resources(self) -> list[dict[str, Any]]:
        """Every resource and resource template (`Resource` and `ResourceTemplate` wire dicts)."""
        ...

    async def list_prompts(self) -> list[dict[str, Any]]:
        """Every prompt of the catalog (`Prompt` wire dicts)."""
        ...

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Call a tool and return its `CallToolResult` wire dict."""
        ...

    async def read_resource(self, uri: str) -> dict[str, Any]:
        """Read a resource and return its `ReadResourceResult` wire dict."""
        ...

    async def get_prompt(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Get a prompt and return its `GetPromptResult` wire dict."""
        ...


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


async def run_proxy(backend: ProxyBackend, arguments: Mapping[str, Any] | None) -> dict[str, Any]:
    """Serve one call of the proxy tool and return its `CallToolResult` wire dict.

    Invalid arguments and `ProxyError`s from the backend become `isError` results carrying the
    message, the way MCP reports tool errors to the model; any other exception propagates.
    """
    try:
        request = parse_proxy_arguments(arguments)
        if request.action == "list":
            return _result([await _list(backend, request)])
        if request.action == "info":
            return _result([await _info(backend, request)])
        return await _call(backend, request)
    except ProxyError as error:
        return _result([{"type": "text", "text": error.message}], is_error=True)


def objectify_resource(contents: Mapping[str, Any]) -> dict[str, Any]:
    """Re-encode text resource contents that parse as JSON, keeping the original type in `contentType`.

    Binary contents, contents already typed `application/json` and text that is not JSON come back
    unchanged (as a copy).
    """
    text = contents.get("text")
    if not isinstance(text, str) or contents.get("mimeType") == JSON_MIME_TYPE:
        return dict(contents)
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except ValueError:
        return dict(contents)
    objectified = {**contents, "mimeType": JSON_MIME_TYPE, "text": _dumps(value)}
    if contents.get("mimeType") is not None:
        objectified["contentType"] = contents["mimeType"]
    return objectified


async def _list(backend: ProxyBackend, request: ProxyRequest) -> dict[str, Any]:
    items = await _catalog(backend, request.type)
    if request.filter_server:
        prefix = request.filter_server
        items = [item for item in items if str(item.get("name", "")).startswith(prefix)]
    page = items[request.offset : request.offset + request.limit]
    return _embedded_json(
        page,
        uri=f"{PROXY_TOOL_NAME}:list/{request.type}",
        annotations={
            "proxyAction": "list",
            "proxyType": request.type,
            "pythonType": PYTHON_TYPES[request.type],
            "many": True,
            "totalCount": len(items),
            "offset": request.offset,
            "limit": request.limit,
        },
    )


async def _info(backend: ProxyBackend, request: ProxyRequest) -> dict[str, Any]:
    assert request.path is not None  # parse_proxy_arguments requires it for 'info'
    item = _find(await _catalog(backend, request.type), request.type, request.path)
    if request.type == "resource":
        python_type = "ResourceTemplate" if "uriTemplate" in item else "Resource"
    else:
        python_type = PYTHON_TYPES[request.type]
    return _embedded_json(
        item,
        uri=f"{PROXY_TOOL_NAME}:info/{request.type}/{request.path}",
        annotations={
            "proxyAction": "info",
            "proxyType": request.type,
            "proxyPath": request.path,
            "pythonType": python_type,
            "many": False,
        },
    )


async def _call(backend: ProxyBackend, request: ProxyRequest) -> dict[str, Any]:
    path, args = request.path, request.args or {}
    assert path is not None  # parse_proxy_arguments requires it for 'call'
    annotations = {"proxyType": request.type, "proxyAction": "call", "proxyPath": path}

    if request.type == "tool":
        called = await backend.call_tool(path, args)
        content = [_annotated(item, annotations) for item in called.get("content", [])]
        result = _result(content, is_error=called.get("isError") is True)
        if called.get("structuredContent") is not None:
            result["structuredContent"] = called["structuredContent"]
        return result

    if request.type == "resource":
        # Resources take no arguments: the URI in `path` says everything, so `args` is ignored.
        read = await backend.read_resource(path)
        content = [
            {"type": "resource", "resource": objectify_resource(contents), "annotations": dict(annotations)}
            for contents in read.get("contents", [])
        ]
        return _result(content)

    prompt = await backend.get_prompt(path, _prompt_arguments(args))
    return _result(
        [
            _embedded_json(
                prompt,
                uri=f"{PROXY_TOOL_NAME}:{path}",
                annotations={**annotations, "pythonType": "GetPromptResult"},
            )
        ]
    )


async def _catalog(backend: ProxyBackend, capability_type: CapabilityType) -> list[dict[str, Any]]:
    if capability_type == "tool":
        return await backend.list_tools()
    if capability_type == "resource":
        return await backend.list_resources()
    return await backend.list_prompts()


def _find(items: Sequence[Mapping[str, Any]], capability_type: CapabilityType, path: str) -> dict[str, Any]:
    # `path` is a name for tools and prompts; for resources the spec calls it a name or URI, so a
    # URI (or URI template) wins over a resource whose name merely happens to be the same string.
    keys = ("uri", "uriTemplate", "name") if capability_type == "resource" else ("name",)
    for key in keys:
        for item in items:
            if item.get(key) == path:
                return dict(item)
    raise ProxyError(f"{capability_type.capitalize()} '{path}' not found")


def _embedded_json(value: Any, *, uri: str, annotations: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "resource",
        "resource": {"uri": uri, "mimeType": JSON_MIME_TYPE, "text": _dumps(value)},
        "annotations": annotations,
    }


def _annotated(item: Mapping[str, Any], annotations: Mapping[str, Any]) -> dict[str, Any]:
    # Upstream annotations (audience, priority, ...) stay; the proxy's own keys are added on top.
    return {**item, "annotations": {**(item.get("annotations") or {}), **annotations}}


def _result(content: list[dict[str, Any]], *, is_error: bool = False) -> dict[str, Any]:
    # `resultType` is required on the 2026-07-28 wire and ignored by older peers; the SDK's own
    # CallToolResult always carries it, and a dict without it fails the SDK's 2026 validation.
    return {"content": content, "isError": is_error, "resultType": "complete"}


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
        decoded = json.loads(args, parse_constant=_reject_constant)
    except ValueError as error:
        raise ProxyError(f"Parameter 'args' is not valid JSON: {error}") from None
    if not isinstance(decoded, dict):
        raise ProxyError("Parameter 'args' must encode a JSON object")
    return decoded


def _prompt_arguments(args: Mapping[str, Any]) -> dict[str, str]:
    # MCP prompt arguments are strings. Models often send numbers or lists anyway; their JSON text
    # is what a prompt template would show, so convert rather than fail.
    return {key: value if isinstance(value, str) else _dumps(value) for key, value in args.items()}


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _reject_constant(name: str) -> Any:
    # NaN and Infinity are accepted by Python's json module but are not JSON.
    raise ValueError(f"{name} is not valid JSON")


def _quoted(names: Sequence[str]) -> str:
    quoted = [f"'{name}'" for name in names]
    return ", ".join(quoted[:-1]) + ", and " + quoted[-1]
