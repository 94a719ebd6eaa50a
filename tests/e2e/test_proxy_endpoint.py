"""The `proxy` tool on `/mcp`, end to end: every action and type, pagination, validation, ProxyClient.

Given a stack with two echo upstreams and a quarantined one, a real SDK client (both protocol eras)
sees the proxy extension's annotations on the wire, and `ProxyClient` in transparent mode answers
as the direct endpoint does natively.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
import trio
from mcp import Client
from pydantic import TypeAdapter

from mcpvisor.client import ProxyClient, ProxyToolError
from tests.support.stack import echo_server, open_stack

MODES = ("legacy", "auto")
_RESULT = TypeAdapter(dict[str, Any])


async def raw_proxy(client: Client, arguments: dict[str, Any]) -> dict[str, Any]:
    """The proxy tool's result as it came over the wire, unknown keys and all."""
    request = types.CallToolRequest(params=types.CallToolRequestParams(name="proxy", arguments=arguments))
    with trio.fail_after(15):
        return await client.session.send_request(request, _RESULT)


def embedded(result: dict[str, Any]) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """(decoded JSON, annotations, resource) of a query answer's one embedded resource."""
    assert result["isError"] is False, result
    [item] = result["content"]
    assert item["type"] == "resource"
    assert item["resource"]["mimeType"] == "application/json"
    return json.loads(item["resource"]["text"]), item["annotations"], item["resource"]


def error_text(result: dict[str, Any]) -> str:
    assert result["isError"] is True, result
    return result["content"][0]["text"]


async def upstream_tool_names(direct: Client) -> list[str]:
    """What the direct endpoint lists natively, without its management tools."""
    return [tool.name for tool in (await direct.list_tools()).tools if ":" in tool.name]


async def check_list_and_pages(client: Client, expected: list[str]) -> None:
    tools, annotations, resource = embedded(await raw_proxy(client, {"action": "list", "type": "tool"}))
    names = [tool["name"] for tool in tools]
    assert sorted(names) == sorted(expected)
    total = len(expected)
    assert not any(name.startswith("q:") for name in names), "a quarantined server is not listed"
    assert annotations == {
        "proxyAction": "list",
        "proxyType": "tool",
        "pythonType": "Tool",
        "many": True,
        "totalCount": total,
        "offset": 0,
        "limit": 100,
    }
    assert resource["uri"] == "proxy:list/tool"
    echo = next(tool for tool in tools if tool["name"] == "alpha:echo")
    assert echo["annotations"] == {"readOnlyHint": True}
    assert "text" in echo["inputSchema"]["properties"]

    pages = []
    for offset in range(0, total, 5):
        page, page_annotations, _ = embedded(
            await raw_proxy(client, {"action": "list", "type": "tool", "limit": 5, "offset": offset})
        )
        assert (page_annotations["totalCount"], page_annotations["offset"], page_annotations["limit"]) == (
            total,
            offset,
            5,
        )
        pages += page
    assert pages == tools
    past_end, _, _ = embedded(await raw_proxy(client, {"action": "list", "type": "tool", "offset": 100}))
    assert past_end == []

    beta, beta_annotations, _ = embedded(
        await raw_proxy(client, {"action": "list", "type": "tool", "filter_server": "beta:"})
    )
    assert [tool["name"] for tool in beta] == [name for name in names if name.startswith("beta:")]
    assert beta_annotations["totalCount"] == total // 2
    filtered_page, filtered_annotations, _ = embedded(
        await raw_proxy(client, {"action": "list", "type": "tool", "filter_server": "beta:", "limit": 3, "offset": 2})
    )
    assert filtered_page == beta[2:5]
    assert filtered_annotations["totalCount"] == total // 2

    resources, resource_annotations, _ = embedded(await raw_proxy(client, {"action": "list", "type": "resource"}))
    assert [(r["name"], r.get("uri") or r["uriTemplate"]) for r in resources] == [
        ("alpha:readme", "test://readme"),
        ("beta:readme", "test://readme"),
        ("alpha:item", "test://items/{item_id}"),
        ("beta:item", "test://items/{item_id}"),
    ]
    assert resource_annotations["pythonType"] == "Resource | ResourceTemplate"
    only_beta, _, _ = embedded(
        await raw_proxy(client, {"action": "list", "type": "resource", "filter_server": "beta:"})
    )
    assert [r["name"] for r in only_beta] == ["beta:readme", "beta:item"]

    prompts, prompt_annotations, _ = embedded(await raw_proxy(client, {"action": "list", "type": "prompt"}))
    assert [p["name"] for p in prompts] == ["alpha:greet", "beta:greet"]
    assert prompt_annotations["pythonType"] == "Prompt"


async def check_info(client: Client) -> None:
    tool, annotations, resource = embedded(
        await raw_proxy(client, {"action": "info", "type": "tool", "path": "alpha:weather"})
    )
    assert tool["name"] == "alpha:weather"
    assert tool["title"] == "Weather report"
    assert "outputSchema" in tool
    assert annotations == {
        "proxyAction": "info",
        "proxyType": "tool",
        "proxyPath": "alpha:weather",
        "pythonType": "Tool",
        "many": False,
    }
    assert resource["uri"] == "proxy:info/tool/alpha:weather"

    readme, annotations, _ = embedded(
        await raw_proxy(client, {"action": "info", "type": "resource", "path": "test://readme"})
    )
    assert (readme["name"], annotations["pythonType"]) == ("alpha:readme", "Resource")
    template, annotations, _ = embedded(
        await raw_proxy(client, {"action": "info", "type": "resource", "path": "test://items/{item_id}"})
    )
    assert (template["name"], annotations["pythonType"]) == ("alpha:item", "ResourceTemplate")
    prompt, annotations, _ = embedded(
        await raw_proxy(client, {"action": "info", "type": "prompt", "path": "beta:greet"})
    )
    assert prompt["arguments"][0]["name"] == "who"
    assert annotations["proxyPath"] == "beta:greet"


async def check_calls(client: Client, tmp_path: Path) -> None:
    added = await raw_proxy(client, {"action": "call", "type": "tool", "path": "alpha:add", "args": {"a": 2, "b": 3}})
    assert added["isError"] is False
    assert added["content"] == [
        {
            "type": "text",
            "text": "5",
            "annotations": {"proxyType": "tool", "proxyAction": "call", "proxyPath": "alpha:add"},
        }
    ]
    weather = await raw_proxy(
        client, {"action": "call", "type": "tool", "path": "beta:weather", "args": '{"city": "Oslo"}'}
    )
    assert weather["structuredContent"] == {"city": "Oslo", "temperature": 21.5, "conditions": "sunny"}
    failed = await raw_proxy(client, {"action": "call", "type": "tool", "path": "alpha:fail", "args": {}})
    assert failed["isError"] is True
    assert failed["content"][0]["annotations"]["proxyAction"] == "call"

    read = await raw_proxy(client, {"action": "call", "type": "resource", "path": "test://items/7"})
    assert read["content"] == [
        {
            "type": "resource",
            "resource": {"uri": "test://items/7", "mimeType": "text/plain", "text": "item 7 of alpha"},
            "annotations": {"proxyType": "resource", "proxyAction": "call", "proxyPath": "test://items/7"},
        }
    ]
    prompt = await raw_proxy(client, {"action": "call", "type": "prompt", "path": "beta:greet", "args": {"who": "Ada"}})
    value, annotations, _ = embedded(prompt)
    assert value["messages"][0]["content"]["text"] == "Say hello to Ada from beta."
    assert annotations == {
        "proxyType": "prompt",
        "proxyAction": "call",
        "proxyPath": "beta:greet",
        "pythonType": "GetPromptResult",
    }

    target = tmp_path / "quarantined.txt"
    blocked = await raw_proxy(
        client, {"action": "call", "type": "tool", "path": "q:touch", "args": {"path": str(target)}}
    )
    assert "SECURITY QUARANTINE: server 'q'" in error_text(blocked)
    assert blocked["content"][0]["annotations"]["proxyPath"] == "q:touch"
    assert not target.exists()


PROXY_ERRORS: list[tuple[dict[str, Any], str]] = [
    ({"type": "tool"}, "Parameter 'action' is required"),
    (
        {"action": "delete", "type": "tool"},
        "Invalid proxy action 'delete'. Supported actions are 'list', 'info', and 'call'.",
    ),
    ({"action": "list"}, "Parameter 'type' is required"),
    (
        {"action": "list", "type": "widget"},
        "Invalid proxy type 'widget'. Supported types are 'tool', 'resource', and 'prompt'.",
    ),
    (
        {"action": "list", "type": "tool", "path": "alpha:echo"},
        "Parameter 'path' should not be provided for action 'list'",
    ),
    ({"action": "list", "type": "tool", "args": {"a": 1}}, "Parameter 'args' should not be provided for action 'list'"),
    (
        {"action": "info", "type": "tool", "path": "alpha:echo", "args": {"a": 1}},
        "Parameter 'args' should not be provided for action 'info'",
    ),
    ({"action": "info", "type": "tool"}, "Parameter 'path' is required for action 'info'"),
    ({"action": "call", "type": "prompt"}, "Parameter 'path' is required for action 'call'"),
    ({"action": "list", "type": "tool", "limit": 0}, "Parameter 'limit' must be an integer from 1 to 1000"),
    ({"action": "list", "type": "tool", "limit": 1001}, "Parameter 'limit' must be an integer from 1 to 1000"),
    ({"action": "list", "type": "tool", "limit": "ten"}, "Parameter 'limit' must be an integer from 1 to 1000"),
    ({"action": "list", "type": "tool", "offset": -1}, "Parameter 'offset' must be an integer of 0 or more"),
    ({"action": "list", "type": "tool", "filter_server": 3}, "Parameter 'filter_server' must be a string"),
    ({"action": "call", "type": "tool", "path": "alpha:echo", "limit": 5}, "only allowed for 'list' action"),
    ({"action": "info", "type": "tool", "path": "alpha:echo", "filter_server": "a"}, "only allowed for 'list' action"),
    ({"action": "list", "type": "tool", "page": 2}, "Unknown parameter 'page'"),
    ({"action": "call", "type": "tool", "path": "alpha:echo", "args": "{bad"}, "Parameter 'args' is not valid JSON"),
    (
        {"action": "call", "type": "tool", "path": "alpha:echo", "args": "[1]"},
        "Parameter 'args' must encode a JSON object",
    ),
    (
        {"action": "call", "type": "tool", "path": "alpha:echo", "args": 5},
        "Parameter 'args' must be an object or a JSON string",
    ),
    ({"action": "info", "type": "tool", "path": "alpha:nope"}, "Tool 'alpha:nope' not found"),
    ({"action": "info", "type": "tool", "path": "q:echo"}, "Tool 'q:echo' not found"),
    ({"action": "info", "type": "prompt", "path": "nope"}, "Prompt 'nope' not found"),
    (
        {"action": "call", "type": "tool", "path": "alpha:nope"},
        "Unknown tool 'alpha:nope': server 'alpha' has no tool 'nope'",
    ),
    ({"action": "call", "type": "tool", "path": "ghost:echo"}, "Unknown tool 'ghost:echo': no server 'ghost'"),
    ({"action": "call", "type": "tool", "path": "echo"}, "upstream tools are named 'server:tool'"),
    ({"action": "call", "type": "resource", "path": "nope://x"}, "Resource 'nope://x' not found"),
    ({"action": "call", "type": "prompt", "path": "alpha:nope", "args": {}}, "Prompt 'alpha:nope' not found"),
]


async def check_errors(client: Client) -> None:
    for arguments, message in PROXY_ERRORS:
        assert message in error_text(await raw_proxy(client, arguments)), arguments


async def test_proxy_tool_actions_types_pages_and_errors_in_both_eras(tmp_path: Path) -> None:
    servers = {"alpha": echo_server("alpha"), "beta": echo_server("beta"), "q": echo_server("q", quarantined=True)}
    async with open_stack(tmp_path, servers) as stack:
        async with stack.client("/mcp/direct") as direct:
            expected = await upstream_tool_names(direct)
        assert {"alpha:echo", "beta:weather"} <= set(expected)
        for mode in MODES:
            async with stack.client("/mcp", mode=mode) as client:
                tool = next(t for t in (await client.list_tools()).tools if t.name == "proxy")
                assert tool.input_schema["required"] == ["action", "type"]
                await check_list_and_pages(client, expected)
                await check_info(client)
                await check_calls(client, tmp_path)
                await check_errors(client)


async def test_proxy_client_answers_like_the_direct_endpoint(tmp_path: Path) -> None:
    """ProxyClient through `/mcp`'s proxy tool and a plain client of `/mcp/direct` see the same upstreams."""
    servers = {"alpha": echo_server("alpha"), "beta": echo_server("beta")}
    async with open_stack(tmp_path, servers) as stack, stack.client("/mcp/direct") as direct:
        direct_tools = [t for t in (await direct.list_tools()).tools if ":" in t.name]
        direct_weather = await direct.call_tool("beta:weather", {"city": "Oslo"})
        direct_item = (await direct.read_resource("test://items/3")).contents
        direct_prompt = await direct.get_prompt("alpha:greet", {"who": "Eve"})
        direct_templates = (await direct.list_resource_templates()).resource_templates
        for mode in MODES:
            async with stack.client("/mcp", mode=mode) as client:
                proxy = ProxyClient(client, transparent=True)
                assert sorted(await proxy.list_tools(), key=lambda t: t.name) == sorted(
                    direct_tools, key=lambda t: t.name
                )
                weather = await proxy.call_tool("beta:weather", {"city": "Oslo"})
                # `_meta` differs: each endpoint stamps its own server info on 2026-07-28 results.
                assert weather.model_dump(exclude={"meta"}) == direct_weather.model_dump(exclude={"meta"})
                assert await proxy.read_resource("test://items/3") == list(direct_item)
                prompt = await proxy.get_prompt("alpha:greet", {"who": "Eve"})
                assert prompt.model_dump(exclude={"meta"}) == direct_prompt.model_dump(exclude={"meta"})
                listed = await proxy.list_resources()
                assert [type(item) for item in listed] == [
                    types.Resource,
                    types.Resource,
                    types.ResourceTemplate,
                    types.ResourceTemplate,
                ]
                assert [t.uri_template for t in listed[2:]] == [t.uri_template for t in direct_templates]
                assert [p.name for p in await proxy.list_prompts()] == ["alpha:greet", "beta:greet"]
                failed = await proxy.call_tool("alpha:nope", {})
                assert failed.is_error
                with pytest.raises(ProxyToolError, match="Resource 'nope://x' not found"):
                    await proxy.read_resource("nope://x")

                plain = ProxyClient(client)
                response = await plain.proxy("list", "tool", limit=2, offset=1, filter_server="alpha:")
                assert [tool.name for tool in response.value] == [
                    t.name for t in direct_tools if t.name.startswith("alpha:")
                ][1:3]
                assert (response.info.proxy_action, response.info.python_type, response.info.many) == (
                    "list",
                    "Tool",
                    True,
                )
                alpha_count = sum(1 for t in direct_tools if t.name.startswith("alpha:"))
                assert (response.info.total_count, response.info.offset, response.info.limit) == (alpha_count, 1, 2)
                info = await plain.proxy("info", "resource", "test://readme")
                assert info.value == types.Resource(
                    name="alpha:readme", uri="test://readme", description="A fixed text", mime_type="text/plain"
                )
                assert (info.info.proxy_path, info.info.python_type) == ("test://readme", "Resource")
                called = await plain.proxy("call", "tool", "alpha:echo", {"text": "hi"})
                assert called.content[0]["annotations"] == {
                    "proxyType": "tool",
                    "proxyAction": "call",
                    "proxyPath": "alpha:echo",
                }
                assert called.value.content[0].text == "hi"
                # The native methods of a non-transparent ProxyClient see /mcp's own built-in tools.
                assert "retrieve_tools" in [tool.name for tool in await plain.list_tools()]
