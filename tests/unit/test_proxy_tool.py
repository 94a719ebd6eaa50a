"""The `proxy` tool's logic: validation, listings, pagination, info, calls and the spec's response shapes."""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types
import pytest
from mcp_types import methods
from pydantic import TypeAdapter

from mcpvisor.frontend.tools.proxy_tool import objectify_resource, run_proxy
from mcpvisor.wire.proxy import PROXY_TOOL, ProxyError, parse_proxy_arguments


def tool(name: str, description: str = "") -> dict[str, Any]:
    """Build a tool definition in wire form."""
    return {
        "name": name,
        "description": description or f"The {name} tool",
        "inputSchema": {"type": "object", "properties": {"a": {"type": "number"}}},
    }


def text(value: str, **extra: Any) -> dict[str, Any]:
    """Build a text content block in wire form."""
    return {"type": "text", "text": value, **extra}


TOOLS = [tool("alpha:add"), tool("alpha:sub"), tool("beta:echo"), tool("alphabet:spell")]
RESOURCES = [
    {"uri": "config://settings.json", "name": "alpha:settings", "mimeType": "text/plain"},
    {"uri": "file:///notes.txt", "name": "beta:notes", "mimeType": "text/plain"},
    {"uriTemplate": "users://{id}", "name": "beta:user", "mimeType": "application/json"},
]
PROMPTS = [
    {"name": "alpha:greet", "description": "Greet someone", "arguments": [{"name": "who", "required": True}]},
    {"name": "beta:summarize", "description": "Summarize a text"},
]
CONTENTS = {
    "config://settings.json": [
        {"uri": "config://settings.json", "mimeType": "text/plain", "text": '{"theme": "dark", "size": 12}'}
    ],
    "file:///notes.txt": [{"uri": "file:///notes.txt", "mimeType": "text/plain", "text": "hello world"}],
    "image://logo.png": [{"uri": "image://logo.png", "mimeType": "image/png", "blob": "iVBORw0KGgo="}],
    "data://typed.json": [{"uri": "data://typed.json", "mimeType": "application/json", "text": '{ "a": 1 }'}],
    "data://untyped": [{"uri": "data://untyped", "text": "[1, 2]"}],
    "data://nan": [{"uri": "data://nan", "mimeType": "text/plain", "text": "NaN"}],
    "multi://two": [
        {"uri": "multi://two#1", "mimeType": "text/csv", "text": "a,b"},
        {"uri": "multi://two#2", "mimeType": "text/plain", "text": "42", "_meta": {"origin": "beta"}},
    ],
}


class FakeBackend:
    """An in-memory catalog with canned call results, recording every request it serves."""

    def __init__(
        self,
        tools: list[dict[str, Any]] | None = None,
        resources: list[dict[str, Any]] | None = None,
        prompts: list[dict[str, Any]] | None = None,
    ) -> None:
        self.tools = TOOLS if tools is None else tools
        self.resources = RESOURCES if resources is None else resources
        self.prompts = PROMPTS if prompts is None else prompts
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
            return {"content": [text(str(total), annotations={"audience": ["user"], "priority": 0.5})]}
        if name == "beta:echo":
            return {
                "content": [
                    text(json.dumps(arguments)),
                    {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
                ],
                "structuredContent": {"echo": arguments},
                "isError": False,
            }
        if name == "beta:fail":
            return {"content": [text("disk full")], "isError": True}
        raise ProxyError(f"Unknown tool '{name}'")

    async def read_resource(self, uri: str) -> dict[str, Any]:
        self.requests.append(("read_resource", uri))
        if uri not in CONTENTS:
            raise ProxyError(f"Unknown resource '{uri}'")
        return {"contents": CONTENTS[uri]}

    async def get_prompt(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(("get_prompt", name, arguments))
        if name != "alpha:greet":
            raise ProxyError(f"Unknown prompt '{name}'")
        return {
            "description": "Greet someone",
            "messages": [{"role": "user", "content": text(f"Say hello to {arguments['who']}")}],
        }


def single_item(result: dict[str, Any]) -> dict[str, Any]:
    """The one content item of a successful result."""
    assert result["isError"] is False, result
    assert len(result["content"]) == 1
    return result["content"][0]


def embedded_json(item: dict[str, Any]) -> Any:
    """The decoded JSON of an embedded resource after checking its MIME type."""
    assert item["type"] == "resource"
    assert item["resource"]["mimeType"] == "application/json"
    return json.loads(item["resource"]["text"])


def error_text(result: dict[str, Any]) -> str:
    """The message of an error result."""
    assert result["isError"] is True
    assert [item["type"] for item in result["content"]] == ["text"]
    return result["content"][0]["text"]


# --- the tool definition ---------------------------------------------------------------------


def test_tool_definition_names_the_spec_parameters() -> None:
    schema = PROXY_TOOL["inputSchema"]
    assert PROXY_TOOL["name"] == "proxy"
    assert set(schema["properties"]) == {"action", "type", "path", "args", "limit", "offset", "filter_server"}
    assert schema["required"] == ["action", "type"]
    assert schema["properties"]["action"]["enum"] == ["list", "info", "call"]
    assert schema["properties"]["type"]["enum"] == ["tool", "resource", "prompt"]
    assert schema["properties"]["args"]["anyOf"] == [
        {"type": "object", "additionalProperties": True},
        {"type": "string"},
    ]
    limit = schema["properties"]["limit"]
    assert (limit["type"], limit["minimum"], limit["maximum"], limit["default"]) == ("integer", 1, 1000, 100)
    offset = schema["properties"]["offset"]
    assert (offset["type"], offset["minimum"], offset["default"]) == ("integer", 0, 0)


def test_tool_definition_is_a_valid_mcp_tool_with_cautious_hints() -> None:
    parsed = types.Tool.model_validate(PROXY_TOOL, by_name=False)
    assert parsed.model_dump(by_alias=True, mode="json", exclude_none=True) == PROXY_TOOL
    assert parsed.annotations is not None
    assert parsed.annotations.read_only_hint is False
    assert parsed.annotations.destructive_hint is True
    assert parsed.annotations.open_world_hint is True


# --- list ------------------------------------------------------------------------------------


async def test_list_tools_is_one_embedded_json_resource_with_spec_annotations() -> None:
    result = await run_proxy(FakeBackend(), {"action": "list", "type": "tool"})

    item = single_item(result)
    assert item["resource"]["uri"] == "proxy:list/tool"
    assert embedded_json(item) == TOOLS
    assert item["annotations"] == {
        "proxyAction": "list",
        "proxyType": "tool",
        "pythonType": "Tool",
        "many": True,
        "totalCount": 4,
        "offset": 0,
        "limit": 100,
    }


async def test_list_resources_mixes_resources_and_templates() -> None:
    result = await run_proxy(FakeBackend(), {"action": "list", "type": "resource"})

    item = single_item(result)
    assert item["resource"]["uri"] == "proxy:list/resource"
    assert embedded_json(item) == RESOURCES
    assert item["annotations"]["pythonType"] == "Resource | ResourceTemplate"
    assert item["annotations"]["many"] is True
    decoded = TypeAdapter(list[types.Resource | types.ResourceTemplate]).validate_json(item["resource"]["text"])
    assert [type(each) for each in decoded] == [types.Resource, types.Resource, types.ResourceTemplate]


async def test_list_prompts_decodes_back_into_sdk_prompts() -> None:
    result = await run_proxy(FakeBackend(), {"action": "list", "type": "prompt"})

    item = single_item(result)
    assert item["annotations"]["pythonType"] == "Prompt"
    decoded = TypeAdapter(list[types.Prompt]).validate_json(item["resource"]["text"])
    assert [prompt.name for prompt in decoded] == ["alpha:greet", "beta:summarize"]
    assert decoded[0].arguments is not None and decoded[0].arguments[0].required is True


async def test_empty_listing_is_an_empty_json_list() -> None:
    result = await run_proxy(FakeBackend(tools=[]), {"action": "list", "type": "tool"})

    item = single_item(result)
    assert embedded_json(item) == []
    assert item["annotations"]["totalCount"] == 0


async def test_default_page_is_the_first_hundred_of_many() -> None:
    many = [tool(f"s{index // 100}:tool{index:03}") for index in range(250)]
    result = await run_proxy(FakeBackend(tools=many), {"action": "list", "type": "tool"})

    item = single_item(result)
    assert [each["name"] for each in embedded_json(item)] == [each["name"] for each in many[:100]]
    assert (
        item["annotations"]["totalCount"],
        item["annotations"]["offset"],
        item["annotations"]["limit"],
    ) == (
        250,
        0,
        100,
    )


@pytest.mark.parametrize(
    ("limit", "offset", "expected"),
    [
        (50, 50, range(50, 100)),
        (1000, 0, range(250)),
        (1, 249, range(249, 250)),
        (10, 250, range(0)),
        (7, 0, range(7)),
    ],
)
async def test_limit_and_offset_select_a_page(limit: int, offset: int, expected: range) -> None:
    many = [tool(f"s:tool{index:03}") for index in range(250)]
    arguments = {"action": "list", "type": "tool", "limit": limit, "offset": offset}
    result = await run_proxy(FakeBackend(tools=many), arguments)

    item = single_item(result)
    assert [each["name"] for each in embedded_json(item)] == [f"s:tool{index:03}" for index in expected]
    assert item["annotations"]["totalCount"] == 250
    assert (item["annotations"]["offset"], item["annotations"]["limit"]) == (offset, limit)


async def test_integral_float_limit_counts_as_an_integer() -> None:
    result = await run_proxy(FakeBackend(), {"action": "list", "type": "tool", "limit": 2.0})

    item = single_item(result)
    assert len(embedded_json(item)) == 2
    assert item["annotations"]["limit"] == 2
    assert type(item["annotations"]["limit"]) is int


@pytest.mark.parametrize(
    ("prefix", "names"),
    [
        ("alpha:", ["alpha:add", "alpha:sub"]),
        ("alpha", ["alpha:add", "alpha:sub", "alphabet:spell"]),
        ("beta:", ["beta:echo"]),
        ("gamma:", []),
    ],
)
async def test_filter_server_keeps_names_with_the_prefix(prefix: str, names: list[str]) -> None:
    result = await run_proxy(FakeBackend(), {"action": "list", "type": "tool", "filter_server": prefix})

    item = single_item(result)
    assert [each["name"] for each in embedded_json(item)] == names
    assert item["annotations"]["totalCount"] == len(names)


async def test_filter_server_matches_only_at_the_start_of_the_name() -> None:
    backend = FakeBackend(tools=[tool("beta:from_alpha:copy"), tool("alpha:copy")])
    result = await run_proxy(backend, {"action": "list", "type": "tool", "filter_server": "alpha:"})

    assert [each["name"] for each in embedded_json(single_item(result))] == ["alpha:copy"]


async def test_filter_server_then_pagination_counts_the_filtered_items() -> None:
    many = [tool(f"{'a' if index % 2 else 'b'}:tool{index:03}") for index in range(40)]
    arguments = {"action": "list", "type": "tool", "filter_server": "a:", "limit": 5, "offset": 10}
    result = await run_proxy(FakeBackend(tools=many), arguments)

    item = single_item(result)
    odd = [f"a:tool{index:03}" for index in range(1, 40, 2)]
    assert [each["name"] for each in embedded_json(item)] == odd[10:15]
    assert item["annotations"]["totalCount"] == 20


async def test_filter_server_applies_to_resources_and_prompts_by_name() -> None:
    resources = await run_proxy(FakeBackend(), {"action": "list", "type": "resource", "filter_server": "beta:"})
    prompts = await run_proxy(FakeBackend(), {"action": "list", "type": "prompt", "filter_server": "alpha:"})

    assert [each["name"] for each in embedded_json(single_item(resources))] == ["beta:notes", "beta:user"]
    assert [each["name"] for each in embedded_json(single_item(prompts))] == ["alpha:greet"]


async def test_list_accepts_explicit_nulls_and_empty_path_and_args() -> None:
    arguments = {"action": "list", "type": "tool", "path": "", "args": {}, "limit": None, "offset": None}
    result = await run_proxy(FakeBackend(), arguments)

    assert single_item(result)["annotations"]["limit"] == 100


# --- info ------------------------------------------------------------------------------------


async def test_info_tool_is_one_object_with_its_path() -> None:
    result = await run_proxy(FakeBackend(), {"action": "info", "type": "tool", "path": "beta:echo"})

    item = single_item(result)
    assert item["resource"]["uri"] == "proxy:info/tool/beta:echo"
    assert embedded_json(item) == tool("beta:echo")
    assert item["annotations"] == {
        "proxyAction": "info",
        "proxyType": "tool",
        "proxyPath": "beta:echo",
        "pythonType": "Tool",
        "many": False,
    }


@pytest.mark.parametrize(
    ("path", "python_type", "expected"),
    [
        ("config://settings.json", "Resource", RESOURCES[0]),
        ("beta:notes", "Resource", RESOURCES[1]),
        ("users://{id}", "ResourceTemplate", RESOURCES[2]),
        ("beta:user", "ResourceTemplate", RESOURCES[2]),
    ],
)
async def test_info_resource_by_uri_template_or_name(path: str, python_type: str, expected: dict[str, Any]) -> None:
    result = await run_proxy(FakeBackend(), {"action": "info", "type": "resource", "path": path})

    item = single_item(result)
    assert embedded_json(item) == expected
    assert item["annotations"]["pythonType"] == python_type
    assert item["annotations"]["proxyPath"] == path


async def test_info_resource_prefers_a_uri_over_an_equal_name() -> None:
    resources = [
        {"uri": "x://other", "name": "x://wanted"},
        {"uri": "x://wanted", "name": "the real one"},
    ]
    result = await run_proxy(
        FakeBackend(resources=resources), {"action": "info", "type": "resource", "path": "x://wanted"}
    )

    assert embedded_json(single_item(result))["name"] == "the real one"


async def test_info_prompt() -> None:
    result = await run_proxy(FakeBackend(), {"action": "info", "type": "prompt", "path": "alpha:greet"})

    item = single_item(result)
    assert embedded_json(item) == PROMPTS[0]
    assert (item["annotations"]["pythonType"], item["annotations"]["many"]) == ("Prompt", False)


@pytest.mark.parametrize(
    ("capability_type", "message"),
    [
        ("tool", "Tool 'nope' not found"),
        ("resource", "Resource 'nope' not found"),
        ("prompt", "Prompt 'nope' not found"),
    ],
)
async def test_info_on_an_unknown_name_is_an_error(capability_type: str, message: str) -> None:
    result = await run_proxy(FakeBackend(), {"action": "info", "type": capability_type, "path": "nope"})

    assert error_text(result) == message


# --- call: tools -----------------------------------------------------------------------------


async def test_call_tool_annotates_every_item_and_keeps_upstream_annotations() -> None:
    backend = FakeBackend()
    arguments = {"action": "call", "type": "tool", "path": "alpha:add", "args": {"a": 5, "b": 3}}
    result = await run_proxy(backend, arguments)

    assert result == {
        "content": [
            {
                "type": "text",
                "text": "8",
                "annotations": {
                    "audience": ["user"],
                    "priority": 0.5,
                    "proxyType": "tool",
                    "proxyAction": "call",
                    "proxyPath": "alpha:add",
                },
            }
        ],
        "isError": False,
        "resultType": "complete",
    }
    assert backend.requests == [("call_tool", "alpha:add", {"a": 5, "b": 3})]


async def test_call_tool_passes_structured_content_and_all_content_types() -> None:
    arguments = {"action": "call", "type": "tool", "path": "beta:echo", "args": {"x": [1, 2]}}
    result = await run_proxy(FakeBackend(), arguments)

    assert result["isError"] is False
    assert result["structuredContent"] == {"echo": {"x": [1, 2]}}
    assert [item["type"] for item in result["content"]] == ["text", "image"]
    image = result["content"][1]
    assert (image["data"], image["mimeType"]) == ("iVBORw0KGgo=", "image/png")
    for item in result["content"]:
        assert item["annotations"] == {"proxyType": "tool", "proxyAction": "call", "proxyPath": "beta:echo"}


async def test_call_tool_keeps_the_tools_error_flag() -> None:
    result = await run_proxy(FakeBackend(), {"action": "call", "type": "tool", "path": "beta:fail"})

    assert result["isError"] is True
    assert result["content"][0]["text"] == "disk full"
    assert result["content"][0]["annotations"]["proxyPath"] == "beta:fail"


async def test_call_tool_with_args_as_a_json_string() -> None:
    backend = FakeBackend()
    arguments = {"action": "call", "type": "tool", "path": "alpha:add", "args": '{"a": 5, "b": 3}'}
    result = await run_proxy(backend, arguments)

    assert result["content"][0]["text"] == "8"
    assert backend.requests == [("call_tool", "alpha:add", {"a": 5, "b": 3})]


@pytest.mark.parametrize("args", [None, {}, ""])
async def test_call_tool_without_args_sends_an_empty_object(args: Any) -> None:
    backend = FakeBackend()
    await run_proxy(backend, {"action": "call", "type": "tool", "path": "beta:echo", "args": args})

    assert backend.requests == [("call_tool", "beta:echo", {})]


async def test_call_of_an_unknown_tool_reports_the_backends_message() -> None:
    result = await run_proxy(FakeBackend(), {"action": "call", "type": "tool", "path": "gamma:nope"})

    assert error_text(result) == "Unknown tool 'gamma:nope'"


async def test_unexpected_backend_failures_are_not_swallowed() -> None:
    class BrokenBackend(FakeBackend):
        async def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
            raise RuntimeError("worker table corrupted")

    with pytest.raises(RuntimeError, match="worker table corrupted"):
        await run_proxy(BrokenBackend(), {"action": "call", "type": "tool", "path": "alpha:add"})


# --- call: resources -------------------------------------------------------------------------


async def test_read_of_a_json_text_resource_is_objectified() -> None:
    backend = FakeBackend()
    result = await run_proxy(backend, {"action": "call", "type": "resource", "path": "config://settings.json"})

    assert single_item(result) == {
        "type": "resource",
        "resource": {
            "uri": "config://settings.json",
            "mimeType": "application/json",
            "text": '{"theme":"dark","size":12}',
            "contentType": "text/plain",
        },
        "annotations": {
            "proxyType": "resource",
            "proxyAction": "call",
            "proxyPath": "config://settings.json",
        },
    }
    assert backend.requests == [("read_resource", "config://settings.json")]


@pytest.mark.parametrize("uri", ["file:///notes.txt", "image://logo.png", "data://typed.json", "data://nan"])
async def test_read_leaves_plain_text_binary_json_typed_and_non_json_resources_alone(uri: str) -> None:
    result = await run_proxy(FakeBackend(), {"action": "call", "type": "resource", "path": uri})

    item = single_item(result)
    assert item["resource"] == CONTENTS[uri][0]
    assert item["annotations"] == {"proxyType": "resource", "proxyAction": "call", "proxyPath": uri}


async def test_read_objectifies_untyped_json_without_inventing_a_content_type() -> None:
    result = await run_proxy(FakeBackend(), {"action": "call", "type": "resource", "path": "data://untyped"})

    assert single_item(result)["resource"] == {
        "uri": "data://untyped",
        "mimeType": "application/json",
        "text": "[1,2]",
    }


async def test_read_with_several_contents_annotates_each() -> None:
    result = await run_proxy(FakeBackend(), {"action": "call", "type": "resource", "path": "multi://two"})

    assert result["isError"] is False
    first, second = result["content"]
    assert first["resource"] == CONTENTS["multi://two"][0]
    assert second["resource"] == {
        "uri": "multi://two#2",
        "mimeType": "application/json",
        "text": "42",
        "contentType": "text/plain",
        "_meta": {"origin": "beta"},
    }
    assert (
        first["annotations"]
        == second["annotations"]
        == {
            "proxyType": "resource",
            "proxyAction": "call",
            "proxyPath": "multi://two",
        }
    )


async def test_read_ignores_args_because_the_uri_says_everything() -> None:
    backend = FakeBackend()
    arguments = {"action": "call", "type": "resource", "path": "file:///notes.txt", "args": {"unused": 1}}
    result = await run_proxy(backend, arguments)

    assert result["isError"] is False
    assert backend.requests == [("read_resource", "file:///notes.txt")]


async def test_read_of_an_unknown_resource_reports_the_backends_message() -> None:
    result = await run_proxy(FakeBackend(), {"action": "call", "type": "resource", "path": "nope://x"})

    assert error_text(result) == "Unknown resource 'nope://x'"


def test_objectify_resource_does_not_touch_its_input() -> None:
    original = {"uri": "a://b", "mimeType": "text/plain", "text": '{"k": "v"}'}
    objectified = objectify_resource(original)

    assert objectified == {
        "uri": "a://b",
        "mimeType": "application/json",
        "text": '{"k":"v"}',
        "contentType": "text/plain",
    }
    assert original == {"uri": "a://b", "mimeType": "text/plain", "text": '{"k": "v"}'}


# --- call: prompts ---------------------------------------------------------------------------


async def test_get_prompt_wraps_the_result_in_one_embedded_resource() -> None:
    backend = FakeBackend()
    arguments = {"action": "call", "type": "prompt", "path": "alpha:greet", "args": {"who": "Alice"}}
    result = await run_proxy(backend, arguments)

    item = single_item(result)
    assert item["resource"]["uri"] == "proxy:alpha:greet"
    assert item["annotations"] == {
        "proxyType": "prompt",
        "proxyAction": "call",
        "proxyPath": "alpha:greet",
        "pythonType": "GetPromptResult",
    }
    prompt = types.GetPromptResult.model_validate_json(item["resource"]["text"], by_name=False)
    assert prompt.description == "Greet someone"
    assert prompt.messages[0].content == types.TextContent(text="Say hello to Alice")
    assert backend.requests == [("get_prompt", "alpha:greet", {"who": "Alice"})]


async def test_get_prompt_sends_non_string_arguments_as_json_text() -> None:
    backend = FakeBackend()
    arguments = {
        "action": "call",
        "type": "prompt",
        "path": "alpha:greet",
        "args": '{"who": 7, "tags": ["a"]}',
    }
    await run_proxy(backend, arguments)

    assert backend.requests == [("get_prompt", "alpha:greet", {"who": "7", "tags": '["a"]'})]


async def test_get_of_an_unknown_prompt_reports_the_backends_message() -> None:
    result = await run_proxy(FakeBackend(), {"action": "call", "type": "prompt", "path": "nope"})

    assert error_text(result) == "Unknown prompt 'nope'"


# --- validation ------------------------------------------------------------------------------

ONLY_FOR_LIST = "Parameters 'limit', 'offset', and 'filter_server' are only allowed for 'list' action"
LIMIT_RANGE = "Parameter 'limit' must be an integer from 1 to 1000"
OFFSET_RANGE = "Parameter 'offset' must be an integer of 0 or more"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "Parameter 'action' is required"),
        ({"type": "tool"}, "Parameter 'action' is required"),
        ({"action": None, "type": "tool"}, "Parameter 'action' is required"),
        ({"action": "list"}, "Parameter 'type' is required"),
        (
            {"action": "delete", "type": "tool"},
            "Invalid proxy action 'delete'. Supported actions are 'list', 'info', and 'call'.",
        ),
        (
            {"action": "list", "type": "server"},
            "Invalid proxy type 'server'. Supported types are 'tool', 'resource', and 'prompt'.",
        ),
        (
            {"action": "list", "a_type": "tool"},
            "Unknown parameter 'a_type'. Allowed parameters are 'action', 'type', 'path', 'args', 'limit', "
            "'offset', and 'filter_server'.",
        ),
        ({"action": "info", "type": "tool"}, "Parameter 'path' is required for action 'info'"),
        ({"action": "call", "type": "tool"}, "Parameter 'path' is required for action 'call'"),
        ({"action": "call", "type": "prompt", "path": ""}, "Parameter 'path' is required for action 'call'"),
        (
            {"action": "list", "type": "tool", "args": {"a": 1}},
            "Parameter 'args' should not be provided for action 'list'",
        ),
        (
            {"action": "list", "type": "tool", "args": "{}"},
            "Parameter 'args' should not be provided for action 'list'",
        ),
        (
            {"action": "info", "type": "tool", "path": "alpha:add", "args": {"a": 1}},
            "Parameter 'args' should not be provided for action 'info'",
        ),
        (
            {"action": "list", "type": "tool", "path": "alpha:add", "args": {"a": 1}},
            "Parameter 'args' should not be provided for action 'list'",
        ),
        (
            {"action": "list", "type": "tool", "path": "alpha:add"},
            "Parameter 'path' should not be provided for action 'list'",
        ),
        ({"action": "info", "type": "tool", "path": "alpha:add", "limit": 5}, ONLY_FOR_LIST),
        ({"action": "info", "type": "tool", "path": "alpha:add", "offset": 0}, ONLY_FOR_LIST),
        ({"action": "info", "type": "tool", "path": "alpha:add", "filter_server": ""}, ONLY_FOR_LIST),
        ({"action": "call", "type": "tool", "path": "alpha:add", "filter_server": "alpha:"}, ONLY_FOR_LIST),
        ({"action": "list", "type": "tool", "limit": 0}, LIMIT_RANGE),
        ({"action": "list", "type": "tool", "limit": 1001}, LIMIT_RANGE),
        ({"action": "list", "type": "tool", "limit": "10"}, LIMIT_RANGE),
        ({"action": "list", "type": "tool", "limit": True}, LIMIT_RANGE),
        ({"action": "list", "type": "tool", "limit": 2.5}, LIMIT_RANGE),
        ({"action": "list", "type": "tool", "offset": -1}, OFFSET_RANGE),
        ({"action": "list", "type": "tool", "offset": "0"}, OFFSET_RANGE),
        (
            {"action": "list", "type": "tool", "filter_server": 5},
            "Parameter 'filter_server' must be a string",
        ),
        ({"action": "info", "type": "tool", "path": 5}, "Parameter 'path' must be a string"),
        (
            {"action": "call", "type": "tool", "path": "alpha:add", "args": 5},
            "Parameter 'args' must be an object or a JSON string",
        ),
        (
            {"action": "call", "type": "tool", "path": "alpha:add", "args": [1]},
            "Parameter 'args' must be an object or a JSON string",
        ),
        (
            {"action": "call", "type": "tool", "path": "alpha:add", "args": "[1, 2]"},
            "Parameter 'args' must encode a JSON object",
        ),
        (
            {"action": "call", "type": "tool", "path": "alpha:add", "args": "{not json"},
            "Parameter 'args' is not valid JSON: Expecting property name enclosed in double quotes: "
            "line 1 column 2 (char 1)",
        ),
        (
            {"action": "call", "type": "tool", "path": "alpha:add", "args": "NaN"},
            "Parameter 'args' is not valid JSON: NaN is not valid JSON",
        ),
    ],
)
async def test_invalid_arguments_give_the_spec_error_and_reach_no_backend(
    arguments: dict[str, Any], message: str
) -> None:
    backend = FakeBackend()
    result = await run_proxy(backend, arguments)

    assert error_text(result) == message
    assert backend.requests == []
    with pytest.raises(ProxyError) as raised:
        parse_proxy_arguments(arguments)
    assert raised.value.message == message


async def test_missing_arguments_object_is_reported_like_an_empty_one() -> None:
    assert error_text(await run_proxy(FakeBackend(), None)) == "Parameter 'action' is required"


# --- wire validity ---------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["2025-06-18", "2025-11-25", "2026-07-28"])
@pytest.mark.parametrize(
    "arguments",
    [
        {"action": "list", "type": "resource"},
        {"action": "info", "type": "prompt", "path": "alpha:greet"},
        {"action": "call", "type": "tool", "path": "beta:echo", "args": {"x": 1}},
        {"action": "call", "type": "resource", "path": "multi://two"},
        {"action": "call", "type": "resource", "path": "image://logo.png"},
        {"action": "call", "type": "prompt", "path": "alpha:greet", "args": {"who": "Bob"}},
        {"action": "call", "type": "tool", "path": "gamma:nope"},
    ],
)
async def test_every_answer_is_a_valid_call_tool_result_on_the_wire(version: str, arguments: dict[str, Any]) -> None:
    result = await run_proxy(FakeBackend(), arguments)

    # Raises if the result does not validate against that protocol revision's CallToolResult.
    sieved = methods.serialize_server_result("tools/call", version, result)
    assert len(sieved["content"]) == len(result["content"])
