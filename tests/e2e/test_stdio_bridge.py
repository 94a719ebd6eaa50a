"""`mcpvisor stdio`: the SDK's stdio client drives the bridge over pipes, through a whole stack."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import mcp_types as types
import trio
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError

from tests.support.stack import (
    Stack,
    echo_server,
    free_port,
    open_stack,
    python_server,
    stop_stack,
    write_config,
)


def bridge(*args: str) -> StdioServerParameters:
    """`mcpvisor stdio ARGS` as the stdio client's server command."""
    return StdioServerParameters(
        command=sys.executable, args=["-P", "-m", "mcpvisor.supervisor", "stdio", *args], env=dict(os.environ)
    )


class Notices:
    """The list_changed notifications a client has received."""

    def __init__(self) -> None:
        self.methods: list[str] = []
        self.tools_changed = trio.Event()

    async def __call__(self, message: Any) -> None:
        if isinstance(message, types.ServerNotification):
            self.methods.append(message.method)
            if message.method == "notifications/tools/list_changed":
                self.tools_changed.set()


async def restart(stack: Stack) -> None:
    """Stop the whole stack (supervisor, frontend, workers, upstreams) and start it again on its config."""
    await stop_stack(stack)
    with open(stack.data_dir / "supervisor.out", "ab") as out:
        stack.process = subprocess.Popen(
            [sys.executable, "-P", "-m", "mcpvisor.supervisor", "serve", "-c", str(stack.config_path)],
            stdout=out,
            stderr=out,
            env=stack.env,
            start_new_session=True,
        )
    await stack.wait_ready(["echo"], timeout=90)


def text_of(result: types.CallToolResult) -> str:
    assert not result.is_error, result
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def test_a_handshake_client_lists_and_calls_tools_and_keeps_its_session_across_a_restart(
    tmp_path: Path,
) -> None:
    """Given a stack and a handshake-era client on `mcpvisor stdio URL`, tools list and run, and a server
    disabled meanwhile is announced on the session's GET stream; when the whole stack restarts, a call in
    flight fails (it is not sent twice), the client hears tools/list_changed, and its next calls reach the
    new upstream."""
    servers = {"echo": echo_server(policy={"stopwaitsecs": 1}), "other": echo_server("other")}
    async with open_stack(tmp_path, servers) as stack:
        notices = Notices()
        async with Client(bridge(stack.direct_url), mode="legacy", message_handler=notices) as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert {"echo:echo", "echo:add", "echo:pid"} <= names
            assert text_of(await client.call_tool("echo:echo", {"text": "over stdio"})) == "over stdio"
            result = await client.call_tool("echo:weather", {"city": "Oslo"})
            assert result.structured_content == {"city": "Oslo", "temperature": 21.5, "conditions": "sunny"}
            first_pid = int(text_of(await client.call_tool("echo:pid", {})))

            assert "other:echo" in names
            code, _ = await stack.actl("disable", "other")
            assert code == 0
            with trio.fail_after(30):
                await notices.tools_changed.wait()
            assert not any(tool.name.startswith("other:") for tool in (await client.list_tools()).tools)
            notices.tools_changed = trio.Event()

            in_flight: list[BaseException] = []

            async def slow_call() -> None:
                try:
                    await client.call_tool("echo:slow", {"seconds": 120})
                except MCPError as exc:
                    in_flight.append(exc)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(slow_call)
                await trio.sleep(1)
                await restart(stack)
                with trio.fail_after(30):
                    await notices.tools_changed.wait()
            assert len(in_flight) == 1
            second_pid = int(text_of(await client.call_tool("echo:pid", {})))
            assert second_pid != first_pid
            assert {"echo:echo", "echo:add"} <= {tool.name for tool in (await client.list_tools()).tools}
            assert text_of(await client.call_tool("echo:add", {"a": 2, "b": 3})) == "5"


async def test_a_2026_client_lists_and_calls_tools_before_and_after_a_restart(tmp_path: Path) -> None:
    """Given a stack and a 2026-07-28 client on the bridge, when the stack restarts between two calls, the
    second call still succeeds."""
    # The version is pinned rather than probed: the SDK's server/discover probe allows 10 seconds, counted
    # from the bridge's start, which a loaded test machine can use up before the bridge reads its stdin.
    async with (
        open_stack(tmp_path, {"echo": echo_server()}) as stack,
        Client(bridge(stack.direct_url), mode="2026-07-28") as client,
    ):
        assert client.session.protocol_version == "2026-07-28"
        assert "echo:echo" in {tool.name for tool in (await client.list_tools()).tools}
        assert text_of(await client.call_tool("echo:echo", {"text": "modern"})) == "modern"
        await restart(stack)
        assert text_of(await client.call_tool("echo:echo", {"text": "again"})) == "again"


async def test_upstream_requests_reach_the_stdio_client(tmp_path: Path) -> None:
    """Given an upstream that asks the client for sampling during a call, the request crosses the bridge
    to the stdio client and its answer goes back to the upstream."""
    async with open_stack(tmp_path, {"conf": python_server("conformance_server.py")}) as stack:
        asked: list[str] = []

        async def sample(_context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
            content = params.messages[0].content
            asked.append(content.text if isinstance(content, types.TextContent) else "")
            return types.CreateMessageResult(
                role="assistant", content=types.TextContent(type="text", text="a sampled answer"), model="test"
            )

        async with Client(bridge(stack.direct_url), mode="legacy", sampling_callback=sample) as client:
            result = await client.call_tool("conf:test_sampling", {"prompt": "what is up?"})
            assert text_of(result) == "LLM response: a sampled answer"
            assert asked == ["what is up?"]


async def test_serve_starts_mcpvisor_when_none_answers_and_stops_it_on_exit(tmp_path: Path) -> None:
    """Given a config nobody serves, `mcpvisor stdio --serve -c CONFIG` starts mcpvisor, bridges to it,
    and stops it when the client goes away."""
    port = free_port()
    config = tmp_path / "mcpvisor.toml"
    write_config(
        config,
        {"echo": echo_server()},
        {"listen": f"127.0.0.1:{port}", "enable_direct_endpoint": True, "data_dir": str(tmp_path / "data")},
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = {**os.environ, "XDG_RUNTIME_DIR": str(run_dir)}
    env.pop("RUNTIME_DIRECTORY", None)
    params = StdioServerParameters(
        command=sys.executable,
        args=["-P", "-m", "mcpvisor.supervisor", "stdio", "--serve", "-c", str(config), "--path", "/mcp/direct"],
        env=env,
    )
    async with Client(params, mode="legacy") as client:
        with trio.fail_after(30):
            while "echo:echo" not in {tool.name for tool in (await client.list_tools()).tools}:
                await trio.sleep(0.2)
        assert text_of(await client.call_tool("echo:echo", {"text": "served"})) == "served"
        supervisors = _supervisors_of(config)
        assert len(supervisors) == 1
    with trio.fail_after(30):
        while any(_alive(pid) for pid in supervisors):
            await trio.sleep(0.1)


def _supervisors_of(config: Path) -> list[int]:
    """Pids of `mcpvisor serve -c CONFIG` processes, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in argv and str(config).encode() in argv:
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_bad_arguments_get_a_clear_error() -> None:
    """--serve without a config, and a config that is not TOML, are refused with a message and status 2."""
    result = subprocess.run(
        [sys.executable, "-P", "-m", "mcpvisor.supervisor", "stdio", "--serve"],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert result.returncode == 2
    assert "--serve needs -c CONFIG" in result.stderr
    assert result.stdout == ""


def test_a_config_that_is_not_toml_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "broken.toml"
    config.write_text("[mcpvisor\nlisten = ")
    result = subprocess.run(
        [sys.executable, "-P", "-m", "mcpvisor.supervisor", "stdio", "-c", str(config)],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2
    assert "is not valid TOML" in result.stderr
    assert result.stdout == ""


async def test_malformed_lines_get_json_rpc_errors_and_the_bridge_goes_on(tmp_path: Path) -> None:
    """A line that is not JSON gets a parse error on stdout; a following valid request is still answered."""
    async with open_stack(tmp_path, {"echo": echo_server()}) as stack:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-P", "-m", "mcpvisor.supervisor", "stdio", stack.direct_url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        try:
            assert process.stdin is not None and process.stdout is not None
            init = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "pipes", "version": "0"},
                },
            }
            await process.stdin.send_all(b"this is not json\n" + json.dumps(init).encode() + b"\n")
            lines = _lines(process.stdout)
            with trio.fail_after(30):
                first = json.loads(await lines.__anext__())
                second = json.loads(await lines.__anext__())
            assert first["error"]["code"] == -32700 and first["id"] is None
            assert second["id"] == 1 and second["result"]["serverInfo"]
        finally:
            process.send_signal(signal.SIGTERM)
            with trio.fail_after(15):
                await process.wait()


async def _lines(stream: trio.abc.ReceiveStream) -> Any:
    buffer = b""
    while True:
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield line
        chunk = await stream.receive_some(65536)
        if not chunk:
            return
        buffer += chunk
