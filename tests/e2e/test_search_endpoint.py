"""`/mcp`, the search-first endpoint, end to end: a real supervisor, workers, upstreams and SDK clients.

Given a stack with several upstreams (one of them quarantined), a client finds tools with
`retrieve_tools`, calls them with the call variant their annotations ask for, is refused the
wrong variant and quarantined tools (which are never run), pages long results with `read_cache`,
and manages servers with `upstream_servers` and `quarantine_security`.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
import trio
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.support.stack import Stack, echo_server, open_stack

TIME_SERVER = {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}
BUILTINS = [
    "retrieve_tools",
    "describe_tools",
    "call_tool_read",
    "call_tool_write",
    "call_tool_destructive",
    "upstream_servers",
    "quarantine_security",
    "read_cache",
    "list_registries",
    "search_servers",
    "proxy",
]
MODES = ("legacy", "auto")
SECRET_ARGUMENT = "do-not-log-this-argument-7f3a"


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(item.text for item in result.content if isinstance(item, types.TextContent))


def data_of(result: types.CallToolResult) -> Any:
    assert not result.is_error, text_of(result)
    return json.loads(result.content[0].text)


def intent(operation: str, **extra: Any) -> dict[str, Any]:
    return {"operation_type": operation, **extra}


async def call(client: Client, tool: str, arguments: dict[str, Any]) -> types.CallToolResult:
    with trio.fail_after(15):
        return await client.call_tool(tool, arguments)


async def search(client: Client, query: str, limit: int | None = None) -> list[dict[str, Any]]:
    arguments: dict[str, Any] = {"query": query} if limit is None else {"query": query, "limit": limit}
    result = await call(client, "retrieve_tools", arguments)
    found = data_of(result)
    assert result.structured_content == found
    assert found["query"] == query
    assert found["total"] == len(found["tools"]) + len(found.get("more", []))
    if limit is not None:
        assert "more" not in found
    return found["tools"]


async def default_answer(client: Client, query: str) -> dict[str, Any]:
    """The answer to a search without `limit`: within the token budget, compact entries under `more`."""
    result = await call(client, "retrieve_tools", {"query": query})
    found = data_of(result)
    assert len(result.content[0].text) / 4 <= 1000
    return found


async def wait_for(condition: Any, *, timeout: float = 20.0, what: str = "condition") -> Any:
    """Poll an async predicate until it returns something truthy."""
    with trio.move_on_after(timeout):
        while not (value := await condition()):
            await trio.sleep(0.1)
        return value
    raise AssertionError(f"timed out waiting for {what}")


# -- the shared stack: alpha and time are trusted, beta is quarantined ------------------------------


async def check_listing(client: Client) -> None:
    tools = (await client.list_tools()).tools
    assert [tool.name for tool in tools] == BUILTINS
    by_name = {tool.name: tool for tool in tools}
    assert by_name["call_tool_read"].annotations.read_only_hint is True
    assert by_name["call_tool_destructive"].annotations.destructive_hint is True
    assert by_name["call_tool_read"].input_schema["required"] == ["name", "intent"]
    limit = by_name["retrieve_tools"].input_schema["properties"]["limit"]
    assert "default" not in limit and "instead of the answer within about 1000 tokens" in limit["description"]
    assert "describe_tools" in by_name["retrieve_tools"].description
    assert by_name["describe_tools"].annotations.read_only_hint is True
    assert by_name["describe_tools"].input_schema["required"] == ["names"]


async def check_search(client: Client) -> None:
    [best, *_] = await search(client, "current time in a timezone")
    assert best["name"] == "time:get_current_time"
    assert best["server"] == "time"
    assert best["call_with"] == "call_tool_read"
    assert best["annotations"]["readOnlyHint"] is True
    assert "timezone" in best["inputSchema"]["properties"]
    assert best["description"] == "Get current time in a specific timezone"
    assert best["score"] > 0

    weather = (await search(client, "weather report for a city"))[0]
    assert (weather["name"], weather["call_with"], weather["title"]) == (
        "alpha:weather",
        "call_tool_write",
        "Weather report",
    )
    touch = (await search(client, "create a file at a path"))[0]
    assert (touch["name"], touch["call_with"]) == ("alpha:touch", "call_tool_destructive")

    everything = await search(client, "echo text file time weather add integers", limit=100)
    servers = {tool["server"] for tool in everything}
    assert servers == {"alpha", "time"}, "the quarantined server's tools must not be found"
    assert len(await search(client, "echo text file time weather add integers", limit=2)) == 2
    # Ranked by meaning too: a query sharing no word with the tool finds it; one with no word at all, nothing.
    assert (await search(client, "will it rain in Paris tomorrow"))[0]["name"] == "alpha:weather"
    assert await search(client, "the of and") == []

    # Without limit: the best tool in full, then the others compact, best first, none of beta's.
    answer = await default_answer(client, "current time in a timezone")
    [best] = answer["tools"]
    assert best["name"] == "time:get_current_time" and "timezone" in best["inputSchema"]["properties"]
    more = answer["more"]
    assert answer["total"] == 1 + len(more) > 10
    assert more[0] == "time:convert_time — Convert time between timezones"
    assert all(line.startswith(("alpha:", "time:")) for line in more)
    assert "describe_tools" in answer["hint"]


async def check_describe(client: Client) -> None:
    """describe_tools answers what a call would reach, and names what it would refuse."""
    asked = ["time:convert_time", "alpha:touch", "beta:touch", "nosuch:echo", "alpha:nosuch", "time:convert_time"]
    described = data_of(await call(client, "describe_tools", {"names": asked}))
    convert, touch, quarantined, no_server, no_tool = described["tools"]
    assert described["total"] == 2
    assert convert["name"] == "time:convert_time" and convert["call_with"] == "call_tool_read"
    assert set(convert["inputSchema"]["required"]) == {"source_timezone", "time", "target_timezone"}
    assert "score" not in convert
    assert (touch["name"], touch["call_with"]) == ("alpha:touch", "call_tool_destructive")
    assert "inputSchema" not in quarantined and "description" not in quarantined
    assert quarantined["error"].startswith("Server 'beta' is quarantined")
    assert "mcpvisor ctl approve beta" in quarantined["error"]
    # The same words as a call to the name gets.
    for entry, name in ((no_server, "nosuch:echo"), (no_tool, "alpha:nosuch")):
        refused = await call(client, "call_tool_read", {"name": name, "args": {}, "intent": intent("read")})
        assert refused.is_error and entry == {"name": name, "error": text_of(refused)}

    one = data_of(await call(client, "describe_tools", {"names": "alpha:echo"}))
    assert [tool["name"] for tool in one["tools"]] == ["alpha:echo"]
    for arguments, message in (
        ({}, "'names' must be a non-empty array"),
        ({"names": []}, "'names' must be a non-empty array"),
        ({"names": [3]}, "'names' must hold strings, got a number"),
        ({"names": ["a:b"] * 21}, "ask for at most 20 at once"),
        ({"names": ["x" * 301]}, "longer than 300 characters"),
        ({"names": ["a:b"], "limit": 3}, "Unknown parameter 'limit' for describe_tools"),
    ):
        refused = await call(client, "describe_tools", arguments)
        assert refused.is_error and message in text_of(refused), (arguments, text_of(refused))


async def check_call_variants(client: Client, scratch: Path) -> None:
    echoed = await call(
        client, "call_tool_read", {"name": "alpha:echo", "args": {"text": "hi"}, "intent": intent("read")}
    )
    assert not echoed.is_error
    assert text_of(echoed) == "hi"

    summed = await call(
        client,
        "call_tool_write",
        {"name": "alpha:add", "args_json": '{"a": 2, "b": 40}', "intent": intent("write", reason="sum for a test")},
    )
    assert text_of(summed) == "42"
    # The write variant may also run a read-only tool; only destructive tools are refused.
    assert (
        text_of(
            await call(
                client, "call_tool_write", {"name": "alpha:echo", "args": {"text": "w"}, "intent": intent("write")}
            )
        )
        == "w"
    )

    now = await call(
        client,
        "call_tool_read",
        {"name": "time:get_current_time", "args": {"timezone": "UTC"}, "intent": intent("read")},
    )
    assert json.loads(text_of(now))["timezone"] == "UTC"

    for variant in ("call_tool_read", "call_tool_write"):
        target = scratch / f"{variant}.txt"
        refused = await call(
            client,
            variant,
            {"name": "alpha:touch", "args": {"path": str(target)}, "intent": intent(variant.rsplit("_", 1)[1])},
        )
        assert refused.is_error
        assert "marked destructive" in text_of(refused)
        assert f"call it with call_tool_destructive instead of {variant}" in text_of(refused)
        assert not target.exists()

    target = scratch / "destructive.txt"
    done = await call(
        client,
        "call_tool_destructive",
        {
            "name": "alpha:touch",
            "args": {"path": str(target)},
            "intent": intent("destructive", data_sensitivity="internal"),
        },
    )
    assert text_of(done) == f"touched {target}"
    assert target.read_text().startswith("alpha ")
    # A tool's own failure is a result with isError, passed on as the tool gave it.
    failed = await call(
        client, "call_tool_read", {"name": "alpha:fail", "args": {"message": "kaput"}, "intent": intent("read")}
    )
    assert failed.is_error
    assert text_of(failed) == "Error executing tool fail"


async def check_quarantine(client: Client, scratch: Path) -> None:
    for variant in ("call_tool_read", "call_tool_write", "call_tool_destructive"):
        target = scratch / f"quarantined-{variant}.txt"
        answer = await call(
            client,
            variant,
            {"name": "beta:touch", "args": {"path": str(target)}, "intent": intent(variant.rsplit("_", 1)[1])},
        )
        assert answer.is_error
        report = text_of(answer)
        assert report.startswith("SECURITY QUARANTINE: server 'beta'")
        assert "The call to beta:touch was NOT executed" in report
        assert "[LOW" in report and "touch" in report
        assert not target.exists()
    target = scratch / "quarantined-proxy.txt"
    answer = await call(
        client, "proxy", {"action": "call", "type": "tool", "path": "beta:touch", "args": {"path": str(target)}}
    )
    assert answer.is_error
    assert "NOT executed" in text_of(answer)
    assert not target.exists()

    listed = data_of(await call(client, "quarantine_security", {"action": "list"}))
    assert [entry["name"] for entry in listed["quarantined"]] == ["beta"]
    assert listed["quarantined"][0]["tool_count"] > 8
    assert listed["quarantined"][0]["state"] == "ready"
    inspected = data_of(await call(client, "quarantine_security", {"action": "inspect", "name": "beta"}))
    assert inspected["server"] == "beta"
    assert inspected["quarantined"] is True
    assert {tool["tool"] for tool in inspected["tools"]} >= {"echo", "touch", "long_text"}
    assert {tool["approval"] for tool in inspected["tools"]} == {"not approved"}
    assert all(len(tool["hash"]) == 64 for tool in inspected["tools"])
    # `server` is accepted too: the quarantine report tells operators to use it.
    assert (
        data_of(await call(client, "quarantine_security", {"action": "inspect", "server": "beta"}))["server"] == "beta"
    )


async def check_read_cache(client: Client) -> None:
    expected = "".join(chr(ord("a") + i % 26) for i in range(2500))
    long = await call(
        client, "call_tool_read", {"name": "alpha:long_text", "args": {"length": 2500}, "intent": intent("read")}
    )
    assert not long.is_error
    head, note = long.content[0].text, long.content[1].text
    assert head == expected[:1000]
    assert "first 1000 of 2500 characters" in note
    key = long.meta["mcpvisor/truncated"]["key"]
    assert f'"key": "{key}", "offset": 1000' in note

    pages, offset = [head], 1000
    while offset is not None:
        page = await call(client, "read_cache", {"key": key, "offset": offset, "limit": 600})
        assert not page.is_error, text_of(page)
        pages.append(page.content[0].text)
        offset = page.structured_content["next_offset"]
    assert "".join(pages) == expected
    assert len(pages) == 4  # 1000 + 600 + 600 + 300

    short = await call(
        client, "call_tool_read", {"name": "alpha:long_text", "args": {"length": 999}, "intent": intent("read")}
    )
    assert len(short.content) == 1
    assert short.content[0].text == expected[:999]


BAD_INPUT: list[tuple[str, dict[str, Any], str]] = [
    ("retrieve_tools", {}, "Parameter 'query' is required"),
    ("retrieve_tools", {"query": 7}, "Parameter 'query' must be a string, got a number"),
    ("retrieve_tools", {"query": "   "}, "Parameter 'query' must not be empty"),
    ("retrieve_tools", {"query": "x", "limit": 101}, "Parameter 'limit' must be an integer from 1 to 100; got 101"),
    ("retrieve_tools", {"query": "x", "limit": "5"}, "Parameter 'limit' must be an integer, got a string"),
    ("retrieve_tools", {"query": "x", "max": 5}, "Unknown parameter 'max' for retrieve_tools"),
    ("call_tool_read", {"intent": intent("read")}, "Parameter 'name' is required"),
    (
        "call_tool_read",
        {"name": ["alpha:echo"], "intent": intent("read")},
        "Parameter 'name' must be a string, got an array",
    ),
    (
        "call_tool_read",
        {"name": "echo", "intent": intent("read")},
        "Unknown tool 'echo': upstream tools are named 'server:tool'",
    ),
    (
        "call_tool_read",
        {"name": "nope:echo", "intent": intent("read")},
        "Unknown tool 'nope:echo': no server 'nope' (servers: alpha, beta, time)",
    ),
    (
        "call_tool_read",
        {"name": "alpha:nope", "intent": intent("read")},
        "Unknown tool 'alpha:nope': server 'alpha' has no tool 'nope'",
    ),
    (
        "call_tool_read",
        {"name": "alpha:echo", "args": [1], "intent": intent("read")},
        "Parameter 'args' must be an object, got an array",
    ),
    (
        "call_tool_read",
        {"name": "alpha:echo", "args_json": "{oops", "intent": intent("read")},
        "Parameter 'args_json' is not valid JSON",
    ),
    (
        "call_tool_read",
        {"name": "alpha:echo", "args_json": "[1, 2]", "intent": intent("read")},
        "Parameter 'args_json' must hold a JSON object, got an array",
    ),
    (
        "call_tool_read",
        {"name": "alpha:echo", "args_json": {"text": "x"}, "intent": intent("read")},
        "Parameter 'args_json' must be a string holding a JSON object, got an object",
    ),
    (
        "call_tool_read",
        {"name": "alpha:echo", "args": {}, "args_json": "{}", "intent": intent("read")},
        "in 'args' or in 'args_json', not both",
    ),
    ("call_tool_read", {"name": "alpha:echo", "args": {"text": "x"}}, "Parameter 'intent' is required"),
    ("call_tool_read", {"name": "alpha:echo", "intent": "read"}, "Parameter 'intent' is not valid JSON"),
    ("call_tool_read", {"name": "alpha:echo", "intent": [1]}, "Parameter 'intent' must be an object, got an array"),
    (
        "call_tool_read",
        {"name": "alpha:echo", "intent": {}},
        "intent.operation_type is required: 'read' for call_tool_read",
    ),
    (
        "call_tool_read",
        {"name": "alpha:echo", "intent": intent("write")},
        "intent.operation_type is 'write' but this is call_tool_read",
    ),
    (
        "call_tool_destructive",
        {"name": "alpha:echo", "intent": intent("delete")},
        "intent.operation_type must be 'destructive' for call_tool_destructive, got 'delete'",
    ),
    (
        "call_tool_write",
        {"name": "alpha:add", "intent": intent("write", data_sensitivity="secret")},
        "intent.data_sensitivity must be one of public, internal, private, unknown",
    ),
    (
        "call_tool_write",
        {"name": "alpha:add", "intent": intent("write", reason="x" * 1001)},
        "intent.reason is longer than 1000 characters",
    ),
    (
        "call_tool_write",
        {"name": "alpha:add", "intent": intent("write", why="x")},
        "Unknown parameter 'why' for call_tool_write's intent",
    ),
    (
        "call_tool_write",
        {"name": "alpha:add", "arguments": {}, "intent": intent("write")},
        "Unknown parameter 'arguments' for call_tool_write",
    ),
    ("upstream_servers", {}, "Parameter 'operation' is required"),
    ("upstream_servers", {"operation": "explode"}, "Parameter 'operation' must be one of list, add"),
    (
        "upstream_servers",
        {"operation": "list", "lines": 3},
        "Unknown parameter 'lines' for upstream_servers operation 'list'",
    ),
    ("upstream_servers", {"operation": "remove"}, "Parameter 'name' is required"),
    (
        "upstream_servers",
        {"operation": "enable", "name": "ghost"},
        "Unknown server 'ghost' (servers: alpha, beta, time)",
    ),
    ("upstream_servers", {"operation": "add", "name": "bad:name", "command": "x"}, "Invalid server name 'bad:name'"),
    ("upstream_servers", {"operation": "add", "name": "alpha", "command": "x"}, "Server 'alpha' already exists"),
    ("upstream_servers", {"operation": "add", "name": "new"}, "needs exactly one of 'command' (stdio) or 'url' (HTTP)"),
    (
        "upstream_servers",
        {"operation": "add", "name": "new", "command": "x", "url": "http://x"},
        "needs exactly one of 'command'",
    ),
    (
        "upstream_servers",
        {"operation": "add", "name": "new", "url": "ftp://x"},
        "'url' must start with http:// or https://",
    ),
    (
        "upstream_servers",
        {"operation": "add", "name": "new", "command": "x", "args_json": "[1"},
        "Parameter 'args_json' is not valid JSON",
    ),
    (
        "upstream_servers",
        {"operation": "add", "name": "new", "command": "x", "args": "-v"},
        "Parameter 'args' must be an array or null, got a string",
    ),
    (
        "upstream_servers",
        {"operation": "add", "name": "new", "command": "x", "env": {"A": 1}},
        "Invalid settings for server 'new': Expected `str`, got `int`",
    ),
    (
        "upstream_servers",
        {"operation": "add", "name": "new", "command": "x", "policy": {"startsecs": -1}},
        "Invalid settings for server 'new'",
    ),
    (
        "upstream_servers",
        {"operation": "add", "name": "new", "command": "x", "quarantined": False},
        "Unknown parameter 'quarantined'",
    ),
    ("upstream_servers", {"operation": "patch", "name": "alpha"}, "Nothing to change for server 'alpha'"),
    ("upstream_servers", {"operation": "patch", "name": "alpha", "command": None}, "needs exactly one of 'command'"),
    (
        "upstream_servers",
        {"operation": "tail_log", "name": "alpha", "lines": 0},
        "Parameter 'lines' must be an integer from 1 to 1000",
    ),
    ("quarantine_security", {}, "Parameter 'action' is required"),
    ("quarantine_security", {"action": "release"}, "Parameter 'action' must be one of list, inspect, approve, block"),
    ("quarantine_security", {"action": "inspect"}, "Parameter 'name' (the server) is required for action 'inspect'"),
    ("quarantine_security", {"action": "approve", "name": "ghost"}, "Unknown server 'ghost'"),
    ("read_cache", {}, "Parameter 'key' is required"),
    ("read_cache", {"key": "0123456789abcdef"}, "Unknown or expired cache key '0123456789abcdef'"),
    ("proxy", {"action": "call", "type": "tool"}, "Parameter 'path' is required for action 'call'"),
]


async def check_bad_input(client: Client) -> None:
    for tool, arguments, message in BAD_INPUT:
        result = await call(client, tool, arguments)
        assert result.is_error, (tool, arguments)
        assert message in text_of(result), (tool, arguments, text_of(result))
    with pytest.raises(MCPError, match="Unknown tool 'alpha:echo': this endpoint offers retrieve_tools"):
        await call(client, "alpha:echo", {"text": "x"})


def check_activity_log(stack: Stack) -> None:
    files = [stack.data_dir / name for name in ("state.sqlite", "state.sqlite-wal")]
    assert files[0].exists()
    for path in files:
        if path.exists():
            assert SECRET_ARGUMENT.encode() not in path.read_bytes()
    with sqlite3.connect(f"file:{files[0]}?mode=ro", uri=True) as db:
        stored = db.execute("SELECT COUNT(*) FROM calls WHERE arguments IS NOT NULL OR result IS NOT NULL").fetchone()
        rows = db.execute(
            "SELECT server, tool, variant, intent, outcome, duration_ms FROM calls ORDER BY id"
        ).fetchall()
    db.close()
    assert stored == (0,)  # arguments and results are kept only when the operator asks
    calls = [
        (server, tool, variant, json.loads(raw) if raw else None, outcome)
        for server, tool, variant, raw, outcome, _ in rows
    ]
    assert ("alpha", "echo", "call_tool_read", {"operation_type": "read"}, "ok") in calls
    assert ("alpha", "add", "call_tool_write", {"operation_type": "write", "reason": "sum for a test"}, "ok") in calls
    assert ("alpha", "touch", "call_tool_read", {"operation_type": "read"}, "blocked") in calls
    assert (
        "alpha",
        "touch",
        "call_tool_destructive",
        {"operation_type": "destructive", "data_sensitivity": "internal"},
        "ok",
    ) in calls
    assert ("alpha", "fail", "call_tool_read", {"operation_type": "read"}, "error") in calls
    assert ("beta", "touch", "call_tool_destructive", {"operation_type": "destructive"}, "blocked") in calls
    assert ("beta", "touch", "proxy", None, "blocked") in calls
    assert all(duration >= 0 for *_, duration in rows)


async def test_search_first_workflow_in_both_protocol_eras(tmp_path: Path) -> None:
    """Search, call, refusals, quarantine, large results and bad input, for 2025 and 2026 clients."""
    servers = {"alpha": echo_server("alpha"), "time": TIME_SERVER, "beta": echo_server("beta", quarantined=True)}
    settings = {"tool_response_limit": 1000}
    async with open_stack(tmp_path, servers, settings=settings) as stack:
        health = await stack.health()
        assert health["servers"]["beta"]["state"] == "ready", "a quarantined server still runs"
        for mode in MODES:
            scratch = tmp_path / mode
            scratch.mkdir()
            async with stack.client("/mcp", mode=mode) as client:
                await check_listing(client)
                await check_search(client)
                await check_describe(client)
                await check_call_variants(client, scratch)
                await check_quarantine(client, scratch)
                await check_read_cache(client)
                await check_bad_input(client)
                secret = await call(
                    client,
                    "call_tool_read",
                    {"name": "alpha:echo", "args": {"text": SECRET_ARGUMENT}, "intent": intent("read")},
                )
                assert text_of(secret) == SECRET_ARGUMENT
        check_activity_log(stack)


async def test_direct_endpoint_lists_the_management_tools_but_not_the_search_workflow(tmp_path: Path) -> None:
    servers = {"alpha": echo_server("alpha"), "beta": echo_server("beta", quarantined=True)}
    async with open_stack(tmp_path, servers) as stack, stack.client("/mcp/direct") as direct:
        names = [tool.name for tool in (await direct.list_tools()).tools]
        assert {"upstream_servers", "quarantine_security", "read_cache"} <= set(names)
        assert not {
            "retrieve_tools",
            "describe_tools",
            "call_tool_read",
            "call_tool_write",
            "call_tool_destructive",
        } & set(names)
        assert "alpha:echo" in names
        assert not any(name.startswith("beta:") for name in names)
        listed = data_of(await direct.call_tool("upstream_servers", {"operation": "list"}))
        assert [server["name"] for server in listed["servers"]] == ["alpha", "beta"]
        quarantined = data_of(await direct.call_tool("quarantine_security", {"action": "list"}))
        assert [entry["name"] for entry in quarantined["quarantined"]] == ["beta"]
        missing = await direct.call_tool("read_cache", {"key": "nope"})
        assert missing.is_error
        assert "Unknown or expired cache key 'nope'" in text_of(missing)
        assert text_of(await direct.call_tool("alpha:echo", {"text": "still direct"})) == "still direct"


async def upstream_list(client: Client) -> dict[str, dict[str, Any]]:
    listed = data_of(await call(client, "upstream_servers", {"operation": "list"}))
    return {server["name"]: server for server in listed["servers"]}


async def proposed(client: Client, arguments: dict[str, Any]) -> dict[str, Any]:
    """A client's change to the servers: pending until the operator approves it."""
    answer = data_of(await call(client, "upstream_servers", arguments))
    assert answer["pending"] is True, answer
    assert f"mcpvisor ctl approve {arguments['name']}" in answer["message"]
    return answer


async def operator_approves(stack: Stack, name: str) -> dict[str, Any]:
    code, decision = await stack.actl("approve", name)
    assert code == 0, decision
    return decision


async def test_upstream_servers_add_patch_disable_enable_restart_tail_and_remove(tmp_path: Path) -> None:
    """Given one server, a client proposes a second, changes it and removes it; each change once approved."""
    alpha = echo_server("alpha", env={"API_TOKEN": "sekrit-token-value", "MODE": "fast", "HOME_REF": "${env:HOME}"})
    async with open_stack(tmp_path, {"alpha": alpha}) as stack, stack.client("/mcp") as client:
        [listed] = (await upstream_list(client)).values()
        assert listed["name"] == "alpha"
        tool_count = (await stack.health())["servers"]["alpha"]["tools"]
        assert (listed["state"], listed["tool_count"], listed["enabled"], listed["quarantined"]) == (
            "ready",
            tool_count,
            True,
            False,
        )
        assert listed["transport"] == "stdio"
        assert listed["env"] == {"API_TOKEN": "***", "MODE": "fast", "HOME_REF": "${env:HOME}"}
        assert "sekrit-token-value" not in json.dumps(listed)

        gamma = echo_server("gamma")
        await proposed(
            client,
            {"operation": "add", "name": "gamma", "command": gamma["command"], "args_json": json.dumps(gamma["args"])},
        )
        assert "[servers.gamma]" not in stack.config_path.read_text()
        assert (await operator_approves(stack, "gamma"))["proposal"] == "add"
        assert "[servers.gamma]" in stack.config_path.read_text()
        # Quarantined by the operator until its tools are reviewed.
        code, blocked = await stack.actl("block", "gamma")
        assert code == 0 and blocked["quarantined"] is True, blocked

        async def gamma_ready() -> bool:
            server = (await upstream_list(client)).get("gamma")
            return server is not None and server["state"] == "ready"

        await wait_for(gamma_ready, what="gamma to start")
        assert (await upstream_list(client))["gamma"]["quarantined"] is True
        target = tmp_path / "gamma-touched.txt"
        touch = {"name": "gamma:touch", "args": {"path": str(target)}, "intent": intent("destructive")}
        assert "SECURITY QUARANTINE: server 'gamma'" in text_of(await call(client, "call_tool_destructive", touch))
        assert not target.exists()
        assert not [tool for tool in await search(client, "create a file", limit=100) if tool["server"] == "gamma"]

        # No MCP client may approve, not even the one that added the server: an operator does.
        refused = await call(client, "quarantine_security", {"action": "approve", "name": "gamma"})
        assert refused.is_error and "mcpvisor ctl approve gamma" in text_of(refused)
        code, approved = await stack.actl("approve", "gamma")
        assert code == 0, approved
        assert approved["quarantined"] is False
        assert "touch" in approved["approved_tools"]

        async def gamma_found() -> bool:
            return any(tool["server"] == "gamma" for tool in await search(client, "create a file", limit=100))

        await wait_for(gamma_found, what="gamma's tools in search after approval")
        assert not (await call(client, "call_tool_destructive", touch)).is_error
        assert target.read_text().startswith("gamma ")

        await proposed(client, {"operation": "patch", "name": "gamma", "env": {"A": "1", "B": "2"}})
        patched = await operator_approves(stack, "gamma")
        assert patched["config"]["env"] == {"A": "1", "B": "2"}
        await proposed(client, {"operation": "update", "name": "gamma", "env_json": '{"B": null}'})
        patched = await operator_approves(stack, "gamma")
        assert patched["config"]["env"] == {"A": "1"}
        assert patched["config"]["args"] == gamma["args"]

        await proposed(client, {"operation": "disable", "name": "gamma"})
        await operator_approves(stack, "gamma")

        async def gamma_disabled() -> bool:
            return (await upstream_list(client))["gamma"]["state"] == "disabled"

        await wait_for(gamma_disabled, what="gamma to be disabled")
        unavailable = await call(
            client, "call_tool_read", {"name": "gamma:echo", "args": {"text": "x"}, "intent": intent("read")}
        )
        assert "server 'gamma' is disabled" in text_of(unavailable)
        await proposed(client, {"operation": "enable", "name": "gamma"})
        await operator_approves(stack, "gamma")
        await wait_for(gamma_ready, what="gamma to be enabled again")

        restarted = await call(client, "upstream_servers", {"operation": "restart", "name": "gamma"})
        assert not restarted.is_error, text_of(restarted)
        await wait_for(gamma_ready, what="gamma to restart")
        tail = data_of(await call(client, "upstream_servers", {"operation": "tail_log", "name": "gamma", "lines": 5}))
        assert tail["name"] == "gamma"
        assert tail["logs"]
        assert all(len(lines) <= 5 for lines in tail["logs"].values())
        assert set(tail) == {"name", "operation", "logs"}, "log file paths stay private"

        blocked = data_of(await call(client, "quarantine_security", {"action": "block", "name": "gamma"}))
        assert blocked == {"name": "gamma", "quarantined": True}

        async def gamma_quarantined() -> bool:
            return (await upstream_list(client))["gamma"]["quarantined"]

        await wait_for(gamma_quarantined, what="gamma back in quarantine")
        assert "NOT executed" in text_of(await call(client, "call_tool_destructive", touch))

        await proposed(client, {"operation": "remove", "name": "gamma"})
        assert (await operator_approves(stack, "gamma"))["proposal"] == "remove"

        async def gamma_gone() -> bool:
            return "gamma" not in await upstream_list(client)

        await wait_for(gamma_gone, what="gamma to be removed")
        assert "[servers.gamma]" not in stack.config_path.read_text()
        gone = await call(
            client, "call_tool_read", {"name": "gamma:echo", "args": {"text": "x"}, "intent": intent("read")}
        )
        assert "no server 'gamma'" in text_of(gone)


async def test_tool_changed_after_approval_is_refused_until_approved_again(tmp_path: Path) -> None:
    """A rug pull: after approval the server's tool definitions change; calls are refused, inspect says why."""
    clock = {**TIME_SERVER, "quarantined": True}
    async with open_stack(tmp_path, {"clock": clock}) as stack, stack.client("/mcp") as client:
        read_time = {"name": "clock:get_current_time", "args": {"timezone": "UTC"}, "intent": intent("read")}
        assert "SECURITY QUARANTINE" in text_of(await call(client, "call_tool_read", read_time))
        code, approved = await stack.actl("approve", "clock")
        assert code == 0 and approved["quarantined"] is False, approved

        async def answers() -> bool:
            return not (await call(client, "call_tool_read", read_time)).is_error

        await wait_for(answers, what="the approved server to answer")

        # The server's tool descriptions name its local timezone: a new one changes the definitions.
        patch = {
            "operation": "patch",
            "name": "clock",
            "args": ["-m", "mcp_server_time", "--local-timezone", "Europe/Paris"],
        }
        await proposed(client, patch)
        await operator_approves(stack, "clock")

        async def refused() -> str:
            answer = await call(client, "call_tool_read", read_time)
            return text_of(answer) if answer.is_error and "CHANGED SINCE APPROVAL" in text_of(answer) else ""

        message = await wait_for(refused, what="the changed tool to be refused")
        assert "'clock:get_current_time' is not the one approved" in message
        assert "NOT executed" in message
        assert not [
            tool for tool in await search(client, "current time", limit=100) if tool["name"] == "clock:get_current_time"
        ]
        assert "clock:get_current_time" not in json.dumps(await default_answer(client, "current time"))
        [withheld] = data_of(await call(client, "describe_tools", {"names": ["clock:get_current_time"]}))["tools"]
        assert withheld["error"].startswith("Its definition changed since approval")
        assert "inputSchema" not in withheld
        inspected = data_of(await call(client, "quarantine_security", {"action": "inspect", "name": "clock"}))
        approval = {tool["tool"]: tool["approval"] for tool in inspected["tools"]}
        assert approval == {"get_current_time": "changed since approval", "convert_time": "changed since approval"}
        listed = data_of(await call(client, "quarantine_security", {"action": "list"}))
        assert listed["changed_since_approval"] == [
            {"name": "clock", "changed": ["convert_time", "get_current_time"], "added": [], "removed": []}
        ]

        code, approved = await stack.actl("approve", "clock")
        assert code == 0, approved
        assert json.loads(text_of(await call(client, "call_tool_read", read_time)))["timezone"] == "UTC"
        inspected = data_of(await call(client, "quarantine_security", {"action": "inspect", "name": "clock"}))
        assert {tool["approval"] for tool in inspected["tools"]} == {"approved"}
