"""The spine, end to end: a real client, a real supervisor, workers and upstream servers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest
import trio
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.support.stack import UPSTREAMS, alive, echo_server, free_port, open_stack, wait_listening

TIME_SERVER = {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}


async def test_time_upstream_answers_through_its_worker(tmp_path: Path) -> None:
    """Given mcp-server-time behind mcpvisor, a client calls time:get_current_time and gets UTC time."""
    async with open_stack(tmp_path, {"time": TIME_SERVER}) as stack, stack.client() as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert {"time:get_current_time", "time:convert_time"} <= names
        result = await client.call_tool("time:get_current_time", {"timezone": "UTC"})
        assert not result.is_error
        assert result.structured_content is not None
        assert result.structured_content["timezone"] == "UTC"
        assert result.structured_content["datetime"].endswith("+00:00")


async def serve_http_upstream(name: str, flag: str = "--http") -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(UPSTREAMS / "echo_server.py"), "--name", name, flag, str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    await wait_listening(port, process)
    return process, port


async def test_same_tool_name_on_stdio_http_and_sse_upstreams_told_apart(tmp_path: Path) -> None:
    """Three upstreams expose `echo` and `greet`; the server prefix picks which one answers."""
    http, http_port = await serve_http_upstream("over-http")
    sse, sse_port = await serve_http_upstream("over-sse", "--sse")
    try:
        servers = {
            "local": echo_server("over-stdio"),
            "remote": {"url": f"http://127.0.0.1:{http_port}/mcp"},
            "legacy": {"url": f"http://127.0.0.1:{sse_port}/sse"},
        }
        async with open_stack(tmp_path, servers) as stack, stack.client() as client:
            tools = {tool.name for tool in (await client.list_tools()).tools}
            assert {"local:echo", "remote:echo", "legacy:echo"} <= tools
            for server, upstream in (
                ("local", "over-stdio"),
                ("remote", "over-http"),
                ("legacy", "over-sse"),
            ):
                echoed = await client.call_tool(f"{server}:echo", {"text": f"hello {server}"})
                assert echoed.content[0].text == f"hello {server}"
                prompt = await client.get_prompt(f"{server}:greet", {"who": "Ada"})
                assert prompt.messages[0].content.text == f"Say hello to Ada from {upstream}."
    finally:
        for process in (http, sse):
            process.kill()
            process.wait()


async def test_tool_definitions_and_results_pass_through_unchanged(tmp_path: Path) -> None:
    """Annotations, title, outputSchema, _meta and structuredContent reach the client as the upstream sent them."""
    http, port = await serve_http_upstream("same")
    try:
        async with Client(f"http://127.0.0.1:{port}/mcp", mode="legacy") as upstream:
            direct_tools = {
                t.name: t.model_dump(by_alias=True, exclude_none=True) for t in (await upstream.list_tools()).tools
            }
            direct_weather = await upstream.call_tool("weather", {"city": "Oslo"})
        async with open_stack(tmp_path, {"same": echo_server("same")}) as stack:
            for mode in ("legacy", "auto"):
                async with stack.client(mode=mode) as client:
                    proxied = {
                        t.name: t.model_dump(by_alias=True, exclude_none=True)
                        for t in (await client.list_tools()).tools
                    }
                    # Besides the upstream's tools, /mcp/direct lists mcpvisor's management tools.
                    assert {name for name in proxied if ":" in name} == {f"same:{name}" for name in direct_tools}
                    for name, definition in direct_tools.items():
                        assert proxied[f"same:{name}"] == {**definition, "name": f"same:{name}"}
                    assert proxied["same:echo"]["annotations"] == {"readOnlyHint": True}
                    assert proxied["same:touch"]["annotations"] == {"destructiveHint": True}
                    assert proxied["same:weather"]["title"] == "Weather report"
                    assert proxied["same:add"]["_meta"] == {"origin": "tests"}
                    assert "outputSchema" in proxied["same:weather"]
                    weather = await client.call_tool("same:weather", {"city": "Oslo"})
                    assert weather.structured_content == direct_weather.structured_content
                    assert weather.content == direct_weather.content
    finally:
        http.kill()
        http.wait()


async def test_resources_templates_and_prompts_are_aggregated_and_routed(tmp_path: Path) -> None:
    servers = {"a": echo_server("alpha"), "b": echo_server("beta")}
    async with open_stack(tmp_path, servers) as stack, stack.client() as client:
        templates = (await client.list_resource_templates()).resource_templates
        assert [t.uri_template for t in templates] == ["test://items/{item_id}", "test://items/{item_id}"]
        readme = await client.read_resource("test://readme")
        assert readme.contents[0].text == "readme of alpha"  # both offer it; the first server by name serves it
        item = await client.read_resource("test://items/7")
        assert item.contents[0].text == "item 7 of alpha"
        prompts = {p.name for p in (await client.list_prompts()).prompts}
        assert prompts == {"a:greet", "b:greet"}
        with pytest.raises(MCPError, match="Unknown resource 'nope://x'"):
            await client.read_resource("nope://x")
        with pytest.raises(MCPError, match="Unknown prompt 'c:greet'"):
            await client.get_prompt("c:greet", {"who": "x"})


async def test_unknown_names_get_clear_errors_at_once(tmp_path: Path) -> None:
    async with open_stack(tmp_path, {"echo": echo_server()}) as stack, stack.client() as client:
        with trio.fail_after(5):
            with pytest.raises(MCPError, match=r"Unknown tool 'nope:echo': no server 'nope' \(servers: echo\)"):
                await client.call_tool("nope:echo", {})
            with pytest.raises(MCPError, match="Unknown tool 'echo:nope': server 'echo' has no tool 'nope'"):
                await client.call_tool("echo:nope", {})
            with pytest.raises(MCPError, match="upstream tools are named 'server:tool'"):
                await client.call_tool("echo", {})
            # A tool that fails upstream is a result with isError, as MCP says, not a protocol error.
            failed = await client.call_tool("echo:fail", {"message": "kaput"})
            assert failed.is_error


async def test_call_timeout_names_the_server_and_returns_promptly(tmp_path: Path) -> None:
    servers = {"echo": echo_server(policy={"call_timeout": 1})}
    async with open_stack(tmp_path, servers) as stack, stack.client() as client:
        with (
            trio.fail_after(6),
            pytest.raises(MCPError, match="Tool 'echo:slow': no answer from server 'echo' within 1s"),
        ):
            await client.call_tool("echo:slow", {"seconds": 30})
        # The worker is still healthy afterwards.
        assert (await client.call_tool("echo:echo", {"text": "still here"})).content[0].text == "still here"


async def test_killed_upstream_fails_calls_clearly_instead_of_hanging(tmp_path: Path) -> None:
    async with open_stack(tmp_path, {"echo": echo_server()}) as stack, stack.client() as client:
        upstream_pid = int((await client.call_tool("echo:pid", {})).content[0].text)
        assert upstream_pid in stack.pids()

        async def slow_call() -> MCPError | None:
            try:
                await client.call_tool("echo:slow", {"seconds": 30})
            except MCPError as exc:
                return exc
            return None

        async with trio.open_nursery() as nursery:
            outcome: list[MCPError | None] = []

            async def run() -> None:
                outcome.append(await slow_call())

            nursery.start_soon(run)
            await trio.sleep(0.5)
            os.kill(upstream_pid, signal.SIGKILL)
            with trio.fail_after(5):
                while not outcome:
                    await trio.sleep(0.05)
        assert outcome[0] is not None
        assert "echo" in outcome[0].error.message
        assert "closed the connection" in outcome[0].error.message
        with trio.fail_after(5):
            while alive(upstream_pid):
                await trio.sleep(0.05)
        # Until the worker has reconnected, calls fail at once with the server's state.
        with trio.fail_after(3):
            try:
                await client.call_tool("echo:echo", {"text": "x"})
            except MCPError as exc:
                assert "echo" in exc.error.message


async def test_upstream_that_cannot_start_is_reported_not_hung(tmp_path: Path) -> None:
    servers = {"good": echo_server(), "broken": echo_server("broken", "--exit-at-once")}
    async with open_stack(tmp_path, servers, wait_for=["good"]) as stack, stack.client() as client:
        with trio.fail_after(5), pytest.raises(MCPError, match="'broken'"):
            await client.call_tool("broken:echo", {"text": "x"})
        assert (await client.call_tool("good:echo", {"text": "fine"})).content[0].text == "fine"
        tools = {t.name for t in (await client.list_tools()).tools}
        assert not any(name.startswith("broken:") for name in tools)
        # The call above may have been refused while the worker was still spawning the upstream:
        # its last words reach the log once it has run, which on a loaded machine comes later.
        with trio.fail_after(20):
            while "exiting at once, as asked" not in stack.log("broken.stderr.log"):
                await trio.sleep(0.05)
        assert (await stack.health())["servers"]["broken"]["state"] != "ready"


async def test_direct_endpoint_is_404_when_disabled(tmp_path: Path) -> None:
    settings = {"enable_direct_endpoint": False}
    async with open_stack(tmp_path, {"echo": echo_server()}, settings=settings) as stack:
        async with httpx2.AsyncClient() as http:
            response = await http.post(stack.direct_url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert response.status_code == 404


def run_serve(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mcpvisor.supervisor", "serve", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[servers.time]\ncomand = "x"\n', r"line 2: unknown key `servers.time.comand`"),
        (
            '[servers.time]\ncommand = "x"\n[servers.time.policy]\nstartsecs = "soon"\n',
            r"line 4: `servers.time.policy.startsecs`: Expected `float`, got `str`",
        ),
        ('[mcpvisor]\nlisten = "8080"\n', r"listen must be HOST:PORT"),
        ("[servers\n", r"Expected ']'"),
        ('[servers."bad:name"]\ncommand = "x"\n', r"server name 'bad:name' must be"),
        (
            '[servers.both]\ncommand = "x"\nurl = "http://x"\n',
            r"needs exactly one of `command` \(stdio\) or `url`",
        ),
    ],
)
def test_broken_config_is_refused_with_one_line_before_anything_starts(
    tmp_path: Path, text: str, expected: str
) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(text)
    result = run_serve(config)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"mcpvisor: config error: {config}")
    import re

    assert re.search(expected, lines[0]), lines[0]


def test_missing_config_file_is_refused(tmp_path: Path) -> None:
    result = run_serve(tmp_path / "nowhere.toml")
    assert result.returncode == 2
    assert "cannot read" in result.stderr


async def test_malformed_and_oversized_requests_get_clear_errors_and_change_nothing(tmp_path: Path) -> None:
    settings = {"max_body_bytes": 65536}
    async with open_stack(tmp_path, {"echo": echo_server()}, settings=settings) as stack:
        headers = {
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            "MCP-Protocol-Version": "2026-07-28",
        }
        cases = [
            (b"{not json", 400, -32700),
            (b'{"jsonrpc":"2.0","id":1}', 400, -32600),
            (b"[]", 400, -32600),
            (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":5}}', 400, -32602),
        ]
        async with httpx2.AsyncClient(timeout=10) as http:
            for body, status, code in cases:
                response = await http.post(stack.direct_url, content=body, headers=headers)
                assert response.status_code == status, response.text
                assert response.json()["error"]["code"] == code
            oversized = await http.post(stack.direct_url, content=b"x" * 100_000, headers=headers)
            assert oversized.status_code == 413
        # A body declared past the limit and never sent, of any type or none: refused at once, not
        # a connection held open waiting for it.
        for kind in (b"Content-Type: application/json\r\n", b"Content-Type: text/plain\r\n", b""):
            head = (
                f"POST /mcp/direct HTTP/1.1\r\nHost: 127.0.0.1:{stack.port}\r\nContent-Length: 99999999999\r\n".encode()
                + kind
                + b"\r\n"
            )
            with trio.fail_after(10):
                connection = await trio.open_tcp_stream("127.0.0.1", stack.port)
                async with connection:
                    await connection.send_all(head)
                    answer = await connection.receive_some(65536)
            assert answer.startswith(b"HTTP/1.1 413"), (kind, answer[:200])
        async with stack.client() as client:
            assert (await client.call_tool("echo:echo", {"text": "unharmed"})).content[0].text == "unharmed"


async def test_files_in_the_working_directory_cannot_shadow_what_mcpvisor_imports(tmp_path: Path) -> None:
    """Given a `dis.py` where mcpvisor is started (a stdlib name), every process still starts."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "dis.py").write_text("raise SystemExit('this must never be imported')\n")
    async with open_stack(tmp_path, {"echo": echo_server()}, cwd=workdir) as stack, stack.client() as client:
        assert (await client.call_tool("echo:echo", {"text": "safe"})).content[0].text == "safe"


async def test_requests_from_other_hosts_and_origins_are_refused_on_loopback(tmp_path: Path) -> None:
    """DNS rebinding: a page on another origin must not reach local tools, by any code path."""
    async with open_stack(tmp_path, {"echo": echo_server()}) as stack:
        call = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {
                "name": "echo:touch",
                "arguments": {"path": str(tmp_path / "pwned")},
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {},
                },
            },
        }
        base = {
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": "tools/call",
            "Mcp-Name": "echo:touch",
        }
        async with httpx2.AsyncClient(timeout=10) as http:
            for extra in ({"Host": "evil.example"}, {"Origin": "http://evil.example"}):
                response = await http.post(stack.direct_url, json=call, headers={**base, **extra})
                assert response.status_code in (400, 403, 421), (extra, response.status_code, response.text)
            assert not (tmp_path / "pwned").exists()
            allowed = await http.post(
                stack.direct_url, json=call, headers={**base, "Origin": f"http://127.0.0.1:{stack.port}"}
            )
            assert allowed.status_code == 200, allowed.text
            assert (tmp_path / "pwned").exists()
