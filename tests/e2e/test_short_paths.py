"""The short paths of /mcp/direct answer exactly as the SDK's server does, in both eras.

A client that declares roots can be asked things mid-call, so the SDK's server serves all of its
requests; a client that declares nothing takes the short paths (frontend/endpoints/session_path.py and
frontend/endpoints/fastpath.py). Both are the SDK's own `Client` on the same mcpvisor, and must get the same
tools, pages, results and errors. Raw HTTP checks what a client library would paper over: which
path answered, and that a bad or ended session gets the SDK's own answer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
import trio
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.support.stack import Stack, echo_server, open_stack

MODES = ("legacy", "auto")
SERVERS = {name: echo_server(name) for name in ("alpha", "beta", "gamma")}
SETTINGS = {"page_size": 4}  # about forty tools: ten pages and more
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


async def no_roots(context: Any) -> types.ListRootsResult:
    return types.ListRootsResult(roots=[])


async def listed(client: Client, method: str) -> list[dict[str, Any]]:
    """Every item of a paginated list, all pages, as wire dicts."""
    fetch = {"tools": client.list_tools, "prompts": client.list_prompts, "resources": client.list_resources}[method]
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    pages = 0
    while True:
        page = await fetch(cursor=cursor, cache_mode="bypass")
        items.extend(item.model_dump(by_alias=True, mode="json", exclude_none=True) for item in getattr(page, method))
        pages += 1
        cursor = page.next_cursor
        if not cursor:
            return items


async def outcome(client: Client, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A call's result, or its JSON-RPC error, as plain data."""
    try:
        result = await client.call_tool(name, arguments)
    except MCPError as exc:
        return {"error": {"code": exc.error.code, "message": exc.error.message}}
    dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    # Each call carries its own audit id: present on both paths, equal on neither.
    meta = dumped.get("_meta") or {}
    if isinstance(meta.pop("io.mcpvisor/requestId", None), str) and not meta:
        del dumped["_meta"]
    return dumped


CALLS = [
    ("alpha:echo", {"text": "héllo, wörld"}),
    ("beta:weather", {"city": "Lyon"}),
    ("gamma:add", {"a": 2, "b": 40}),
    ("alpha:fail", {"message": "on purpose"}),
    ("alpha:add", {"a": "not a number", "b": 1}),  # the upstream refuses the arguments
    ("alpha:long_text", {"length": 20000}),
    ("alpha:nope", {}),  # unknown tool of a known server
    ("nosuch:echo", {}),  # unknown server
    ("plainname", {}),  # not a server:tool name
]


@pytest.mark.parametrize("mode", MODES)
async def test_short_paths_answer_as_the_sdk_does(tmp_path: Path, mode: str) -> None:
    async with (
        open_stack(tmp_path, SERVERS, settings=SETTINGS) as stack,
        stack.client(mode=mode) as short,
        stack.client(mode=mode, list_roots_callback=no_roots) as sdk,
    ):
        for method in ("tools", "prompts", "resources"):
            mine, theirs = await listed(short, method), await listed(sdk, method)
            assert mine == theirs, method
        tools = {tool["name"] for tool in await listed(short, "tools")}
        assert {f"{server}:echo" for server in SERVERS} <= tools and len(tools) > 10 * SETTINGS["page_size"]
        for name, arguments in CALLS:
            mine, theirs = await outcome(short, name, arguments), await outcome(sdk, name, arguments)
            assert mine == theirs, name
        assert (await outcome(short, "alpha:echo", {"text": "x"}))["content"][0]["text"] == "x"
        assert "error" in await outcome(short, "alpha:nope", {})
        for client in (short, sdk):
            with pytest.raises(MCPError) as caught:
                await client.list_tools(cursor="not-a-cursor", cache_mode="bypass")
            assert "Invalid cursor" in caught.value.error.message


@pytest.mark.parametrize("mode", MODES)
async def test_lists_follow_what_clients_may_see(tmp_path: Path, mode: str) -> None:
    """The cached pages change as soon as a server is disabled and enabled again."""
    async with open_stack(tmp_path, SERVERS, settings=SETTINGS) as stack, stack.client(mode=mode) as client:
        before = {tool["name"] for tool in await listed(client, "tools")}
        assert "beta:echo" in before
        code, _ = await stack.actl("disable", "beta")
        assert code == 0
        with trio.fail_after(15):
            while any(name.startswith("beta:") for name in {t["name"] for t in await listed(client, "tools")}):
                await trio.sleep(0.1)
        with pytest.raises(MCPError) as caught:
            await client.call_tool("beta:echo", {"text": "x"})
        assert "disabled" in caught.value.error.message
        code, _ = await stack.actl("enable", "beta")
        assert code == 0
        await stack.wait_ready(["beta"])
        with trio.fail_after(15):
            while {t["name"] for t in await listed(client, "tools")} != before:
                await trio.sleep(0.1)


async def handshake(
    http: httpx2.AsyncClient, stack: Stack, capabilities: dict[str, Any], *, url: str | None = None
) -> dict[str, str]:
    """Open a 2025-11-25 session by hand (on /mcp/direct unless `url` says); the headers its requests carry."""
    url = url or stack.direct_url
    opening = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": capabilities,
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    response = await http.post(url, headers=HEADERS, json=opening)
    assert response.status_code == 200
    headers = {**HEADERS, "mcp-session-id": response.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
    initialized = await http.post(url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert initialized.status_code == 202
    return headers


def call(request_id: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }


def answer(response: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC message of a response, whether sent as JSON or as one SSE event."""
    if response.headers["content-type"].startswith("text/event-stream"):
        data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
        message = json.loads(next(d for d in data if d))
    else:
        message = response.json()
    meta = message.get("result", {}).get("_meta") or {}
    if isinstance(meta.pop("io.mcpvisor/requestId", None), str) and not meta:
        del message["result"]["_meta"]  # each call's own audit id
    return message


async def test_handshake_sessions_on_the_wire(tmp_path: Path) -> None:
    async with open_stack(tmp_path, {"echo": echo_server()}) as stack, httpx2.AsyncClient(timeout=30) as http:
        quiet = await handshake(http, stack, {})
        asking = await handshake(http, stack, {"roots": {}})
        fast = await http.post(stack.direct_url, headers=quiet, json=call(1, "echo:echo", {"text": "hi"}))
        slow = await http.post(stack.direct_url, headers=asking, json=call(1, "echo:echo", {"text": "hi"}))
        # The quiet session is answered with JSON, the other on the SDK's stream, with the same message.
        assert fast.headers["content-type"] == "application/json"
        assert slow.headers["content-type"].startswith("text/event-stream")
        assert fast.headers["mcp-session-id"] == quiet["mcp-session-id"]
        assert answer(fast) == answer(slow)
        assert answer(fast)["result"]["content"][0]["text"] == "hi"

        # A session that asked for logs is the SDK's from then on: log lines may come mid-call.
        level = {"jsonrpc": "2.0", "id": 2, "method": "logging/setLevel", "params": {"level": "info"}}
        assert (await http.post(stack.direct_url, headers=quiet, json=level)).status_code == 200
        logged = await http.post(stack.direct_url, headers=quiet, json=call(3, "echo:echo", {"text": "hi"}))
        assert logged.headers["content-type"].startswith("text/event-stream")
        assert answer(logged)["result"] == answer(fast)["result"]

        # An unknown session, a terminated one, and a bad Host get the SDK's own answers.
        other = await handshake(http, stack, {})
        unknown = await http.post(
            stack.direct_url, headers={**other, "mcp-session-id": "f" * 32}, json=call(4, "echo:echo", {"text": "x"})
        )
        assert unknown.status_code == 404 and unknown.json()["error"]["message"] == "Session not found"
        assert (await http.delete(stack.direct_url, headers=other)).status_code == 200
        ended = await http.post(stack.direct_url, headers=other, json=call(5, "echo:echo", {"text": "x"}))
        assert (ended.status_code, ended.json()) == (unknown.status_code, unknown.json())
        fresh = await handshake(http, stack, {})
        rebound = await http.post(
            stack.direct_url, headers={**fresh, "host": "evil.example:80"}, json=call(6, "echo:echo", {"text": "x"})
        )
        assert rebound.status_code in (400, 403, 421)
        assert "result" not in rebound.text

        # Malformed params go to the SDK, which explains them; the session stays usable.
        bad = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "echo:echo", "arguments": [1]}}
        refused = answer(await http.post(stack.direct_url, headers=fresh, json=bad))
        assert refused["error"]["code"] == types.INVALID_PARAMS
        again = await http.post(stack.direct_url, headers=fresh, json=call(8, "echo:echo", {"text": "still"}))
        assert answer(again)["result"]["content"][0]["text"] == "still"


SEARCHES = [
    {"query": "echo the text back"},
    {"query": "weather in a city", "limit": 2},
    {"query": 5},  # not a string: the tool's own error
    {"query": "add", "unknown": True},  # an argument the tool has not got
    {"limit": 3},  # no query
]


@pytest.mark.parametrize("mode", MODES)
async def test_retrieve_tools_on_the_short_paths_answers_as_the_sdk_does(tmp_path: Path, mode: str) -> None:
    async with (
        open_stack(tmp_path, SERVERS) as stack,
        stack.client("/mcp", mode=mode) as short,
        stack.client("/mcp", mode=mode, list_roots_callback=no_roots) as sdk,
    ):
        for arguments in SEARCHES:
            mine, theirs = (
                await outcome(short, "retrieve_tools", arguments),
                await outcome(sdk, "retrieve_tools", arguments),
            )
            assert mine == theirs, arguments
        found = await outcome(short, "retrieve_tools", {"query": "weather in a city", "limit": 2})
        assert found["structuredContent"]["tools"][0]["name"].endswith(":weather")
        assert len(found["structuredContent"]["tools"]) == 2
        assert (await outcome(short, "retrieve_tools", {"query": 5}))["isError"] is True
        # The endpoint's other tools and names stay the SDK's.
        for name, arguments in (("read_cache", {"key": "nope"}), ("alpha:echo", {"text": "x"})):
            assert await outcome(short, name, arguments) == await outcome(sdk, name, arguments)


async def test_retrieve_tools_of_a_quiet_session_is_answered_with_json(tmp_path: Path) -> None:
    async with open_stack(tmp_path, {"echo": echo_server()}) as stack, httpx2.AsyncClient(timeout=30) as http:
        search = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "retrieve_tools", "arguments": {"query": "echo"}},
        }
        answers = []
        for capabilities in ({}, {"roots": {}}):
            headers = await handshake(http, stack, capabilities, url=stack.url)
            answers.append(await http.post(stack.url, headers=headers, json=search))
        fast, slow = answers
        assert fast.headers["content-type"] == "application/json"
        assert slow.headers["content-type"].startswith("text/event-stream")
        assert answer(fast) == answer(slow)
        assert answer(fast)["result"]["structuredContent"]["tools"][0]["name"] == "echo:echo"
