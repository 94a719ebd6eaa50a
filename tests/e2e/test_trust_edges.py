"""The edges of the trust boundary, against a real stack: who may connect, where it may listen,
which files others can read, and input that must be a clear 4xx however malformed it is."""

from __future__ import annotations

import json
import os
import random
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio

from tests.support.stack import Stack, echo_server, free_port, open_stack, stop_stack, write_config

MODERN = "2026-07-28"
NOBODY = 65534
ACCEPT = "application/json, text/event-stream"


def _headers(era: str, *, name: str | None = "echo:echo", method: str = "tools/call") -> dict[str, str]:
    headers = {"Accept": ACCEPT, "Content-Type": "application/json"}
    if era == "modern":
        headers.update({"MCP-Protocol-Version": MODERN, "Mcp-Method": method})
        if name is not None:
            headers["Mcp-Name"] = name
    return headers


def _call(arguments_json: bytes, name: bytes = b"echo:echo") -> bytes:
    """A 2026-07-28 tools/call whose arguments are spliced in as raw JSON text."""
    return (
        b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"' + name + b'","arguments":'
        + arguments_json
        + b',"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",'
        b'"io.modelcontextprotocol/clientCapabilities":{}}}}'
    )  # fmt: skip


# Each was a 500, an internal error (-32603) or a 10-second hang on /mcp/direct before the boundary.
BAD_BODIES = {
    "invalid UTF-8": (_call(b'{"text":"\xff\xfe"}'), -32700),
    "a lone high surrogate": (_call(rb'{"text":"\ud800"}'), -32700),
    "a lone low surrogate": (_call(rb'{"text":"x\udfff"}'), -32700),
    "a surrogate in a key": (_call(rb'{"\udbff":"x"}'), -32700),
    "a list nested 999 deep": (_call(b'{"text":' + b"[" * 999 + b"]" * 999 + b"}"), -32600),
    "an empty body": (b"", -32700),
    "only whitespace": (b" \r\n", -32700),
}


@pytest.mark.parametrize("path", ["/mcp", "/mcp/direct"])
async def test_malformed_bodies_are_a_clear_4xx_at_once_on_every_endpoint_and_era(tmp_path: Path, path: str) -> None:
    async with open_stack(tmp_path, {"echo": echo_server()}) as stack:
        async with httpx2.AsyncClient(timeout=5) as http:  # the empty body used to hang for 10 s
            for era in ("handshake", "modern"):
                for case, (body, code) in BAD_BODIES.items():
                    response = await http.post(stack.base_url + path, content=body, headers=_headers(era))
                    assert response.status_code == 400, (era, case, response.status_code, response.text)
                    error = response.json()["error"]
                    assert error["code"] == code, (era, case, error)
                    assert error["message"], (era, case)
        async with stack.client(path) as client:
            tools = {tool.name for tool in (await client.list_tools()).tools}
            assert tools
            if path == "/mcp/direct":
                assert (await client.call_tool("echo:echo", {"text": "still here 😀"})).content[0].text == (
                    "still here 😀"
                )


INVALID_URLS = [
    "http://",
    "http:///mcp",
    "http://exa mple.com/mcp",
    "ftp://example.com/mcp",
    "http://example.com:99999/",
]
INVALID_NAMES = ["bad name", "x" * 200, "", "frontend", "../etc", "a/b", "a:b", "-leading-dash"]


async def test_management_refuses_unusable_urls_and_names_and_adds_nothing(tmp_path: Path) -> None:
    async with open_stack(tmp_path, {"echo": echo_server()}) as stack, stack.client("/mcp") as client:
        for index, url in enumerate(INVALID_URLS):
            result = await client.call_tool("upstream_servers", {"operation": "add", "name": f"u{index}", "url": url})
            assert result.is_error, url
            assert "'url'" in result.content[0].text, (url, result.content[0].text)
        for name in INVALID_NAMES:
            result = await client.call_tool("upstream_servers", {"operation": "add", "name": name, "command": "true"})
            assert result.is_error, name
        listing = await client.call_tool("upstream_servers", {"operation": "list"})
        assert not listing.is_error
        names = {server["name"] for server in json.loads(listing.content[0].text)["servers"]}
        assert names == {"echo"}, names
    assert "[servers.u" not in stack.config_path.read_text()


def _mutate(rng: random.Random, body: bytes) -> bytes:
    """One random corruption of a request body: the shapes the first fuzz found, and plain noise."""
    nasty = [b"\xff", b"\xc3", b"\\ud800", b"\\udfff", b"\\u0000", b"\x00", b"[" * 300, b"{" * 50, b'"', b"\\", b"1e999",
             b"-0", b"9" * 400, b"null", b"[]", b"{}", b"true", b",", b":", "é".encode(), "😀".encode()]  # fmt: skip
    choice = rng.randrange(7)
    if choice == 0 and body:
        at = rng.randrange(len(body))
        return body[:at] + bytes([rng.randrange(256)]) + body[at + 1 :]
    if choice == 1:
        at = rng.randrange(len(body) + 1)
        return body[:at] + rng.choice(nasty) + body[at:]
    if choice == 2:
        return body[: rng.randrange(len(body) + 1)]
    if choice == 3:
        depth = rng.choice([10, 63, 64, 65, 200, 999, 3000])
        return body.replace(b'"hi"', b"[" * depth + b"]" * depth, 1)
    if choice == 4:
        return rng.choice([b"", b" ", b"null", b"[]", b"{}", b"[{}]", b'"x"', b"1"])
    if choice == 5:
        return body.replace(b'"hi"', b'"' + rng.choice([b"\\ud83d\\ude00", b"\\ud800", b"\xed\xa0\x80", b"ok"]) + b'"')
    return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))


async def test_a_randomized_http_fuzz_gets_no_5xx_and_no_internal_error(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("MCPVISOR_FUZZ_SEED", "20261123")))
    bases = [
        _call(b'{"text":"hi"}'),
        b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
        b'"capabilities":{},"clientInfo":{"name":"fuzz","version":"1"},"x":"hi"}}',
        b'{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"_meta":{"x":"hi"}}}',
        b'{"jsonrpc":"2.0","id":3,"method":"ping","params":{"x":"hi"}}',
        _call(b'{"operation":"list","x":"hi"}', b"upstream_servers"),
    ]
    content_types = ["application/json", "application/json; charset=utf-8", "text/plain", None]
    failures: list[str] = []
    statuses: dict[int, int] = {}
    sent = 0
    async with open_stack(tmp_path, {"echo": echo_server()}) as stack:
        async with httpx2.AsyncClient(timeout=15) as http:
            with trio.move_on_after(90):  # bounded in time as well as in count
                for sent in range(1, 3001):  # noqa: B007 - the count is reported below
                    path = rng.choice(["/mcp", "/mcp/direct"])
                    headers = _headers(rng.choice(["handshake", "modern"]), name=rng.choice(["echo:echo", None]))
                    if (content_type := rng.choice(content_types)) is None:
                        del headers["Content-Type"]
                    else:
                        headers["Content-Type"] = content_type
                    body = _mutate(rng, rng.choice(bases))
                    response = await http.post(stack.base_url + path, content=body, headers=headers)
                    statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                    if response.status_code >= 500 or b"-32603" in response.content:
                        failures.append(
                            f"{path} {headers} {body[:120]!r} -> {response.status_code} {response.text[:200]}"
                        )
        print(f"fuzz: {sent} requests, statuses {dict(sorted(statuses.items()))}")
        assert sent >= 500, "the fuzz sent too few requests to mean anything"
        assert not failures, "\n".join(failures[:10])
        async with stack.client() as client:
            assert (await client.call_tool("echo:echo", {"text": "after the fuzz"})).content[0].text == "after the fuzz"


def _python_for(uid: int) -> str | None:
    """A Python interpreter the user `uid` can run (the test's own may sit under a private home)."""
    for candidate in (sys.executable, shutil.which("python3", path="/usr/bin:/bin"), "/usr/bin/python3"):
        if candidate and subprocess.run(
            ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", candidate, "-I", "-c", "pass"],
            capture_output=True, check=False,
        ).returncode == 0:  # fmt: skip
            return candidate
    return None


_CLIENT = """
import json, sys, urllib.error, urllib.request
url, body, headers = sys.argv[1], sys.argv[2].encode() or None, json.loads(sys.argv[3])
request = urllib.request.Request(url, data=body, headers=headers, method="POST" if body else "GET")
try:
    with urllib.request.urlopen(request, timeout=10) as response:
        print(json.dumps({"status": response.status, "body": response.read().decode()}))
except urllib.error.HTTPError as error:
    print(json.dumps({"status": error.code, "body": error.read().decode()}))
"""


def _request_as(
    uid: int, python: str, url: str, body: str = "", headers: dict[str, str] | None = None
) -> dict[str, Any]:
    command = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", python, "-I", "-c", _CLIENT]
    result = subprocess.run(
        [*command, url, body, json.dumps(headers or {})], capture_output=True, text=True, timeout=30, check=True
    )
    return json.loads(result.stdout)


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="the peer check reads Linux's /proc/net/tcp")
async def test_another_local_user_is_refused_on_every_path_while_the_owner_is_served(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("starting a client as another user (nobody) needs root")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    python = _python_for(NOBODY)
    if python is None:
        pytest.skip("no Python interpreter that user nobody may run")
    initialize = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "x", "version": "1"},
            },
        }
    )
    add = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {
                "name": "upstream_servers",
                "arguments": {
                    "operation": "add",
                    "name": "evil",
                    "command": "touch",
                    "args": [str(tmp_path / "pwned")],
                },
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": MODERN,
                    "io.modelcontextprotocol/clientCapabilities": {},
                },
            },
        }
    )
    async with open_stack(tmp_path, {"echo": echo_server()}) as stack:
        attempts = [
            (stack.url, initialize, _headers("handshake")),
            (stack.url, add, _headers("modern", name="upstream_servers")),
            (stack.direct_url, add, _headers("modern", name="upstream_servers")),
            (f"{stack.base_url}/healthz", "", {}),
            (f"{stack.base_url}/nowhere", "", {}),
        ]
        for url, body, headers in attempts:
            answer = await trio.to_thread.run_sync(lambda: _request_as(NOBODY, python, url, body, headers))  # noqa: B023
            assert answer["status"] == 403, (url, answer)
            refusal = json.loads(answer["body"])
            assert refusal["error"] == "forbidden"
            assert f"uid {NOBODY}" in refusal["message"] and "only the local user" in refusal["message"]
        assert not (tmp_path / "pwned").exists()
        assert "evil" not in stack.config_path.read_text()
        # The owner (here root, who runs the stack) is served as before.
        assert (await stack.health())["status"] == "ok"
        async with stack.client() as client:
            assert (await client.call_tool("echo:echo", {"text": "mine"})).content[0].text == "mine"


def _serve(config: Path, *, command: str = "serve") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-P", "-m", "mcpvisor.supervisor", command, "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize("listen", ["0.0.0.0:{port}", "[::]:{port}", "192.0.2.10:{port}"])
def test_a_network_listen_address_without_authentication_refuses_to_start(tmp_path: Path, listen: str) -> None:
    config = tmp_path / "mcpvisor.toml"
    write_config(
        config, {"echo": echo_server()}, {"listen": listen.format(port=free_port()), "data_dir": str(tmp_path)}
    )
    for command in ("serve", "check"):
        result = _serve(config, command=command)
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert "allow_unauthenticated_network = true" in lines[0] and "listen =" in lines[0], lines[0]
    assert not (tmp_path / "logs").exists(), "nothing may start before the refusal"


async def test_the_explicit_opt_out_starts_on_the_network_and_warns_at_every_start(tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "mcpvisor.toml"
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    settings = {"listen": f"0.0.0.0:{port}", "allow_unauthenticated_network": True, "data_dir": str(data_dir)}
    write_config(config, {"echo": echo_server()}, settings)
    assert _serve(config, command="check").returncode == 0
    run_dir = Path(tempfile.mkdtemp(prefix="mv", dir="/tmp"))
    env = {**os.environ, "XDG_RUNTIME_DIR": str(run_dir)}
    env.pop("RUNTIME_DIRECTORY", None)
    for _start in range(2):
        with open(data_dir / "supervisor.out", "ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-P", "-m", "mcpvisor.supervisor", "serve", "-c", str(config)],
                stdout=out,
                stderr=out,
                env=env,
                start_new_session=True,
            )
        stack = Stack(process, config, data_dir, run_dir / "mcpvisor", port, env)
        try:
            await stack.wait_ready(["echo"], timeout=90)
        finally:
            await stop_stack(stack)
    warnings = [line for line in stack.supervisor_output().splitlines() if "allow_unauthenticated_network" in line]
    assert len(warnings) == 2, stack.supervisor_output()
    assert all("warning" in line for line in warnings)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_files_are_private_and_a_runtime_change_keeps_the_configs_mode(tmp_path: Path) -> None:
    state = tmp_path / "state"  # created by mcpvisor itself
    config = tmp_path / "mcpvisor.toml"
    leftover = tmp_path / ".mcpvisor.toml.tmp"  # what a write killed half-way leaves
    leftover.write_text('[servers.x]\nheaders = { Authorization = "Bearer half-written" }\n')
    async with open_stack(tmp_path, {"echo": echo_server()}, settings={"data_dir": str(state)}) as stack:
        assert not leftover.exists()
        config.chmod(0o600)
        code, _ = await stack.actl("disable", "echo")
        assert code == 0
        code, _ = await stack.actl("enable", "echo")
        assert code == 0
        await stack.wait_ready(["echo"])
        async with stack.client() as client:  # a call, so the state store has written its WAL
            assert (await client.call_tool("echo:echo", {"text": "x"})).content[0].text == "x"
        assert _mode(config) == 0o600
        assert _mode(tmp_path / "mcpvisor.toml.bak") == 0o600
        assert "enabled = false" not in config.read_text()
        directories = [state, state / "logs", stack.run_dir]
        files = [p for p in (state / "logs").iterdir()] + [p for p in state.glob("state.sqlite*")]
        assert {p.name for p in files} >= {"supervisor.log", "frontend.log", "state.sqlite"}
        for directory in directories:
            assert _mode(directory) == 0o700, directory
        for path in files:
            assert _mode(path) == 0o600, path


async def test_a_reload_cannot_open_the_listener_to_the_network_either(tmp_path: Path) -> None:
    async with open_stack(tmp_path, {"echo": echo_server()}) as stack:
        text = stack.config_path.read_text()
        stack.config_path.write_text(text.replace(f'"127.0.0.1:{stack.port}"', f'"0.0.0.0:{stack.port}"'))
        code, output = await stack.actl("update", json_output=False)
        assert code != 0, output
        assert "allow_unauthenticated_network = true" in output, output
        async with stack.client() as client:  # still served, still on loopback only
            assert (await client.call_tool("echo:echo", {"text": "kept"})).content[0].text == "kept"
        assert (await stack.health())["servers"]["echo"]["state"] == "ready"
