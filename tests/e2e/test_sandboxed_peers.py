"""Published upstreams in sandboxes on a workstation: `sandbox = true` and they keep working.

mcp-server-time (a Python console script in a virtualenv whose interpreter lives in another
prefix) and server-everything (Node, its entry script in a node_modules tree), each in its own
sandbox, answer calls as they do without one; the memory watchdog stands in where no cgroup is
used, and says why it killed.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest
import trio
from mcp.shared.exceptions import MCPError

from mcpvisor.runtime.logs import log_stem
from tests.support.peers import everything_stdio_server
from tests.support.stack import descendants, open_stack, python_server

pytestmark = [
    pytest.mark.trio,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="system package missing: bubblewrap"),
]

TIME = str(Path(sys.executable).parent / "mcp-server-time")


def runs(root: int, script: str) -> bool:
    """Whether any process below `root` has `script` on its command line."""
    for pid in descendants(root):
        try:
            if script in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
                return True
        except OSError:
            continue
    return False


def text_of(result: object) -> str:
    return " ".join(getattr(item, "text", "") for item in getattr(result, "content", []))


async def test_published_servers_run_in_their_sandboxes(tmp_path: Path) -> None:
    if not Path(TIME).exists():  # noqa: ASYNC240
        pytest.skip("mcp-server-time is not installed in this virtualenv")
    servers = {
        "time": {"command": TIME, "args": ["--local-timezone", "UTC"]},
        "everything": everything_stdio_server(),
    }
    async with open_stack(tmp_path, servers, settings={"sandbox": True}) as stack, stack.client() as client:
        now = await client.call_tool("time:get_current_time", {"timezone": "UTC"})
        assert "UTC" in text_of(now) and not now.is_error
        echoed = await client.call_tool("everything:echo", {"message": "from the sandbox"})
        assert "from the sandbox" in text_of(echoed)
        # Each got its own home under the data dir, and nothing of the host's.
        homes = stack.data_dir / "sandboxes" / "servers"
        assert {p.name for p in homes.iterdir()} == {"time", "everything"}
        code, shown = await stack.actl("inspect", "time")
        assert code == 0 and shown["sandboxes"]["time"]["enabled"] is True


async def test_the_memory_watchdog_kills_where_no_cgroup_is_used(tmp_path: Path) -> None:
    servers = {"shell": python_server("shell_server.py", sandbox={"limits": "watchdog", "memory_mb": 200})}
    async with open_stack(tmp_path, servers) as stack, stack.client() as client:
        # The watchdog looks every WATCH_INTERVAL: an allocation quicker than that is answered before the kill,
        # which then follows; a slower one is ended by it, and the call says why.
        try:
            await client.call_tool("shell:allocate", {"mib": 400})
        except MCPError as exc:
            assert "memory limit (200 MiB)" in str(exc)
        with trio.fail_after(30):
            while "memory limit (200 MiB): killing it" not in stack.log(f"{log_stem('shell')}.worker.log"):
                await trio.sleep(0.1)
        # The status says why while the upstream is down; then it is back, by its restart policy.
        reasons = set()
        with trio.fail_after(60):
            while True:
                try:
                    answer = await client.call_tool("shell:run", {"command": "echo back"})
                except MCPError as exc:  # down, and saying why, until it is back
                    reasons.add(str(exc))
                    await trio.sleep(0.5)
                    continue
                if not answer.is_error:
                    break
        assert "back" in text_of(answer)
        assert all("memory limit (200 MiB)" in reason for reason in reasons), reasons


async def test_an_npx_server_keeps_its_download_in_its_home(tmp_path: Path) -> None:
    """`npx -y @modelcontextprotocol/server-everything` from the npm registry, in a tenant's sandbox."""
    if shutil.which("npx") is None:
        pytest.skip("system package missing: npm")
    servers = {
        "everything": {
            "command": "npx",
            "args": ["-y", "@modelcontextprotocol/server-everything"],
            "policy": {"init_timeout": 240},
        }
    }
    async with open_stack(tmp_path, servers, settings={"sandbox": True}, wait_for=[]) as stack:
        try:
            await stack.wait_ready(["everything"], timeout=300)
        except TimeoutError:
            stderr = stack.log(f"{log_stem('everything')}.stderr.log")
            if re.search(r"ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ETIMEDOUT", stderr):
                pytest.skip("the npm registry cannot be reached from here")
            raise
        async with stack.client() as client:
            echoed = await client.call_tool("everything:echo", {"message": "fetched by npx"})
            assert "fetched by npx" in text_of(echoed)
        # The download is in the server's own home, where the next start finds it.
        home = stack.data_dir / "sandboxes" / "servers" / "everything"
        assert (home / ".npm" / "_npx").is_dir()


async def test_without_bwrap_a_required_sandbox_never_starts_the_server_unconfined(tmp_path: Path) -> None:
    # A PATH without bwrap on it: the server's own command is found all the same (absolute).
    servers = {"shell": python_server("shell_server.py", sandbox=True)}
    env = {"PATH": str(Path(sys.executable).parent)}
    async with open_stack(tmp_path, servers, env=env, wait_for=[]) as stack:
        # The reason is the worker's error while it retries, and the process's description once it is FATAL
        # (after startretries); a loaded machine may show either first.
        def reason(rows: dict) -> str:
            return rows["shell"]["error"] + " " + rows["shell"]["description"]

        rows = await stack.wait_status(lambda rows: "bubblewrap" in reason(rows), timeout=60)
        assert "not started" in reason(rows) and rows["shell"]["upstream"] != "ready"
        # Nothing ran: the worker never spawned the shell.
        assert not runs(stack.process.pid, "shell_server.py")
