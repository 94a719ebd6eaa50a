"""`/mcp/servers/NAME`: one supervised upstream under its own names, in both protocol eras."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
import trio
from mcp.shared.exceptions import MCPError

from tests.support.stack import echo_server, open_stack, python_server

CONF = python_server("conformance_server.py")
ERAS = ("legacy", "modern")


def _mode(era: str) -> dict[str, Any]:
    return {"mode": "legacy"} if era == "legacy" else {}


async def _status(url: str) -> tuple[int, Any]:
    async with httpx2.AsyncClient() as http:
        response = await http.post(
            url,
            json={
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "probe", "version": "1"},
                },
            },
            headers={"accept": "application/json, text/event-stream"},
        )
        return response.status_code, response.content


@pytest.mark.parametrize("era", ERAS)
async def test_a_client_sees_the_upstream_as_it_is_and_survives_its_restart(tmp_path: Path, era: str) -> None:
    settings = {"enable_server_endpoints": True}
    async with open_stack(tmp_path, {"conf": CONF, "echo": echo_server()}, settings=settings) as stack:
        async with stack.client("/mcp/servers/conf", **_mode(era)) as client:
            # Its own identity and instructions, not mcpvisor's.
            assert client.server_info is not None and client.server_info.name == "mcpvisor-conformance-fixture"
            capabilities = client.server_capabilities
            assert capabilities.tools is not None and capabilities.prompts is not None
            assert capabilities.resources is not None and capabilities.completions is not None

            tools = {tool.name for tool in (await client.list_tools()).tools}
            assert "test_simple_text" in tools and "json_schema_2020_12_tool" in tools
            assert not any(":" in name for name in tools)
            assert not any(name.startswith("echo") for name in tools)  # only this server's tools

            result = await client.call_tool("test_simple_text", {})
            assert not result.is_error
            assert result.content[0].text == "This is a simple text response for testing."

            prompts = {prompt.name for prompt in (await client.list_prompts()).prompts}
            assert "test_simple_prompt" in prompts
            prompt = await client.get_prompt("test_simple_prompt")
            assert prompt.messages

            resources = {str(resource.uri) for resource in (await client.list_resources()).resources}
            assert "test://static-text" in resources
            read = await client.read_resource("test://static-text")
            assert read.contents[0].text
            templates = (await client.list_resource_templates()).resource_templates
            assert any("{id}" in template.uri_template for template in templates)

            with pytest.raises(MCPError):
                await client.call_tool("echo", {"text": "x"})  # another server's tool is not here

            # The worker restarts under the client; the same client goes on once it is back.
            code, _ = await stack.actl("restart", "conf")
            assert code == 0
            await stack.wait_ready(["conf"])
            with trio.fail_after(20):
                while True:
                    try:
                        result = await client.call_tool("test_simple_text", {})
                    except MCPError:
                        await trio.sleep(0.2)
                        continue
                    break
            assert not result.is_error

        # The calls went through the door: the activity log has them, under the path they came by.
        with contextlib.closing(sqlite3.connect(f"file:{stack.data_dir / 'state.sqlite'}?mode=ro", uri=True)) as db:
            rows = db.execute("SELECT tool, outcome FROM calls WHERE server = 'conf' AND variant = 'server-endpoint'")
            assert ("test_simple_text", "ok") in set(rows.fetchall())


async def test_the_endpoint_is_off_unless_turned_on_and_404_looks_the_same_for_every_reason(tmp_path: Path) -> None:
    servers = {
        "off": echo_server(),  # follows enable_server_endpoints (off)
        "on": echo_server(endpoint=True),
        "gone": echo_server(enabled=False, endpoint=True),
        "held": echo_server(quarantined=True, endpoint=True),
    }
    async with open_stack(tmp_path, servers, wait_for=["on"]) as stack:
        base = f"{stack.base_url}/mcp/servers"
        code, _ = await _status(f"{base}/on")
        assert code == 200
        bodies = set()
        for name in ("off", "gone", "held", "nosuch", "tenant/on"):
            code, body = await _status(f"{base}/{name}")
            assert code == 404, name
            bodies.add(body.replace(name.encode(), b"NAME"))
        assert len(bodies) == 1, bodies
        async with stack.client("/mcp/servers/on") as client:
            assert {tool.name for tool in (await client.list_tools()).tools} >= {"echo"}


async def test_a_list_change_is_announced_to_that_servers_clients(tmp_path: Path) -> None:
    settings = {"enable_server_endpoints": True}
    async with open_stack(tmp_path, {"conf": CONF}, settings=settings) as stack:
        heard = trio.Event()

        async def on_message(message: Any) -> None:
            if isinstance(message, types.ServerNotification) and message.method == "notifications/tools/list_changed":
                heard.set()

        async with stack.client("/mcp/servers/conf", mode="legacy", message_handler=on_message) as client:
            await client.list_tools()
            result = await client.call_tool("test_trigger_tool_change", {})
            assert not result.is_error, result
            with trio.fail_after(10):
                await heard.wait()
            # A tool the server adds later is pinned like any: withheld until an operator approves it.
            assert "test_dynamic_tool" not in {tool.name for tool in (await client.list_tools()).tools}
            refused = await client.call_tool("test_dynamic_tool", {})
            assert refused.is_error and "approve" in refused.content[0].text
            code, _ = await stack.actl("approve", "conf")
            assert code == 0
            with trio.fail_after(10):
                while "test_dynamic_tool" not in {tool.name for tool in (await client.list_tools()).tools}:
                    await trio.sleep(0.1)
            assert (await client.call_tool("test_dynamic_tool", {})).content[0].text == "dynamic"
