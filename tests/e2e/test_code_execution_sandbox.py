"""On a real stack, code_execution's scripts run in a bubblewrap sandbox, or not at all where one is required."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
import trio

from tests.support.stack import Stack, echo_server, open_stack

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="system package missing: bubblewrap")


def frontend_pid(stack: Stack) -> int:
    code, rows = stack.ctl("status")
    assert code == 0, rows
    (row,) = [row for row in rows if row["name"] == "frontend"]
    return int(row["pid"])


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(child) for child in (task / "children").read_text().split()]
    return found


def script_processes(frontend: int) -> list[dict[str, Any]]:
    """Each bwrap the frontend started, with what the host sees of the interpreter inside it."""
    bwrap = Path(shutil.which("bwrap") or "bwrap").resolve()
    seen = []
    for pid in children(frontend):
        if Path(f"/proc/{pid}/exe").resolve() != bwrap:
            continue
        inside, queue = [], children(pid)
        while queue:
            current = queue.pop()
            queue += children(current)
            if Path(f"/proc/{current}/exe").resolve() != bwrap:
                inside.append(current)
        (inner,) = inside
        status = dict(line.split(":", 1) for line in Path(f"/proc/{inner}/status").read_text().splitlines())
        seen.append(
            {
                "cmdline": Path(f"/proc/{inner}/cmdline").read_text().split("\0"),
                "no_new_privs": status["NoNewPrivs"].strip(),
                "uid": int(status["Uid"].split()[0]),
                "net": os.readlink(f"/proc/{inner}/ns/net"),
            }
        )
    return seen


def frontend_spec(pid: int) -> dict[str, Any]:
    """The launch spec the supervisor gave the frontend (its MCPVISOR_FRONTEND variable)."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return json.loads(next(v for v in environ if v.startswith(b"MCPVISOR_FRONTEND=")).split(b"=", 1)[1])


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(item.text for item in result.content if isinstance(item, types.TextContent))


async def test_scripts_run_inside_bwrap_on_a_real_stack(tmp_path: Path) -> None:
    settings = {"enable_code_execution": True}
    servers = {"echo": echo_server("echo")}
    async with open_stack(tmp_path, servers, settings=settings) as stack, stack.client("/mcp/direct") as client:
        with trio.fail_after(60):
            result = await client.call_tool(
                "code_execution", {"code": "call_tool('echo', 'add', {a: 2, b: 3}).result.content[0].text"}
            )
        assert not result.is_error, text_of(result)
        assert json.loads(text_of(result))["value"] == "5"
        frontend = frontend_pid(stack)
        (process,) = await trio.to_thread.run_sync(script_processes, frontend)
        assert "mcpvisor.workers.sandbox" in process["cmdline"]
        assert process["no_new_privs"] == "1" and process["uid"] != 0
        assert process["net"] != os.readlink(f"/proc/{frontend}/ns/net")
        # The supervisor told the frontend what no sandbox may see; the script's view covers it.
        spec = await trio.to_thread.run_sync(frontend_spec, frontend)
        assert str(stack.data_dir.resolve()) in spec["hidden"]
        assert str(stack.config_path) in spec["hidden"]


async def test_a_required_sandbox_that_cannot_be_built_refuses_scripts(tmp_path: Path) -> None:
    # `sandbox = true` makes every sandbox required; bwrap is not on the PATH mcpvisor runs with.
    empty = tmp_path / "no-bwrap"
    empty.mkdir()
    settings = {"enable_code_execution": True, "sandbox": True}
    async with open_stack(tmp_path, {}, settings=settings, env={"PATH": str(empty)}, wait_for=[]) as stack:
        async with stack.client("/mcp/direct") as client:
            with trio.fail_after(60):
                result = await client.call_tool("code_execution", {"code": "1"})
            assert result.is_error
            error = json.loads(text_of(result))["error"]
            assert error["code"] == "SANDBOX_UNAVAILABLE"
            assert "sandbox cannot be built on this host" in error["message"]
        assert script_processes(frontend_pid(stack)) == []
        line = "code_execution is refused: its sandbox cannot be built here: bwrap is not installed"
        assert line in stack.log("frontend.log")
