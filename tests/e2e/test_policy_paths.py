"""Policies hold on every path: what `list` denies is absent everywhere, what `call` denies is refused everywhere.

Given a workstation stack (principal `Tenant::"local"`) with the direct endpoint, the server
endpoint and code_execution on, and policies that hide `echo:weather`, refuse `echo:add`, hide a
resource and refuse a prompt, every listing, search and way of calling, in both protocol eras,
gives the same answer: the hidden is unknown, the refused names its policy and reason.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.support.stack import Stack, echo_server, open_stack

POLICIES = """\
@id("baseline")
permit(principal, action, resource);

@id("hide-weather")
forbid(principal, action == Action::"list", resource == Tool::"echo:weather");

@id("no-add")
@reason("adding is switched off")
forbid(principal, action == Action::"call", resource == Tool::"echo:add");

@id("hide-readme")
forbid(principal, action == Action::"list", resource is Resource) when { resource.uri == "test://readme" };

@id("no-greetings")
@reason("no greetings today")
forbid(principal, action == Action::"call", resource == Prompt::"echo:greet");
"""
REFUSED = "Tool 'echo:add' was not run: refused by policy 'no-add': adding is switched off."
SETTINGS = {"enable_server_endpoints": True, "enable_code_execution": True}


def text_of(result: Any) -> str:
    """Every text of a result, embedded resources' (the proxy tool's answers) included."""
    texts = []
    for block in result.content:
        inner = getattr(block, "resource", None)
        text = getattr(inner if inner is not None else block, "text", None)
        if text:
            texts.append(text)
    return "".join(texts)


async def tool_names(client: Client) -> set[str]:
    return {tool.name for tool in (await client.list_tools()).tools}


async def through_search(stack: Stack, mode: str) -> None:
    async with stack.client("/mcp", mode=mode) as client:
        found = await client.call_tool("retrieve_tools", {"query": "weather report for a city", "limit": 20})
        names = {entry["name"] for entry in json.loads(text_of(found))["tools"]}
        assert "echo:weather" not in names and "echo:echo" in names, names
        described = json.loads(text_of(await client.call_tool("describe_tools", {"names": ["echo:weather"]})))
        assert described["tools"][0]["error"] == "Unknown tool 'echo:weather': server 'echo' has no tool 'weather'"
        for variant in ("call_tool_read", "call_tool_write", "call_tool_destructive"):
            intent = {"operation_type": variant.removeprefix("call_tool_")}
            refused = await client.call_tool(variant, {"name": "echo:add", "args": {"a": 1, "b": 2}, "intent": intent})
            assert (refused.is_error, text_of(refused)) == (True, REFUSED), variant
        hidden = await client.call_tool(
            "call_tool_read", {"name": "echo:weather", "args": {"city": "x"}, "intent": {"operation_type": "read"}}
        )
        assert hidden.is_error and "has no tool 'weather'" in text_of(hidden)

        # The proxy tool: listed, described, called.
        listed = await client.call_tool("proxy", {"action": "list", "type": "tool", "limit": 100})
        assert "echo:weather" not in text_of(listed) and "echo:add" in text_of(listed)
        info = await client.call_tool("proxy", {"action": "info", "type": "tool", "path": "echo:weather"})
        assert info.is_error and text_of(info) == "Tool 'echo:weather' not found"  # the proxy's own words
        called = await client.call_tool(
            "proxy", {"action": "call", "type": "tool", "path": "echo:add", "args": {"a": 1, "b": 2}}
        )
        assert REFUSED in text_of(called)

        # code_execution's call_tool: refused with the policy's words.
        code = "var r = call_tool('echo', 'add', {a: 1, b: 2}); [r.ok, r.error.code, r.error.message]"
        ran = json.loads(text_of(await client.call_tool("code_execution", {"code": code})))
        assert ran["value"] == [False, "REFUSED", REFUSED], ran
        code = "var r = call_tool('echo', 'weather', {city: 'x'}); [r.ok, r.error.code]"
        ran = json.loads(text_of(await client.call_tool("code_execution", {"code": code})))
        assert ran["value"] == [False, "TOOL_NOT_FOUND"], ran


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_every_listing_and_every_way_of_calling(tmp_path: Path, mode: str) -> None:
    (tmp_path / "policies.cedar").write_text(POLICIES)
    tables = {"policy": {"files": ["policies.cedar"]}}
    async with open_stack(tmp_path, {"echo": echo_server()}, settings=SETTINGS, tables=tables) as stack:
        for path in ("/mcp/direct", "/mcp/servers/echo"):
            prefix = "echo:" if path == "/mcp/direct" else ""
            async with stack.client(path, mode=mode) as client:
                names = await tool_names(client)
                assert f"{prefix}add" in names and f"{prefix}echo" in names and f"{prefix}weather" not in names, names
                refused = await client.call_tool(f"{prefix}add", {"a": 1, "b": 2})
                assert (refused.is_error, text_of(refused)) == (True, REFUSED), path
                with pytest.raises(MCPError, match=r"has no tool .weather.|Unknown tool"):
                    result = await client.call_tool(f"{prefix}weather", {"city": "x"})
                    assert result.is_error  # an endpoint may answer with an error result instead
                    raise MCPError(code=-32602, message=text_of(result))
                uris = {str(resource.uri) for resource in (await client.list_resources()).resources}
                assert "test://readme" not in uris
                with pytest.raises(MCPError, match="Unknown resource 'test://readme'"):
                    await client.read_resource("test://readme")
                assert str((await client.read_resource("test://items/7")).contents[0].text).startswith("item 7")
                with pytest.raises(MCPError, match="refused by policy 'no-greetings': no greetings today"):
                    await client.get_prompt(f"{prefix}greet", {"who": "Ada"})
                echoed = await client.call_tool(f"{prefix}echo", {"text": "still here"})
                assert text_of(echoed) == "still here"
        await through_search(stack, mode)
