"""`ProxyClient` against a real in-process MCP server whose `proxy` tool is served by `run_proxy`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextvars import ContextVar
from typing import Any

import mcp_types as types
import pytest
from mcp import Client
from mcp.server.lowlevel import Server

from mcpvisor.client import (
    ProxyClient,
    ProxyResponseInfo,
    ProxyToolError,
    deserialize_embedded_resource_python_object,
    get_embedded_resource_python_object,
    tool_result_as_prompt_result,
    tool_result_as_resource_result,
)
from mcpvisor.frontend.tools.proxy_tool import run_proxy
from mcpvisor.wire.proxy import PROXY_TOOL, PROXY_TOOL_NAME, ProxyError


def tool(name: str) -> dict[str, Any]:
    """Build a tool definition in wire form."""
    return {"name": name, "description": f"The {name} tool", "inputSchema": {"type": "object"}}


class FakeBackend:
    """An in-memory catalog with canned results, recording every request it serves."""

    def __init__(self, tools: list[dict[str, Any]] | None = None) -> None:
        self.tools = tools if tools is not None else [tool("alpha:add"), tool("alpha:fail"), tool("beta:echo")]
        self.resources: list[dict[str, Any]] = [
            {"uri": "config://compact.json", "name": "alpha:compact", "mimeType": "text/plain"},
            {"uri": "config://spaced.json", "name": "alpha:spaced", "mimeType": "text/plain"},
            {"uri": "image://logo.png", "name": "beta:logo", "mimeType": "image/png"},
            {"uriTemplate": "users://{id}", "name": "beta:user"},
        ]
        self.contents: dict[str, list[dict[str, Any]]] = {
            "config://compact.json": [
                {"uri": "config://compact.json", "mimeType": "text/plain", "text": '{"theme":"dark"}'}
            ],
            "config://spaced.json": [
                {"uri": "config://spaced.json", "mimeType": "text/plain", "text": '{ "theme": "dark" }'}
            ],
            "image://logo.png": [{"uri": "image://logo.png", "mimeType": "image/png", "blob": "iVBORw0KGgo="}],
        }
        self.prompts: list[dict[str, Any]] = [
            {"name": "alpha:greet", "description": "Greet someone", "arguments": [{"name": "who"}]}
        ]
        self.requests: list[tuple[Any, ...]] = []

    async def list_tools(self) -> list[dict[str, Any]]:
        self.requests.append(("list_tools",))
        return self.tools

    async def list_resources(self) -> list[dict[str, Any]]:
        self.requests.append(("list_resources",))
        return self.resources

    async def list_prompts(self) -> list[dict[str, Any]]:
        self.requests.append(("list_prompts",))
        return self.prompts

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(("call_tool", name, arguments))
        if name == "alpha:add":
            total = arguments["a"] + arguments["b"]
            return {
                "content": [{"type": "text", "text": str(total), "annotations": {"audience": ["user"]}}],
                "structuredContent": {"sum": total},
            }
        if name == "alpha:fail":
            return {"content": [{"type": "text", "text": "disk full"}], "isError": True}
        if name == "beta:echo":
            return {"content": [{"type": "text", "text": json.dumps(arguments)}]}
        raise ProxyError(f"Unknown tool '{name}'")

    async def read_resource(self, uri: str) -> dict[str, Any]:
        self.requests.append(("read_resource", uri))
        if uri not in self.contents:
            raise ProxyError(f"Unknown resource '{uri}'")
        return {"contents": self.contents[uri]}

    async def get_prompt(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(("get_prompt", name, arguments))
        if name != "alpha:greet":
            raise ProxyError(f"Unknown prompt '{name}'")
        message = {"role": "user", "content": {"type": "text", "text": f"Say hello to {arguments['who']}"}}
        return {"description": "Greet someone", "messages": [message]}


# The SDK's server checks every result against the negotiated revision's schema and drops the keys
# that schema does not name, among them the proxy's annotations and `contentType`. mcpvisor's engine
# passes a result's content through as it is: `KeepUnsieved` makes this stand-in server do the same.
_kept: ContextVar[dict[str, Any] | None] = ContextVar("_kept", default=None)


def keep(result: dict[str, Any]) -> dict[str, Any]:
    """Note `result` as what this request answers, as mcpvisor sends it."""
    if (slot := _kept.get()) is not None:
        slot["result"] = result
    return result


class KeepUnsieved:
    """Server middleware: after the SDK's check, put back the values of a result noted with `keep`."""

    async def __call__(self, ctx: Any, call_next: Any) -> Any:
        slot: dict[str, Any] = {}
        token = _kept.set(slot)
        try:
            checked = await call_next(ctx)
        finally:
            _kept.reset(token)
        original = slot.get("result")
        if original is None or not isinstance(checked, dict):
            return checked
        return {key: (value if key == "_meta" else original.get(key, value)) for key, value in checked.items()}


def build_server(
    backend: FakeBackend, *, keep_annotations: bool = True, proxy_tool_name: str = PROXY_TOOL_NAME
) -> Server[Any]:
    """An MCP server offering the backend's catalog natively and through the proxy tool."""
    proxy_tool = types.Tool.model_validate({**PROXY_TOOL, "name": proxy_tool_name}, by_name=False)

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        catalog = [types.Tool.model_validate(each, by_name=False) for each in await backend.list_tools()]
        return types.ListToolsResult(tools=[proxy_tool, *catalog])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> Any:
        if params.name == proxy_tool_name:
            return keep(await run_proxy(backend, params.arguments))
        try:
            called = await backend.call_tool(params.name, params.arguments or {})
        except ProxyError as error:
            return types.CallToolResult(content=[types.TextContent(text=error.message)], is_error=True)
        return types.CallToolResult.model_validate(called, by_name=False)

    async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
        listed = [each for each in await backend.list_resources() if "uri" in each]
        return types.ListResourcesResult(resources=[types.Resource.model_validate(each) for each in listed])

    async def list_resource_templates(ctx: Any, params: Any) -> types.ListResourceTemplatesResult:
        listed = [each for each in await backend.list_resources() if "uriTemplate" in each]
        templates = [types.ResourceTemplate.model_validate(each, by_name=False) for each in listed]
        return types.ListResourceTemplatesResult(resource_templates=templates)

    async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        return types.ReadResourceResult.model_validate(await backend.read_resource(params.uri), by_name=False)

    async def list_prompts(ctx: Any, params: Any) -> types.ListPromptsResult:
        prompts = [types.Prompt.model_validate(each, by_name=False) for each in await backend.list_prompts()]
        return types.ListPromptsResult(prompts=prompts)

    async def get_prompt(ctx: Any, params: types.GetPromptRequestParams) -> types.GetPromptResult:
        prompt = await backend.get_prompt(params.name, params.arguments or {})
        return types.GetPromptResult.model_validate(prompt, by_name=False)

    server: Server[Any] = Server(
        "proxy-test",
        version="1.0",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_resource_templates,
        on_read_resource=read_resource,
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
    )
    if keep_annotations:
        server.middleware.append(KeepUnsieved())
    return server


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


# "auto" connects in-process on the 2026-07-28 per-request path, "legacy" through the initialize
# handshake and JSON-RPC framing of the 2025-11-25 era.
@pytest.fixture(params=["auto", "legacy"])
async def client(request: pytest.FixtureRequest, backend: FakeBackend) -> AsyncIterator[Client]:
    async with Client(build_server(backend), mode=request.param) as connected:
        yield connected


@pytest.fixture(params=["auto", "legacy"])
async def sieved_client(request: pytest.FixtureRequest, backend: FakeBackend) -> AsyncIterator[Client]:
    """A client of a server that lets the SDK drop the proxy's annotations."""
    async with Client(build_server(backend, keep_annotations=False), mode=request.param) as connected:
        yield connected


# --- proxy(): raw content and decoded values -------------------------------------------------


async def test_proxy_list_decodes_sdk_tools_and_reports_pagination(client: Client, backend: FakeBackend) -> None:
    response = await ProxyClient(client).proxy("list", "tool")

    assert response.value == [types.Tool.model_validate(each, by_name=False) for each in backend.tools]
    assert response.info == ProxyResponseInfo(
        proxy_action="list",
        proxy_type="tool",
        python_type="Tool",
        many=True,
        total_count=3,
        offset=0,
        limit=100,
    )
    [item] = response.content
    assert item["resource"]["uri"] == "proxy:list/tool"
    assert item["annotations"]["pythonType"] == "Tool"


async def test_proxy_list_pages_and_filters_on_the_server(client: Client) -> None:
    response = await ProxyClient(client).proxy("list", "tool", limit=1, offset=1, filter_server="alpha:")

    assert [each.name for each in response.value] == ["alpha:fail"]
    assert (response.info.total_count, response.info.offset, response.info.limit) == (2, 1, 1)


async def test_proxy_list_resources_mixes_resources_and_templates(client: Client) -> None:
    response = await ProxyClient(client).proxy("list", "resource")

    assert [type(each) for each in response.value] == [types.Resource] * 3 + [types.ResourceTemplate]
    assert response.info.python_type == "Resource | ResourceTemplate"


async def test_proxy_info_decodes_one_object_of_the_annotated_type(client: Client) -> None:
    response = await ProxyClient(client).proxy("info", "resource", "users://{id}")

    assert response.value == types.ResourceTemplate(uri_template="users://{id}", name="beta:user")
    assert response.info.proxy_path == "users://{id}"
    assert (response.info.python_type, response.info.many) == ("ResourceTemplate", False)


async def test_proxy_call_tool_returns_the_tools_own_result(client: Client, backend: FakeBackend) -> None:
    response = await ProxyClient(client).proxy("call", "tool", "alpha:add", {"a": 5, "b": 3})

    assert response.content[0]["annotations"] == {
        "audience": ["user"],
        "proxyType": "tool",
        "proxyAction": "call",
        "proxyPath": "alpha:add",
    }
    result = response.value
    assert isinstance(result, types.CallToolResult)
    assert result.content == [types.TextContent(text="8", annotations=types.Annotations(audience=["user"]))]
    assert result.structured_content == {"sum": 8}
    assert result.is_error is False
    assert backend.requests == [("call_tool", "alpha:add", {"a": 5, "b": 3})]


async def test_proxy_sends_args_given_as_a_json_string(client: Client, backend: FakeBackend) -> None:
    response = await ProxyClient(client).proxy("call", "tool", "beta:echo", '{"x": [1, 2]}')

    assert response.value.content[0].text == '{"x": [1, 2]}'
    assert backend.requests == [("call_tool", "beta:echo", {"x": [1, 2]})]


async def test_proxy_read_shows_the_objectified_resource_and_decodes_the_original_type(
    client: Client,
) -> None:
    response = await ProxyClient(client).proxy("call", "resource", "config://spaced.json")

    [item] = response.content
    assert item["resource"] == {
        "uri": "config://spaced.json",
        "mimeType": "application/json",
        "text": '{"theme":"dark"}',
        "contentType": "text/plain",
    }
    assert response.value == [
        types.TextResourceContents(uri="config://spaced.json", mime_type="text/plain", text='{"theme":"dark"}')
    ]


async def test_proxy_get_prompt_unwraps_the_prompt_result(client: Client) -> None:
    response = await ProxyClient(client).proxy("call", "prompt", "alpha:greet", {"who": "Alice"})

    assert response.info.python_type == "GetPromptResult"
    assert isinstance(response.value, types.GetPromptResult)
    assert response.value.messages == [
        types.PromptMessage(role="user", content=types.TextContent(text="Say hello to Alice"))
    ]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (("info", "tool", "nope"), "Tool 'nope' not found"),
        (("call", "resource", "nope://x"), "Unknown resource 'nope://x'"),
        (("call", "prompt", "nope"), "Unknown prompt 'nope'"),
    ],
)
async def test_proxy_error_results_raise_with_the_servers_message(
    client: Client, arguments: tuple[Any, ...], message: str
) -> None:
    with pytest.raises(ProxyToolError) as raised:
        await ProxyClient(client).proxy(*arguments)

    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            {"action": "list", "type": "tool", "path": "alpha:add"},
            "Parameter 'path' should not be provided for action 'list'",
        ),
        ({"action": "info", "type": "tool"}, "Parameter 'path' is required for action 'info'"),
        (
            {"action": "list", "type": "tool", "limit": 5000},
            "Parameter 'limit' must be an integer from 1 to 1000",
        ),
        (
            {"action": "update", "type": "tool"},
            "Invalid proxy action 'update'. Supported actions are 'list', 'info', and 'call'.",
        ),
    ],
)
async def test_proxy_rejects_invalid_arguments_before_sending(
    client: Client, backend: FakeBackend, arguments: dict[str, Any], message: str
) -> None:
    with pytest.raises(ProxyError) as raised:
        await ProxyClient(client).proxy(**arguments)

    assert raised.value.message == message
    assert backend.requests == []


async def test_proxy_uses_the_configured_tool_name(backend: FakeBackend) -> None:
    async with Client(build_server(backend, proxy_tool_name="mcp:proxy")) as connected:
        response = await ProxyClient(connected, proxy_tool_name="mcp:proxy").proxy("list", "prompt")
        with pytest.raises(ProxyToolError, match="Unknown tool 'proxy'"):
            await ProxyClient(connected).proxy("list", "prompt")

    assert [each.name for each in response.value] == ["alpha:greet"]


# --- transparent mode ------------------------------------------------------------------------


async def test_transparent_and_native_modes_answer_alike(client: Client) -> None:
    through_proxy = ProxyClient(client, transparent=True)
    native = ProxyClient(client, transparent=False)

    native_tools = [each for each in await native.list_tools() if each.name != PROXY_TOOL_NAME]
    assert await through_proxy.list_tools() == native_tools
    assert await through_proxy.list_resources() == await native.list_resources()
    assert await through_proxy.list_prompts() == await native.list_prompts()
    for uri in ("config://compact.json", "image://logo.png"):
        assert await through_proxy.read_resource(uri) == await native.read_resource(uri)
    for name, arguments in (("alpha:add", {"a": 1, "b": 2}), ("alpha:fail", {}), ("gamma:nope", {})):
        by_proxy, directly = (
            await through_proxy.call_tool(name, arguments),
            await native.call_tool(name, arguments),
        )
        assert (by_proxy.content, by_proxy.structured_content, by_proxy.is_error) == (
            directly.content,
            directly.structured_content,
            directly.is_error,
        )
    by_proxy_prompt = await through_proxy.get_prompt("alpha:greet", {"who": "Bob"})
    direct_prompt = await native.get_prompt("alpha:greet", {"who": "Bob"})
    assert (by_proxy_prompt.description, by_proxy_prompt.messages) == (
        direct_prompt.description,
        direct_prompt.messages,
    )


async def test_transparent_mode_goes_through_the_proxy_tool_only(client: Client, backend: FakeBackend) -> None:
    transparent = ProxyClient(client, transparent=True)

    await transparent.list_resources()
    await transparent.call_tool("beta:echo", {"k": "v"})
    await transparent.get_prompt("alpha:greet", {"who": "Eve"})

    assert backend.requests == [
        ("list_resources",),
        ("call_tool", "beta:echo", {"k": "v"}),
        ("get_prompt", "alpha:greet", {"who": "Eve"}),
    ]


async def test_transparent_call_tool_reports_failures_as_error_results(client: Client) -> None:
    transparent = ProxyClient(client, transparent=True)

    failed = await transparent.call_tool("alpha:fail")
    unknown = await transparent.call_tool("gamma:nope", {"x": 1})

    assert (failed.is_error, failed.content) == (True, [types.TextContent(text="disk full")])
    assert (unknown.is_error, unknown.content) == (
        True,
        [types.TextContent(text="Unknown tool 'gamma:nope'")],
    )


async def test_transparent_read_restores_the_original_mime_type(client: Client) -> None:
    contents = await ProxyClient(client, transparent=True).read_resource("config://spaced.json")

    assert contents == [
        types.TextResourceContents(uri="config://spaced.json", mime_type="text/plain", text='{"theme":"dark"}')
    ]


async def test_transparent_read_of_an_unknown_resource_raises(client: Client) -> None:
    with pytest.raises(ProxyToolError, match="Unknown resource 'nope://x'"):
        await ProxyClient(client, transparent=True).read_resource("nope://x")


async def test_transparent_listing_walks_every_page() -> None:
    backend = FakeBackend(tools=[tool(f"s{index // 1000}:tool{index:04}") for index in range(2345)])
    async with Client(build_server(backend)) as connected:
        tools = await ProxyClient(connected, transparent=True).list_tools()

    assert [each.name for each in tools] == [each["name"] for each in backend.tools]
    assert backend.requests == [("list_tools",)] * 3


# --- servers that drop the proxy annotations -------------------------------------------------


async def test_without_annotations_query_answers_still_decode(sieved_client: Client) -> None:
    proxy = ProxyClient(sieved_client)

    listing = await proxy.proxy("list", "resource", limit=2)
    info = await proxy.proxy("info", "tool", "alpha:add")

    assert [each.name for each in listing.value] == ["alpha:compact", "alpha:spaced"]
    assert listing.info == ProxyResponseInfo(proxy_action="list", proxy_type="resource", many=True)
    assert info.value == types.Tool.model_validate(tool("alpha:add"), by_name=False)
    assert info.info.proxy_path == "alpha:add"
    assert info.content[0]["annotations"] == {}


async def test_without_annotations_transparent_mode_still_works(sieved_client: Client) -> None:
    transparent = ProxyClient(sieved_client, transparent=True)

    assert [each.name for each in await transparent.list_prompts()] == ["alpha:greet"]
    assert (await transparent.call_tool("alpha:add", {"a": 2, "b": 2})).structured_content == {"sum": 4}
    prompt = await transparent.get_prompt("alpha:greet", {"who": "Ann"})
    assert prompt.messages[0].content == types.TextContent(text="Say hello to Ann")
    # The original MIME type travels in `contentType`, which such servers drop as well.
    [contents] = await transparent.read_resource("config://spaced.json")
    assert (contents.mime_type, contents.text) == ("application/json", '{"theme":"dark"}')


async def test_without_annotations_listing_walks_pages_by_their_size() -> None:
    backend = FakeBackend(tools=[tool(f"s:tool{index:04}") for index in range(1500)])
    async with Client(build_server(backend, keep_annotations=False)) as connected:
        tools = await ProxyClient(connected, transparent=True).list_tools()

    assert len(tools) == 1500
    assert backend.requests == [("list_tools",)] * 2


async def test_an_empty_answer_to_a_listing_is_an_empty_list() -> None:
    # Magg answers an empty listing with no content at all.
    async def empty_answer(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        return types.CallToolResult(content=[])

    async with Client(Server("magg-like", on_call_tool=empty_answer)) as connected:
        assert await ProxyClient(connected, transparent=True).list_prompts() == []


# --- transform utilities ---------------------------------------------------------------------

PROMPT_ITEM: dict[str, Any] = {
    "type": "resource",
    "resource": {
        "uri": "proxy:alpha:greet",
        "mimeType": "application/json",
        "text": '{"messages":[{"role":"user","content":{"type":"text","text":"hi"}}]}',
    },
    "annotations": {
        "proxyType": "prompt",
        "proxyAction": "call",
        "proxyPath": "alpha:greet",
        "pythonType": "GetPromptResult",
    },
}


def test_get_embedded_resource_python_object_checks_the_annotations() -> None:
    assert get_embedded_resource_python_object(PROMPT_ITEM, proxyType="prompt") == (
        "GetPromptResult",
        PROMPT_ITEM["resource"]["text"],
        False,
    )
    assert get_embedded_resource_python_object(PROMPT_ITEM, proxyType="tool") is None
    untyped = {**PROMPT_ITEM, "annotations": {"proxyType": "prompt"}}
    assert get_embedded_resource_python_object(untyped) is None
    not_json = {**PROMPT_ITEM, "resource": {**PROMPT_ITEM["resource"], "mimeType": "text/plain"}}
    assert get_embedded_resource_python_object(not_json) is None


@pytest.mark.parametrize("python_type", ["Tool", "mcp.types.Tool", "mcp_types.Tool"])
def test_deserialize_accepts_simple_and_qualified_type_names(python_type: str) -> None:
    decoded = deserialize_embedded_resource_python_object(types.Tool, python_type, json.dumps([tool("a:b")]), many=True)

    assert decoded == [types.Tool(name="a:b", description="The a:b tool", input_schema={"type": "object"})]


def test_deserialize_reads_unions_written_either_way() -> None:
    listing = json.dumps([{"uri": "a://b", "name": "b"}, {"uriTemplate": "a://{c}", "name": "c"}])
    target = types.Resource | types.ResourceTemplate

    spaced = deserialize_embedded_resource_python_object(target, "Resource | ResourceTemplate", listing, many=True)
    packed = deserialize_embedded_resource_python_object(target, "Resource|ResourceTemplate", listing, many=True)

    assert spaced == packed
    assert [type(each) for each in spaced] == [types.Resource, types.ResourceTemplate]


def test_deserialize_refuses_a_type_outside_the_target() -> None:
    assert deserialize_embedded_resource_python_object(types.Tool, "Prompt", '{"name": "p"}') is None
    assert deserialize_embedded_resource_python_object(types.Resource, "Resource | ResourceTemplate", "[]") is None


def test_tool_result_as_prompt_result() -> None:
    prompt = tool_result_as_prompt_result(PROMPT_ITEM)

    assert prompt == types.GetPromptResult(
        messages=[types.PromptMessage(role="user", content=types.TextContent(text="hi"))]
    )
    assert tool_result_as_prompt_result({"type": "text", "text": "hi"}) is None
    listing = {**PROMPT_ITEM, "annotations": {**PROMPT_ITEM["annotations"], "many": True}}
    assert tool_result_as_prompt_result(listing) is None


def test_tool_result_as_resource_result_only_takes_resource_items() -> None:
    blob = {
        "type": "resource",
        "resource": {"uri": "image://logo.png", "mimeType": "image/png", "blob": "iVBORw0KGgo="},
        "annotations": {"proxyType": "resource", "proxyAction": "call", "proxyPath": "image://logo.png"},
    }

    assert tool_result_as_resource_result(blob) == types.BlobResourceContents(
        uri="image://logo.png", mime_type="image/png", blob="iVBORw0KGgo="
    )
    assert tool_result_as_resource_result(PROMPT_ITEM) is None
    assert tool_result_as_resource_result({"type": "text", "text": "x"}) is None


def test_response_info_ignores_mistyped_annotations() -> None:
    info = ProxyResponseInfo.from_annotations({"proxyAction": "list", "many": "yes", "totalCount": True, "limit": 5})

    assert info == ProxyResponseInfo(proxy_action="list", many=False, total_count=None, limit=5)
