"""A sandboxed upstream on a workstation, tried as an attacker: it may not call mcpvisor's own endpoint.

On a loopback listener without tokens, mcpvisor serves the user running it. Run as an ordinary
user, bwrap maps a sandboxed upstream to that same user through a user namespace, so from inside
the hostile workspace shell (tests/upstreams/shell_server.py) could POST `initialize` and
`tools/call` to the listener and call every other server's tools. Here mcpvisor runs as a
container's unprivileged user (tests/support/unprivileged.py) with the shell sandboxed: from
inside, both are refused with the boundary's 403, while a client of that same user outside any
sandbox is served. Hiding the socket from the check does not help either: a connection is served
only while a process outside every sandbox holds it. The user's own processes that cannot be
looked into (ssh-agent's way) stand in the way only when they run under mcpvisor, as a sandbox's
would. Run as root, the sandbox's uid is 2^30 and more, and is refused as another user's.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.support.stack import Stack, echo_server, free_port, open_stack, python_server, stop_stack, write_config
from tests.support.unprivileged import CONTAINER_UID, as_container_user, missing_tools

REPO = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.trio,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="system package missing: bubblewrap"),
]

# From inside the sandbox: POST one JSON-RPC message to the listener, print the status and body.
POST = r"""
import json, sys, urllib.request, urllib.error
url, body = sys.argv[1], sys.argv[2]
headers = {"content-type": "application/json", "accept": "application/json, text/event-stream",
           "mcp-protocol-version": "2025-06-18"}
request = urllib.request.Request(url, data=body.encode(), headers=headers, method="POST")
try:
    with urllib.request.urlopen(request, timeout=10) as answer:
        print(answer.status, answer.read(2000).decode(errors="replace"))
except urllib.error.HTTPError as exc:
    print(exc.code, exc.read(2000).decode(errors="replace"))
"""
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "x", "version": "1"}},
}
CALL = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "echo:echo", "arguments": {"text": "hi"}}}


def post_command(url: str, message: dict[str, Any]) -> str:
    """The shell command that runs POST with the system python inside the sandbox."""
    quoted = [POST, url, json.dumps(message)]
    return "/usr/bin/python3 -c " + " ".join("'" + part.replace("'", "'\\''") + "'" for part in quoted)


def outcome(result: object) -> str:
    return " ".join(getattr(item, "text", "") for item in getattr(result, "content", []))


async def attack(stack: Stack) -> list[str]:
    """What the sandboxed shell's POSTs to the listener got back: one "STATUS BODY" line each."""
    answers = []
    async with stack.client() as client:
        for message in (INITIALIZE, CALL):
            result = await client.call_tool("shell:run", {"command": post_command(stack.direct_url, message)})
            text = outcome(result)
            assert "exit: 0" in text, text
            answers.append(text.split("stdout:\n", 1)[1].split("\nstderr:", 1)[0].strip())
    return answers


@asynccontextmanager
async def stack_as_user(base: Path, servers: dict[str, dict[str, Any]]) -> AsyncIterator[Stack]:
    """`mcpvisor serve` as CONTAINER_UID (no capability, no_new_privs), its dirs that user's own."""
    port = free_port()
    data_dir, run_dir = base / "data", base / "run"
    for path in (base, data_dir, run_dir):
        path.mkdir(exist_ok=True)
        os.chown(path, CONTAINER_UID, CONTAINER_UID)
    config_path = base / "mcpvisor.toml"
    settings = {"listen": f"127.0.0.1:{port}", "enable_direct_endpoint": True, "data_dir": str(data_dir)}
    write_config(config_path, servers, settings)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(base),
        "LANG": "C.UTF-8",
        "XDG_RUNTIME_DIR": str(run_dir),
    }
    stash = Path(tempfile.mkdtemp(prefix="stash-", dir="/tmp"))
    argv = as_container_user(
        [sys.executable, "-P", "-m", "mcpvisor.supervisor", "serve", "-c", str(config_path)],
        stash,
        readable=[REPO],
    )
    with open(base / "supervisor.out", "ab") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=out, env=env, start_new_session=True)
    stack = Stack(process, config_path, data_dir, run_dir / "mcpvisor", port, env)
    try:
        await stack.wait_ready(list(servers), timeout=120)
        yield stack
    finally:
        await stop_stack(stack)
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        shutil.rmtree(stash, ignore_errors=True)


SETPRIV = ("setpriv", f"--reuid={CONTAINER_UID}", f"--regid={CONTAINER_UID}", "--clear-groups", "--")


def as_same_user(url: str, message: dict[str, Any]) -> str:
    """The same POST by a process of the user running mcpvisor, outside any sandbox."""
    done = subprocess.run(
        [*SETPRIV, "/usr/bin/python3", "-c", POST, url, json.dumps(message)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


# From inside the sandbox: the socket is out of every process's hands when its first request arrives. The
# request is held back by TCP_CORK (the kernel sends it some 200 ms later), the socket is sent to a
# socketpair (SCM_RIGHTS) and closed, and taken back only once the answer is there. Then a second request
# on the same connection, plainly. Prints "in transit: True|False", then one "STATUS BODY" line per answer.
HIDDEN = r"""
import socket, sys, time
host, port, body = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode()
request = (
    f"POST /mcp/direct HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
    "accept: application/json, text/event-stream\r\nmcp-protocol-version: 2025-06-18\r\n"
    f"content-length: {len(body)}\r\n\r\n"
).encode() + body

def answer(sock):
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536) or b"\r\n\r\n"
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
    if "content-length" in fields:
        while len(rest) < int(fields["content-length"]):
            rest += sock.recv(65536) or b"x" * int(fields["content-length"])
    else:  # chunked: up to the last chunk
        while not rest.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
    return lines[0].split()[1] + " " + rest.decode(errors="replace")[:2000].replace("\r", " ").replace("\n", " ")

def received(local_port):
    # Bytes waiting in the socket's receive queue, from the kernel's table (the network is shared).
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(f":{local_port:04X}") and fields[2].endswith(f":{port:04X}"):
            return int(fields[4].split(":")[1], 16)
    return 0

sock = socket.create_connection((host, port))
sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
sock.sendall(request)
local_port = sock.getsockname()[1]
keep, take = socket.socketpair()
socket.send_fds(keep, [b"x"], [sock.fileno()])
sock.close()
deadline = time.monotonic() + 30
while not received(local_port) and time.monotonic() < deadline:
    time.sleep(0.01)
print("in transit:", bool(received(local_port)))
_, fds, _, _ = socket.recv_fds(take, 1, 1)
sock = socket.socket(fileno=fds[0])
print(answer(sock))
sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)
sock.sendall(request)
print(answer(sock))
"""


def hidden_command(port: int, message: dict[str, Any]) -> str:
    """The shell command that runs HIDDEN with the system python inside the sandbox."""
    quoted = [HIDDEN, "127.0.0.1", str(port), json.dumps(message)]
    return "/usr/bin/python3 -c " + " ".join("'" + part.replace("'", "'\\''") + "'" for part in quoted)


SERVERS = {"shell": python_server("shell_server.py", sandbox=True), "echo": echo_server()}


@pytest.mark.skipif(os.geteuid() != 0 or missing_tools() is not None, reason=str(missing_tools()))
async def test_an_ordinary_users_sandboxed_upstream_cannot_call_mcpvisor() -> None:
    if not Path("/usr/bin/python3").exists():  # noqa: ASYNC240
        pytest.skip("no system python3 to run inside the sandbox")
    # pytest's tmp dirs are root's alone (0700): the user's dirs must be where it can reach them.
    base = Path(tempfile.mkdtemp(prefix="reach-back-", dir="/tmp"))
    try:
        async with stack_as_user(base, SERVERS) as stack:
            initialize, call = await attack(stack)
            for answer in (initialize, call):
                assert answer.startswith("403 "), answer
                assert "inside a server's sandbox" in json.loads(answer[4:])["message"]
            # The same user outside a sandbox is served, on the same stack.
            served = await trio.to_thread.run_sync(as_same_user, stack.direct_url, INITIALIZE)
            assert served.startswith("200 ") and '"serverInfo"' in served, served
            frontend = stack.log("frontend.log")
            assert "inside a sandbox" in frontend
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0 or missing_tools() is not None, reason=str(missing_tools()))
async def test_a_socket_out_of_the_sandboxs_hands_when_checked_is_refused_too() -> None:
    if not Path("/usr/bin/python3").exists():  # noqa: ASYNC240
        pytest.skip("no system python3 to run inside the sandbox")
    base = Path(tempfile.mkdtemp(prefix="reach-back-", dir="/tmp"))
    try:
        async with stack_as_user(base, SERVERS) as stack, stack.client() as client:
            result = await client.call_tool("shell:run", {"command": hidden_command(stack.port, INITIALIZE)})
            text = outcome(result)
            assert "exit: 0" in text, text
            transit, first, second = text.split("stdout:\n", 1)[1].split("\nstderr:", 1)[0].strip().splitlines()
            # The first answer came while the socket was in no process's hands.
            assert transit == "in transit: True", text
            assert first.startswith("403 "), first
            assert "cannot tell who opened this connection" in first, first
            # Once the sandbox holds it again, it is found there: the connection never became the user's.
            assert second.startswith("403 "), second
            assert "inside a server's sandbox" in second, second
    finally:
        shutil.rmtree(base, ignore_errors=True)


# As ssh-agent and gpg-agent do: become non-dumpable (prctl PR_SET_DUMPABLE 0), which hides this
# process's namespaces and descriptors from the user's other processes, say so, and stay.
HIDE = "import ctypes, time; assert ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) == 0; print('hidden', flush=True); time.sleep(600)"


@pytest.mark.skipif(os.geteuid() != 0 or missing_tools() is not None, reason=str(missing_tools()))
async def test_a_hidden_process_of_the_user_matters_only_inside_mcpvisor() -> None:
    if not Path("/usr/bin/python3").exists():  # noqa: ASYNC240
        pytest.skip("no system python3 to run inside the sandbox")
    base = Path(tempfile.mkdtemp(prefix="reach-back-", dir="/tmp"))
    agent: subprocess.Popen[str] | None = None
    try:
        async with stack_as_user(base, SERVERS) as stack:
            # The user's agent, started apart from mcpvisor: it cannot be looked into, nor be a sandbox.
            agent = subprocess.Popen([*SETPRIV, "/usr/bin/python3", "-c", HIDE], stdout=subprocess.PIPE, text=True)
            assert agent.stdout is not None
            assert await trio.to_thread.run_sync(agent.stdout.readline) == "hidden\n"
            served = await trio.to_thread.run_sync(as_same_user, stack.direct_url, INITIALIZE)
            assert served.startswith("200 ") and '"serverInfo"' in served, served
            # A sandboxed process hiding itself the same way could hold any connection's socket.
            hide = f'/usr/bin/python3 -c "{HIDE}" > /tmp/hidden 2>&1 & until grep -q hidden /tmp/hidden; do sleep 0.05; done'
            async with stack.client() as client:
                text = outcome(await client.call_tool("shell:run", {"command": hide}))
            assert "exit: 0" in text, text
            refused = await trio.to_thread.run_sync(as_same_user, stack.direct_url, INITIALIZE)
            assert refused.startswith("403 "), refused
            message = json.loads(refused[4:])["message"]
            assert "cannot tell who opened this connection" in message and "cannot be read" in message, refused
    finally:
        if agent is not None:
            agent.kill()
            agent.communicate()
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: mcpvisor as root gives the sandbox a uid of its own")
async def test_roots_sandboxed_upstream_is_another_user_and_refused(tmp_path: Path) -> None:
    if not Path("/usr/bin/python3").exists():  # noqa: ASYNC240
        pytest.skip("no system python3 to run inside the sandbox")
    async with open_stack(tmp_path, SERVERS, wait_for=["shell", "echo"]) as stack:
        for answer in await attack(stack):
            assert answer.startswith("403 "), answer
            uid = int(json.loads(answer[4:])["message"].rsplit("uid ", 1)[1].rstrip("."))
            assert uid >= 2**30
        # The test's own client (root) is served on the same stack.
        async with stack.client() as client:
            assert "hi" in outcome(await client.call_tool("echo:echo", {"text": "hi"}))
