"""The `proxy` tool of the MCP Proxy Extension: list, describe and call upstream capabilities.

Pure and I/O-free: the frontend plugs in its catalog and call routing as a `ProxyBackend`;
`run_proxy` validates the tool's arguments and shapes every answer as the extension specifies
(embedded JSON resources annotated with `proxyAction`, `proxyType`, `pythonType`, ...).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from mcpvisor.wire.proxy import (
    JSON_MIME_TYPE,
    PROXY_TOOL_NAME,
    PYTHON_TYPES,
    CapabilityType,
    ProxyError,
    ProxyRequest,
    parse_proxy_arguments,
    reject_json_constant,
)

__all__ = ["ProxyBackend", "objectify_resource", "run_proxy"]


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
        value = json.loads(text, parse_constant=reject_json_constant)
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


def _prompt_arguments(args: Mapping[str, Any]) -> dict[str, str]:
    # MCP prompt arguments are strings. Models often send numbers or lists anyway; their JSON text
    # is what a prompt template would show, so convert rather than fail.
    return {key: value if isinstance(value, str) else _dumps(value) for key, value in args.items()}


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
