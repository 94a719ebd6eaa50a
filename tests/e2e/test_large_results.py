"""Large answers are answers, not hangs: up to `max_result_bytes` they arrive whole, above it the call
fails with both sizes named, and in neither case is the upstream taken for hung or restarted."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp.shared.exceptions import MCPError

from tests.support.stack import Stack, descendants, open_stack, python_server

MIB = 1024 * 1024


def bulk(*flags: str, sandbox: dict[str, Any] | None = None, **policy: Any) -> dict[str, Any]:
    extra = {"sandbox": sandbox} if sandbox is not None else {}
    return python_server("raw_server.py", *flags, policy={"call_timeout": 120, **policy}, **extra)


def processes(stack: Stack, name: str) -> tuple[int, set[int]]:
    """The worker's pid and its upstream's (the processes below it)."""
    worker = stack.status()[name]["pid"]
    return worker, descendants(worker)


async def big_call(client: Any, tool: str, size: int, pause: float = 0.0) -> Any:
    with trio.fail_after(120):
        return await client.call_tool(tool, {"size": size, "pause": pause})


async def error_of(client: Any, tool: str, size: int) -> str:
    """What the client is told about a call that must fail (an error result or a JSON-RPC error)."""
    try:
        result = await big_call(client, tool, size)
    except MCPError as exc:
        return exc.error.message
    assert result.is_error, "a result over the limit came back as a success"
    return result.content[0].text


@pytest.mark.parametrize("mode", ["auto", "legacy"])  # 2026-07-28, and the handshake era's SSE answer
async def test_a_25_mib_result_reaches_the_client_whole_and_the_upstream_lives_on(tmp_path: Path, mode: str) -> None:
    async with open_stack(tmp_path, {"bulk": bulk()}) as stack:
        before = processes(stack, "bulk")
        async with stack.client(mode=mode) as client:
            result = await big_call(client, "bulk:big", 25 * MIB)
            assert not result.is_error
            text = result.content[0].text
            assert len(text) == 25 * MIB - len('{"content":[{"type":"text","text":""}]}')
            assert set(text) == {"x"}
            # The same session goes on, on the same processes.
            assert (await client.call_tool("bulk:echo", {"text": "after"})).content[0].text == "after"
        assert processes(stack, "bulk") == before


async def test_a_result_over_max_result_bytes_is_an_error_naming_its_size_and_the_limit(tmp_path: Path) -> None:
    servers = {"bulk": bulk(), "late": bulk("--id-last")}
    async with open_stack(tmp_path, servers, settings={"max_result_bytes": MIB}) as stack:
        before = {name: processes(stack, name) for name in servers}
        async with stack.client() as client:
            at_limit = await big_call(client, "bulk:big", MIB)
            assert not at_limit.is_error
            for tool in ("bulk:big", "late:big"):  # the answer's id first, and last
                message = await error_of(client, tool, MIB + 1)
                assert "1,048,576 (max_result_bytes)" in message, message
                assert "bytes, over the limit" in message, message
                still = await client.call_tool(tool.replace("big", "echo"), {"text": "still"})
                assert still.content[0].text == "still"
            # Far over the limit: the worker counts it as it streams by and keeps none of it.
            message = await error_of(client, "bulk:big", 20 * MIB)
            assert "20,971,5" in message, message
        assert {name: processes(stack, name) for name in servers} == before
        assert stack.status()["bulk"]["restarts"] == 0


async def test_an_upstream_slow_to_write_a_large_answer_is_not_taken_for_hung(tmp_path: Path) -> None:
    """Its pings wait behind the answer for longer than ping_timeout; bytes keep coming, so it lives."""
    servers = {"bulk": bulk(ping_interval=0.5, ping_timeout=1)}
    async with open_stack(tmp_path, servers) as stack:
        before = processes(stack, "bulk")
        async with stack.client() as client:
            result = await big_call(client, "bulk:big", 8 * MIB, pause=0.4)  # about 3 s of writing
            assert not result.is_error
            assert len(result.content[0].text) > 8 * MIB - 100
        assert processes(stack, "bulk") == before
        assert stack.status()["bulk"]["upstream"] == "ready"


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="system package missing: bubblewrap")
async def test_a_25_mib_result_of_a_sandboxed_upstream_arrives_whole(tmp_path: Path) -> None:
    """The same road through bubblewrap: the sandbox's pipe, its memory limit (the upstream's alone)."""
    servers = {"bulk": bulk(sandbox={"enabled": True, "network": False})}
    async with open_stack(tmp_path, servers) as stack:
        before = processes(stack, "bulk")
        async with stack.client() as client:
            result = await big_call(client, "bulk:big", 25 * MIB)
            assert not result.is_error
            assert len(result.content[0].text) == 25 * MIB - len('{"content":[{"type":"text","text":""}]}')
        assert processes(stack, "bulk") == before
