"""code_execution, list_registries, search_servers and add_from_registry on a real stack.

The scripts run in real sandbox processes and every inner call goes through the frontend's door
to real upstream workers; the registry is tests/upstreams/registry_server.py on loopback, serving
recorded entries in the official schema, one of which points at a real upstream over HTTP.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
import trio
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.support.stack import UPSTREAMS, Stack, echo_server, free_port, open_stack, wait_listening

TIMEOUT_MS = 4000


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(item.text for item in result.content if isinstance(item, types.TextContent))


async def run_code(client: Client, **arguments: Any) -> tuple[bool, dict[str, Any]]:
    """(is_error, the JSON answer) of one code_execution call."""
    with trio.fail_after(60):
        result = await client.call_tool("code_execution", arguments)
    return bool(result.is_error), json.loads(text_of(result))


async def value_of(client: Client, **arguments: Any) -> Any:
    is_error, answer = await run_code(client, **arguments)
    assert not is_error, answer
    return answer["value"]


async def error_of(client: Client, **arguments: Any) -> dict[str, str]:
    is_error, answer = await run_code(client, **arguments)
    assert is_error, answer
    return answer["error"]


def recorded_calls(stack: Stack) -> list[tuple[str, str, str, str]]:
    db = sqlite3.connect(f"file:{stack.data_dir / 'state.sqlite'}?mode=ro", uri=True)
    try:
        return list(db.execute("SELECT server, tool, variant, outcome FROM calls"))
    finally:
        db.close()


async def test_code_execution_through_the_door(tmp_path: Path) -> None:
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "sum-and-echo.js").write_text(
        "var s = call_tool('echo', 'add', {a: input.a, b: input.b});\n"
        "call_tool('other', 'echo', {text: 'sum=' + s.result.content[0].text}).result.content[0].text"
    )
    (scripts / "typed.ts").write_text("const n: number = input.n;\n({twice: n * 2})")
    marker = tmp_path / "touched"
    servers = {
        "echo": echo_server("echo"),
        "other": echo_server("other"),
        "held": echo_server("held", quarantined=True),
    }
    settings = {
        "enable_code_execution": True,
        "code_execution_timeout_ms": TIMEOUT_MS,
        "code_execution_max_tool_calls": 20,
    }
    async with open_stack(tmp_path, servers, settings=settings, wait_for=["echo", "other"]) as stack:
        async with stack.client("/mcp/direct") as client, stack.client("/mcp") as search_client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert {"code_execution", "list_registries", "search_servers"} <= names
            assert "code_execution" in {tool.name for tool in (await search_client.list_tools()).tools}

            # Two tools chained, on two servers; the value of the last expression is the answer.
            chained = (
                "var s = call_tool('echo', 'add', {a: 2, b: 3});\n"
                "var e = call_tool('other', 'echo', {text: 'sum=' + s.result.content[0].text});\n"
                "log('added');\n"
                "({text: e.result.content[0].text})"
            )
            is_error, answer = await run_code(client, code=chained)
            assert not is_error and answer == {"ok": True, "value": {"text": "sum=5"}, "logs": ["added"]}

            # Fan out, in order.
            fan = (
                "call_tools([1, 2, 3, 4, 5].map(n => ({server: 'echo', tool: 'echo', args: {text: 'n' + n}})),"
                " {max_parallel: 3}).map(s => s.result.content[0].text)"
            )
            assert await value_of(search_client, code=fan) == ["n1", "n2", "n3", "n4", "n5"]

            # Errors are values the script can handle.
            handled = (
                "var f = call_tool('echo', 'fail', {message: 'kaput'});\n"
                "var u = call_tool('echo', 'no_such_tool', {});\n"
                "var d = call_tool('nowhere', 'echo', {text: 'x'});\n"
                "[f.ok, f.error.code, f.error.message.includes('Error executing tool fail'), u.error.code, d.error.code]"
            )
            assert await value_of(client, code=handled) == [
                False,
                "TOOL_ERROR",
                True,
                "TOOL_NOT_FOUND",
                "TOOL_NOT_FOUND",
            ]

            # Stored scripts and TypeScript.
            assert await value_of(client, script="sum-and-echo", input={"a": 20, "b": 22}) == "sum=42"
            assert await value_of(client, script="typed", input={"n": 21}) == {"twice": 42}
            typescript = "interface P { text: string }\nconst p: P = {text: 'typed'};\ncall_tool('echo', 'echo', p).result.content[0].text"
            assert await value_of(client, code=typescript, language="typescript") == "typed"

            # A quarantined server's tool is refused; a destructive one needs the declared intent.
            held = "var r = call_tool('held', 'echo', {text: 'x'}); [r.ok, r.error.code]"
            assert await value_of(client, code=held) == [False, "QUARANTINED"]
            touch = (
                f"var r = call_tool('echo', 'touch', {{path: {json.dumps(str(marker))}}}); r.ok ? 'ran' : r.error.code"
            )
            assert await value_of(client, code=touch, intent={"operation_type": "write"}) == "DESTRUCTIVE_NOT_DECLARED"
            assert not marker.exists()
            assert await value_of(client, code=touch, intent={"operation_type": "destructive"}) == "ran"
            assert marker.exists()

            # Hostile code ends with a clear error while other calls on the same stack keep working.
            order: list[str] = []

            async def loop() -> None:
                error = await error_of(client, code="while (true) {}")
                assert error["code"] == "TIMEOUT"
                order.append("loop")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(loop)
                await trio.sleep(0.5)
                with trio.fail_after(30):
                    plain = await search_client.call_tool(
                        "call_tool_read",
                        {
                            "name": "echo:echo",
                            "args": {"text": "still served"},
                            "intent": {"operation_type": "read"},
                        },
                    )
                assert "still served" in text_of(plain)
                assert await value_of(search_client, code="'another run'") == "another run"
                order.append("others")
            assert order == ["others", "loop"]

            hostile = {
                "require('fs').readFileSync('/etc/passwd', 'utf8')": "require is not defined",
                "process.env.HOME": "process is not defined",
                "fetch('http://127.0.0.1:1/')": "fetch is not defined",
                "Deno.readTextFileSync('/etc/passwd')": "Deno is not defined",
                "function r(n) { return r(n + 1) + 1 }\nr(0)": "Maximum call stack size exceeded",
            }
            for code, fragment in hostile.items():
                error = await error_of(client, code=code)
                assert error["code"] == "RUNTIME_ERROR" and fragment in error["message"], error
            bomb = await error_of(client, code="var a = []; for (;;) a.push(new Array(100000).fill(1.5))")
            assert bomb["code"] in ("HEAP_LIMIT", "SANDBOX_CRASHED", "TIMEOUT"), bomb
            syntax = await error_of(client, code="var ok = 1;\nvar broken = ;")
            assert syntax["code"] == "SYNTAX_ERROR" and "line 2" in syntax["message"]
            many = await error_of(client, code="for (;;) call_tool('echo', 'echo', {text: 'again'})")
            assert many["code"] == "MAX_TOOL_CALLS_EXCEEDED"
            bad = await error_of(client, code="1", script="typed")
            assert bad["code"] == "INVALID_INPUT"

            assert await value_of(client, code="call_tool('echo', 'echo', {text: 'after all that'}).ok") is True

            # A long answer is cut at tool_response_limit like an upstream's; read_cache has the rest.
            with trio.fail_after(60):
                long = await client.call_tool("code_execution", {"code": "'x'.repeat(30000)"})
            assert not long.is_error and "read_cache" in text_of(long)

        # Inner calls are recorded like any other call, under their own variant.
        recorded = recorded_calls(stack)
        assert ("other", "echo", "code_execution", "ok") in recorded
        assert ("echo", "touch", "code_execution", "blocked") in recorded
        assert ("echo", "touch", "code_execution", "ok") in recorded
        assert ("held", "echo", "code_execution", "blocked") in recorded


async def test_code_execution_is_off_by_default(tmp_path: Path) -> None:
    async with open_stack(tmp_path, {"echo": echo_server("echo")}) as stack, stack.client("/mcp/direct") as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert "code_execution" not in names
        assert {"list_registries", "search_servers"} <= names
        with trio.fail_after(30), pytest.raises(MCPError, match="Unknown tool 'code_execution'"):
            await client.call_tool("code_execution", {"code": "1"})


@contextmanager
def running(*command: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


async def test_registries_and_add_from_registry(tmp_path: Path) -> None:
    remote_port = free_port()
    with (
        running(
            sys.executable, str(UPSTREAMS / "echo_server.py"), "--name", "remote", "--http", str(remote_port)
        ) as remote,
        running(
            sys.executable,
            str(UPSTREAMS / "registry_server.py"),
            "--port",
            "0",
            "--remote-url",
            f"http://127.0.0.1:{remote_port}/mcp",
        ) as registry,
    ):
        assert registry.stdout is not None
        registry_port = int(registry.stdout.readline().split()[-1])
        await wait_listening(remote_port, remote)  # type: ignore[arg-type]
        tables = {"registries": {"test": {"name": "Test registry", "url": f"http://127.0.0.1:{registry_port}"}}}
        settings = {"allow_private_registry_fetch": True}
        stack_cm = open_stack(tmp_path, {"echo": echo_server("echo")}, settings=settings, tables=tables)
        async with stack_cm as stack, stack.client("/mcp/direct") as client:
            with trio.fail_after(30):
                listed = json.loads(text_of(await client.call_tool("list_registries", {})))
            assert [(r["id"], r["builtin"]) for r in listed["registries"]] == [("reference", True), ("test", False)]

            with trio.fail_after(30):
                found = await client.call_tool("search_servers", {"registry": "test", "search": "paged", "limit": 3})
            assert [s["name"] for s in json.loads(text_of(found))["servers"]] == [
                "io.github.example/paged-00",
                "io.github.example/paged-01",
                "io.github.example/paged-02",
            ]
            with trio.fail_after(30):
                weather = json.loads(
                    text_of(await client.call_tool("search_servers", {"registry": "test", "search": "weather"}))
                )
            hit = weather["servers"][0]
            assert hit["config"]["command"] == "npx" and hit["needs"]["needs_secrets"] is True
            with trio.fail_after(30):
                offline = json.loads(
                    text_of(await client.call_tool("search_servers", {"registry": "reference", "search": "time"}))
                )
            assert offline["servers"][0]["config"] == {"command": "uvx", "args": ["mcp-server-time"]}
            with trio.fail_after(30):
                bad = await client.call_tool("search_servers", {"registry": "test", "limit": 51})
            assert bad.is_error and "from 1 to 50" in text_of(bad)

            # The registry's server is proposed: nothing runs until the operator approves it.
            with trio.fail_after(30):
                proposed = await client.call_tool(
                    "upstream_servers",
                    {"operation": "add_from_registry", "registry": "test", "id": "io.mcpvisor.test/conformance"},
                )
            answer = json.loads(text_of(proposed))
            assert not proposed.is_error, answer
            assert answer["registry"]["server"] == "io.mcpvisor.test/conformance"
            assert answer.get("pending") is True, answer
            await trio.sleep(2)
            assert "conformance" not in stack.status()
            with trio.fail_after(30):
                try:
                    early = await client.call_tool("conformance:echo", {"text": "too early"})
                    assert early.is_error, text_of(early)
                except MCPError as exc:
                    assert "conformance" in str(exc)

            code, _ = await stack.actl("approve", "conformance")
            assert code == 0
            await stack.wait_ready(["echo", "conformance"])
            with trio.fail_after(30):
                result = await client.call_tool("conformance:echo", {"text": "approved"})
            assert not result.is_error and "approved" in text_of(result)
