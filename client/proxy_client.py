"""Client side of the `proxy` tool: call it by its parameters, decode its answers, or use it transparently.

`ProxyClient` wraps a connected `mcp.Client`. `proxy()` sends one proxy tool call and decodes the
answer by its annotations; in transparent mode `list_tools`, `call_tool`, `read_resource`, ...
go through the proxy tool and return the SDK types the native methods return.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from types import UnionType
from typing import Any, Final, TypeAlias, Union, get_args

import mcp_types as types
from mcp import Client
from mcp.shared.dispatcher import ProgressFnT
from pydantic import BaseModel, TypeAdapter, ValidationError

from mcpvisor.wire.proxy import (
    JSON_MIME_TYPE,
    MAX_LIMIT,
    PROXY_TOOL_NAME,
    PYTHON_TYPES,
    Action,
    CapabilityType,
    ProxyError,
    ProxyRequest,
    parse_proxy_arguments,
)

__all__ = [
    "ProxyClient",
    "ProxyError",
    "ProxyResponse",
    "ProxyResponseError",
    "ProxyResponseInfo",
    "ProxyToolError",
    "deserialize_embedded_resource_python_object",
    "get_embedded_resource_python_object",
    "tool_result_as_prompt_result",
    "tool_result_as_resource_result",
]

ResourceContents: TypeAlias = types.TextResourceContents | types.BlobResourceContents

# The SDK models each proxy type decodes into; a resource listing mixes resources and templates.
_TARGET_TYPES: Final[dict[CapabilityType, Any]] = {
    "tool": types.Tool,
    "resource": types.Resource | types.ResourceTemplate,
    "prompt": types.Prompt,
}

# Annotation keys the proxy extension adds; none of them has a place in the SDK's Annotations model.
_PROXY_ANNOTATION_KEYS: Final = frozenset(
    {"proxyAction", "proxyType", "proxyPath", "pythonType", "many", "totalCount", "offset", "limit"}
)

_WIRE_RESULT: Final = TypeAdapter(dict[str, Any])
_RESOURCE_CONTENTS: Final = TypeAdapter(ResourceContents)


class ProxyToolError(Exception):
    """The proxy tool answered with an error result, for example for an unknown name."""


class ProxyResponseError(ValueError):
    """The proxy tool's answer is not shaped the way the proxy extension specifies."""


@dataclass(frozen=True, slots=True)
class ProxyResponseInfo:
    """What the annotations of a proxy answer say about it."""

    proxy_action: str | None = None
    proxy_type: str | None = None
    proxy_path: str | None = None
    python_type: str | None = None
    many: bool = False
    total_count: int | None = None
    offset: int | None = None
    limit: int | None = None

    @classmethod
    def from_annotations(cls, annotations: Mapping[str, Any] | None) -> ProxyResponseInfo:
        """Read the proxy keys of one content item's annotations; absent or mistyped keys read as unset."""
        annotations = annotations or {}

        def text(key: str) -> str | None:
            value = annotations.get(key)
            return value if isinstance(value, str) else None

        def integer(key: str) -> int | None:
            value = annotations.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        return cls(
            proxy_action=text("proxyAction"),
            proxy_type=text("proxyType"),
            proxy_path=text("proxyPath"),
            python_type=text("pythonType"),
            many=annotations.get("many") is True,
            total_count=integer("totalCount"),
            offset=integer("offset"),
            limit=integer("limit"),
        )


@dataclass(frozen=True, slots=True)
class ProxyResponse:
    """One answer of the proxy tool: its content as received, what it says about itself, its decoded value.

    `value` is a list of `Tool`, `Resource | ResourceTemplate` or `Prompt` for 'list', one of them
    for 'info', and for 'call' a `CallToolResult`, a list of resource contents or a `GetPromptResult`.
    """

    content: list[dict[str, Any]]
    info: ProxyResponseInfo
    value: Any


def get_embedded_resource_python_object(item: Mapping[str, Any], **check: Any) -> tuple[str, str, bool] | None:
    """Return `(pythonType, JSON text, many)` of a type-annotated JSON embedded resource, else None.

    Keyword arguments are annotation values the item must carry, e.g. `proxyType="prompt"`.
    """
    annotations = item.get("annotations") or {}
    python_type = annotations.get("pythonType")
    if not isinstance(python_type, str) or not python_type:
        return None
    if any(annotations.get(key) != value for key, value in check.items()):
        return None
    text = _json_text(item)
    if text is None:
        return None
    return python_type, text, annotations.get("many") is True


def deserialize_embedded_resource_python_object(
    target_type: Any, python_type: str, json_data: str, *, many: bool = False
) -> Any:
    """Validate JSON data into the SDK type that `python_type` names, or None if `target_type` lacks it.

    `target_type` is a model class or a union of them; `python_type` may be a simple name
    (`Tool`), a qualified one (`mcp.types.Tool`) or a union (`Resource | ResourceTemplate`).
    Raises `pydantic.ValidationError` when the JSON does not fit the type.
    """
    members = {member.__name__: member for member in _members(target_type)}
    named = _type_names(python_type)
    if not named or not named <= members.keys():
        return None
    adapter = _adapter(tuple(members[name] for name in sorted(named)), many)
    return adapter.validate_json(json_data, by_name=False)


def tool_result_as_resource_result(item: Mapping[str, Any]) -> ResourceContents | None:
    """Return the original resource contents of one proxied resource-read item, else None.

    An objectified resource gets its original MIME type back from `contentType`. An item whose
    annotations name another proxy type is not a resource result; one without annotations is taken
    as one, because some MCP server SDKs drop annotation keys they do not know.
    """
    if item.get("type") != "resource" or not isinstance(item.get("resource"), Mapping):
        return None
    proxy_type = (item.get("annotations") or {}).get("proxyType")
    if proxy_type not in (None, "resource"):
        return None
    resource = dict(item["resource"])
    content_type = resource.pop("contentType", None)
    if isinstance(content_type, str):
        resource["mimeType"] = content_type
    return _RESOURCE_CONTENTS.validate_python(resource, by_name=False)


def tool_result_as_prompt_result(item: Mapping[str, Any]) -> types.GetPromptResult | None:
    """Return the `GetPromptResult` wrapped in one proxied prompt item, else None."""
    found = get_embedded_resource_python_object(item, proxyType="prompt")
    if found is None or found[2]:
        return None
    python_type, json_data, _ = found
    return deserialize_embedded_resource_python_object(types.GetPromptResult, python_type, json_data)


class ProxyClient:
    """A view of a connected `mcp.Client` that reaches capabilities through the server's proxy tool.

    With `transparent=False` the list/call/read/get methods use the native MCP requests and
    return the same types, so code can switch modes without other changes.
    """

    def __init__(self, client: Client, *, transparent: bool = False, proxy_tool_name: str = PROXY_TOOL_NAME) -> None:
        self._client = client
        self._transparent = transparent
        self._proxy_tool_name = proxy_tool_name

    @property
    def client(self) -> Client:
        """The wrapped MCP client."""
        return self._client

    @property
    def transparent(self) -> bool:
        """Whether the list/call/read/get methods go through the proxy tool."""
        return self._transparent

    async def proxy(
        self,
        action: Action,
        type: CapabilityType,
        path: str | None = None,
        args: dict[str, Any] | str | None = None,
        limit: int | None = None,
        offset: int | None = None,
        filter_server: str | None = None,
        *,
        read_timeout_seconds: float | None = None,
        progress_callback: ProgressFnT | None = None,
    ) -> ProxyResponse:
        """Call the proxy tool and decode its answer.

        Arguments the proxy tool would reject raise `ProxyError` before anything is sent. An error
        result raises `ProxyToolError`, except for tool calls, whose error results are the tool's
        own answer and come back as a `CallToolResult` with `is_error` set.
        """
        given = {
            "action": action,
            "type": type,
            "path": path,
            "args": args,
            "limit": limit,
            "offset": offset,
            "filter_server": filter_server,
        }
        arguments = {key: value for key, value in given.items() if value is not None}
        request = parse_proxy_arguments(arguments)
        # Not `Client.call_tool`: its CallToolResult model drops the annotation keys it does not
        # know (proxyAction, pythonType, ...) and the resource's `contentType`, which are the
        # whole point here. The session's typed request path still validates the wire result.
        raw = await self._client.session.send_request(
            types.CallToolRequest(params=types.CallToolRequestParams(name=self._proxy_tool_name, arguments=arguments)),
            _WIRE_RESULT,
            request_read_timeout_seconds=read_timeout_seconds,
            progress_callback=progress_callback,
        )
        return _decode(request, raw)

    async def list_tools(self) -> list[types.Tool]:
        """Every tool the server offers."""
        if self._transparent:
            return await self._list_through_proxy("tool")
        tools: list[types.Tool] = []
        cursor: str | None = None
        while True:
            page = await self._client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            if (cursor := page.next_cursor) is None:
                return tools

    async def list_resources(self) -> list[types.Resource | types.ResourceTemplate]:
        """Every resource and resource template, in one list as the proxy tool lists them."""
        if self._transparent:
            return await self._list_through_proxy("resource")
        found: list[types.Resource | types.ResourceTemplate] = []
        cursor: str | None = None
        while True:
            page = await self._client.list_resources(cursor=cursor)
            found.extend(page.resources)
            if (cursor := page.next_cursor) is None:
                break
        while True:
            template_page = await self._client.list_resource_templates(cursor=cursor)
            found.extend(template_page.resource_templates)
            if (cursor := template_page.next_cursor) is None:
                return found

    async def list_prompts(self) -> list[types.Prompt]:
        """Every prompt the server offers."""
        if self._transparent:
            return await self._list_through_proxy("prompt")
        prompts: list[types.Prompt] = []
        cursor: str | None = None
        while True:
            page = await self._client.list_prompts(cursor=cursor)
            prompts.extend(page.prompts)
            if (cursor := page.next_cursor) is None:
                return prompts

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        read_timeout_seconds: float | None = None,
        progress_callback: ProgressFnT | None = None,
    ) -> types.CallToolResult:
        """Call a tool; its failures come back as a result with `is_error` set, as natively."""
        if not self._transparent:
            return await self._client.call_tool(
                name,
                arguments,
                read_timeout_seconds=read_timeout_seconds,
                progress_callback=progress_callback,
            )
        response = await self.proxy(
            "call",
            "tool",
            name,
            arguments,
            read_timeout_seconds=read_timeout_seconds,
            progress_callback=progress_callback,
        )
        return response.value

    async def read_resource(self, uri: str) -> list[ResourceContents]:
        """Read a resource and return its contents."""
        if not self._transparent:
            return list((await self._client.read_resource(uri)).contents)
        return (await self.proxy("call", "resource", uri)).value

    async def get_prompt(self, name: str, arguments: dict[str, str] | None = None) -> types.GetPromptResult:
        """Get a prompt filled in with `arguments`."""
        if not self._transparent:
            return await self._client.get_prompt(name, arguments)
        return (await self.proxy("call", "prompt", name, arguments)).value

    async def _list_through_proxy(self, capability_type: CapabilityType) -> list[Any]:
        # The proxy pages its listings (100 items unless asked for more), while the native methods
        # return everything, so walk the pages until `totalCount` items have come.
        items: list[Any] = []
        while True:
            response = await self.proxy("list", capability_type, limit=MAX_LIMIT, offset=len(items))
            page = response.value
            items.extend(page)
            total = response.info.total_count
            if not page or (len(items) >= total if total is not None else len(page) < MAX_LIMIT):
                return items


def _decode(request: ProxyRequest, raw: dict[str, Any]) -> ProxyResponse:
    result_type = raw.get("resultType", "complete")
    if result_type != "complete":
        raise ProxyResponseError(f"The proxy tool answered with a {result_type!r} result; only 'complete' is supported")
    content = raw.get("content")
    if not isinstance(content, list) or not all(isinstance(item, dict) for item in content):
        raise ProxyResponseError("The proxy tool's answer has no list of content items")

    annotated = ProxyResponseInfo.from_annotations(content[0].get("annotations") if content else None)
    # Servers built on SDKs that drop unknown annotation keys still answer in the same shape;
    # what the request asked for stands in for the missing action, type and path.
    info = ProxyResponseInfo(
        proxy_action=annotated.proxy_action or request.action,
        proxy_type=annotated.proxy_type or request.type,
        proxy_path=annotated.proxy_path or request.path,
        python_type=annotated.python_type,
        many=annotated.many or request.action == "list",
        total_count=annotated.total_count,
        offset=annotated.offset,
        limit=annotated.limit,
    )

    if request.action == "call" and request.type == "tool":
        return ProxyResponse(content, info, _native_tool_result(raw, content))
    if raw.get("isError") is True:
        messages = [item["text"] for item in content if isinstance(item.get("text"), str)]
        raise ProxyToolError("\n".join(messages) or "The proxy tool reported an error")

    try:
        if request.action == "call" and request.type == "resource":
            value: Any = [_resource_contents(item) for item in content]
        elif request.action == "call":
            value = _decode_json_item(_single(content), types.GetPromptResult, "GetPromptResult", many=False)
        elif request.action == "list" and not content:
            # Magg answers an empty listing with no content at all rather than an empty JSON list.
            value = []
        else:
            value = _decode_json_item(
                _single(content),
                _TARGET_TYPES[request.type],
                PYTHON_TYPES[request.type],
                many=request.action == "list",
            )
    except ValidationError as error:
        raise ProxyResponseError(f"The proxy tool's answer does not decode: {error}") from error
    return ProxyResponse(content, info, value)


def _decode_json_item(item: Mapping[str, Any], target_type: Any, default_type: str, *, many: bool) -> Any:
    text = _json_text(item)
    if text is None:
        raise ProxyResponseError("Expected an embedded JSON resource in the proxy tool's answer")
    python_type = (item.get("annotations") or {}).get("pythonType")
    if not isinstance(python_type, str):
        python_type = default_type
    value = deserialize_embedded_resource_python_object(target_type, python_type, text, many=many)
    if value is None:
        raise ProxyResponseError(f"Unexpected pythonType {python_type!r} in the proxy tool's answer")
    return value


def _resource_contents(item: Mapping[str, Any]) -> ResourceContents:
    contents = tool_result_as_resource_result(item)
    if contents is None:
        raise ProxyResponseError("Expected embedded resources in the proxy tool's answer to a resource read")
    return contents


def _native_tool_result(raw: Mapping[str, Any], content: list[dict[str, Any]]) -> types.CallToolResult:
    # Strip the proxy's own annotation keys so the result equals what the tool itself returned.
    cleaned: list[dict[str, Any]] = []
    for item in content:
        upstream = item.get("annotations") or {}
        annotations = {key: value for key, value in upstream.items() if key not in _PROXY_ANNOTATION_KEYS}
        item = {key: value for key, value in item.items() if key != "annotations"}
        if annotations:
            item["annotations"] = annotations
        cleaned.append(item)
    try:
        return types.CallToolResult.model_validate({**raw, "content": cleaned}, by_name=False)
    except ValidationError as error:
        raise ProxyResponseError(f"The proxy tool's answer does not decode: {error}") from error


def _single(content: list[dict[str, Any]]) -> dict[str, Any]:
    if len(content) != 1:
        raise ProxyResponseError(f"Expected one content item in the proxy tool's answer, got {len(content)}")
    return content[0]


def _json_text(item: Mapping[str, Any]) -> str | None:
    resource = item.get("resource")
    if item.get("type") != "resource" or not isinstance(resource, Mapping):
        return None
    text = resource.get("text")
    if resource.get("mimeType") != JSON_MIME_TYPE or not isinstance(text, str):
        return None
    return text


def _members(target_type: Any) -> tuple[type[BaseModel], ...]:
    if isinstance(target_type, UnionType) or getattr(target_type, "__origin__", None) is Union:
        return get_args(target_type)
    return (target_type,)


def _type_names(python_type: str) -> set[str]:
    # "mcp.types.Resource | mcp.types.ResourceTemplate" and "Resource|ResourceTemplate" name the same.
    return {part.strip().rpartition(".")[2] for part in python_type.split("|") if part.strip()}


@functools.cache
def _adapter(models: tuple[type[BaseModel], ...], many: bool) -> TypeAdapter[Any]:
    target: Any = functools.reduce(operator.or_, models)
    return TypeAdapter(list[target] if many else target)
