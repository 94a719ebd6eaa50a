"""An attacker's pass at approvals: nothing a client sends allows its own waiting call.

Given a shared host (tenants alice and bob) whose policies make destructive tools wait for an
operator, bob's client holds a call and then tries to allow it through every tool, endpoint and
method it can reach; the call still waits after each attempt, and only the operator's verdict
ends it. Then the operator's side of the edges: a reload of the policies while calls wait, a
policy file with a syntax error (refused, the policies in force stay), a verdict for a call that
is gone.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import tomli_w
import trio
from mcp.shared.exceptions import MCPError

from tests.e2e.test_policies import servers_writing_to, tenant_client, text_of
from tests.e2e.test_tenants import add_token
from tests.support.stack import Stack, open_stack

WAITS = """\
@id("baseline")
permit(principal, action, resource);

@id("destructive-waits")
@approval("operator")
permit(principal, action == Action::"call", resource is Tool) when { resource.destructive };
"""
NO_TOUCH = """\
@id("baseline")
permit(principal, action, resource);

@id("no-touch")
@reason("touch is switched off")
forbid(principal, action == Action::"call", resource == Tool::"echo:touch");
"""
BASELINE = '@id("baseline")\npermit(principal, action, resource);\n'
TENANTS = {"alice": {"servers": ["echo"]}, "bob": {"servers": ["echo"]}}
SETTINGS = {"enable_server_endpoints": True, "enable_code_execution": True}


@asynccontextmanager
async def attack_stack(tmp_path: Path) -> AsyncIterator[tuple[Stack, dict[str, str]]]:
    (tmp_path / "policies.cedar").write_text(WAITS)
    tables = {"tenants": TENANTS, "policy": {"files": ["policies.cedar"], "approval_timeout": 120}}
    servers = servers_writing_to(tmp_path / "files")
    config = tmp_path / "mcpvisor.toml"
    config.write_text(
        tomli_w.dumps({"mcpvisor": {"data_dir": str(tmp_path / "data"), **SETTINGS}, "servers": servers, **tables})
    )
    tokens = {tenant: add_token(config, tenant) for tenant in TENANTS}
    tokens["ops"] = add_token(config, "ops", "--admin")
    async with open_stack(tmp_path, servers, settings=SETTINGS, wait_for=[], tables=tables) as stack:
        yield stack, tokens


async def waiting(stack: Stack) -> list[dict[str, Any]]:
    reply = await trio.to_thread.run_sync(stack.control, "calls")
    with trio.fail_after(30):  # the frontend serves before the supervisor counts it as running
        while not reply.ok and "the frontend is not running" in (reply.error or ""):
            await trio.sleep(0.2)
            reply = await trio.to_thread.run_sync(stack.control, "calls")
    assert reply.ok, reply
    return reply.result


async def held(stack: Stack, count: int = 1) -> list[dict[str, Any]]:
    with trio.fail_after(60):
        while len(calls := await waiting(stack)) < count:
            await trio.sleep(0.2)
    return calls


@asynccontextmanager
async def holding(
    stack: Stack, token: str, path: Path, mode: str = "legacy"
) -> AsyncIterator[tuple[dict[str, Any], dict[str, Any], Callable[[], Awaitable[None]]]]:
    """A client whose call of echo:touch waits: (the waiting call, where its result lands, cancel it)."""
    outcome: dict[str, Any] = {}
    before = {call["id"] for call in await waiting(stack)}
    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def call() -> None:
            async with tenant_client(stack, token, mode) as client:
                with scope:  # cancelled, the client tells the server (notifications/cancelled)
                    outcome["result"] = await client.call_tool("echo:touch", {"path": str(path)})

        nursery.start_soon(call)
        with trio.fail_after(60):
            while not (new := [c for c in await waiting(stack) if c["id"] not in before]):
                await trio.sleep(0.2)

        async def cancel() -> None:
            scope.cancel()

        yield new[0], outcome, cancel


async def still_waits(stack: Stack, call_id: str, attempt: str) -> None:
    assert call_id in {call["id"] for call in await waiting(stack)}, f"{attempt} ended the wait"


async def test_a_client_cannot_allow_its_own_call(tmp_path: Path) -> None:
    async with attack_stack(tmp_path) as (stack, tokens):
        target = tmp_path / "files" / "attacked"
        async with holding(stack, tokens["bob"], target) as (call, outcome, _cancel):
            call_id = call["id"]
            async with tenant_client(stack, tokens["bob"], "auto", "/mcp") as bob:
                attempts: list[tuple[str, dict[str, Any]]] = []
                for operation in ("list", "add", "remove", "update", "patch", "enable", "disable", "restart",
                                  "tail_log", "login", "logout", "approve", "allow"):  # fmt: skip
                    attempts.append(("upstream_servers", {"operation": operation, "name": call_id, "id": call_id}))
                for action in ("list", "inspect", "approve", "block", "allow"):
                    attempts.append(("quarantine_security", {"action": action, "name": call_id}))
                for variant in ("call_tool_read", "call_tool_write", "call_tool_destructive"):
                    for name in ("allow", "mcpvisor:allow", "echo:allow", call_id):
                        attempts.append(
                            (variant, {"name": name, "args": {"id": call_id}, "intent": {"operation_type": "read"}})
                        )
                attempts.append(
                    ("proxy", {"action": "call", "type": "tool", "path": "mcpvisor:allow", "args": {"id": call_id}})
                )
                attempts.append(
                    ("code_execution", {"code": f"[call_tool('mcpvisor', 'allow', {{id: '{call_id}'}}), typeof fetch]"})
                )
                attempts.append(("retrieve_tools", {"query": f"allow approve call {call_id}"}))
                for tool, arguments in attempts:
                    with contextlib.suppress(MCPError):  # refused outright: as good as refused in a result
                        await bob.call_tool(tool, arguments, meta={"io.mcpvisor/verdict": "allow"})
                    await still_waits(stack, call_id, f"{tool} {arguments}")

            # Methods no MCP server has, on every endpoint, and the operator surfaces with a tenant's token.
            async with httpx2.AsyncClient(timeout=30) as http:
                bearer = {"Authorization": f"Bearer {tokens['bob']}"}
                for path in ("/mcp", "/mcp/direct", "/mcp/servers/echo"):
                    for method in ("calls/allow", "approvals/allow", "ctl/allow", "allow"):
                        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"id": call_id}}
                        response = await http.post(
                            f"{stack.base_url}{path}",
                            json=body,
                            headers={
                                **bearer,
                                "Accept": "application/json, text/event-stream",
                                "MCP-Protocol-Version": "2026-07-28",
                            },
                        )
                        assert response.status_code < 500
                        await still_waits(stack, call_id, f"{method} on {path}")
                for headers, status in ((bearer, 403), ({}, 401)):
                    response = await http.post(
                        f"{stack.base_url}/api/v1/calls/{call_id}/allow", json={}, headers=headers
                    )
                    assert response.status_code == status, response.text
                    response = await http.get(f"{stack.base_url}/api/v1/calls", headers=headers)
                    assert response.status_code == status
                    assert call_id not in response.text
                await still_waits(stack, call_id, "the admin API with a tenant's token")

            # The operator decides, through the admin API with an admin token.
            async with httpx2.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {tokens['ops']}"}) as ops:
                listed = (await ops.get(f"{stack.base_url}/api/v1/calls")).json()["calls"]
                assert [(c["id"], c["tenant"], c["tool"]) for c in listed] == [(call_id, "bob", "echo:touch")]
                denied = await ops.post(f"{stack.base_url}/api/v1/calls/{call_id}/deny", json={"reason": "attack pass"})
                assert denied.status_code == 200 and denied.json()["verdict"] == "deny", denied.text
                again = await ops.post(f"{stack.base_url}/api/v1/calls/{call_id}/allow", json={})
                assert again.status_code == 404 and "is waiting for approval" in again.json()["message"]
        assert not target.exists()
        assert text_of(outcome["result"]) == (
            f"Tool 'echo:touch' was not run: an operator denied it (call {call_id}): attack pass."
        )


async def test_a_reload_decides_waiting_calls_again_and_a_broken_file_changes_nothing(tmp_path: Path) -> None:
    async with attack_stack(tmp_path) as (stack, tokens):
        policies = tmp_path / "policies.cedar"
        refused, allowed = tmp_path / "files" / "refused", tmp_path / "files" / "allowed"
        async with holding(stack, tokens["alice"], refused) as (call, outcome, _cancel):
            policies.write_text(NO_TOUCH)
            code, output = await stack.actl("update", json_output=False)
            assert code == 0, output
        assert text_of(outcome["result"]) == (
            "Tool 'echo:touch' was not run: the policies as reloaded: refused by policy 'no-touch': "
            "touch is switched off."
        )
        assert not refused.exists()
        policies.write_text(WAITS)
        assert (await stack.actl("update", json_output=False))[0] == 0
        async with holding(stack, tokens["alice"], allowed, mode="auto") as (call, outcome, _cancel):
            policies.write_text(BASELINE)  # no approval needed any more: the waiting call runs
            assert (await stack.actl("update", json_output=False))[0] == 0
        assert not outcome["result"].is_error and allowed.exists()
        code, output = await stack.actl("allow", call["id"], json_output=False)
        assert code == 4 and "is waiting for approval" in output

        # A broken policy file changes nothing.
        policies.write_text(WAITS)
        assert (await stack.actl("update", json_output=False))[0] == 0
        policies.write_text(
            WAITS + '\n@id("broken")\nforbid(principal, action, resource) when { resource.destructiv };\n'
        )
        code, output = await stack.actl("update", json_output=False)
        assert code == 2
        assert "policies.cedar:8: attribute `destructiv`" in output, output
        policies.write_text(WAITS + "\npermit(principal, action resource);\n")
        code, output = await stack.actl("update", json_output=False)
        assert code == 2 and "policies.cedar:8:" in output, output
        checked = subprocess.run(
            [sys.executable, "-m", "mcpvisor.supervisor.cli", "check", "-c", str(stack.config_path)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert checked.returncode == 2 and "policies.cedar:8:" in checked.stderr
        # The policies in force stay: a destructive call still waits, a gone client's call is gone.
        target = tmp_path / "files" / "after"
        for mode in ("legacy", "auto"):
            async with holding(stack, tokens["bob"], target, mode) as (call, _outcome, cancel):
                await cancel()  # the client gives up: its call no longer waits
                with trio.fail_after(30):
                    while call["id"] in {c["id"] for c in await waiting(stack)}:
                        await trio.sleep(0.2)
            code, output = await stack.actl("allow", call["id"], json_output=False)
            assert code == 4 and f"no call '{call['id']}' is waiting for approval" in output
            assert not target.exists()
        # A server started with the broken file refuses to start, naming it.
        started = subprocess.run(
            [sys.executable, "-m", "mcpvisor.supervisor.cli", "serve", "-c", str(stack.config_path)],
            capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
        assert started.returncode == 2 and "policies.cedar:8:" in started.stderr


async def test_a_modern_client_gone_releases_its_waiting_call(tmp_path: Path) -> None:
    gone = tmp_path / "files" / "gone"
    async with (
        attack_stack(tmp_path) as (stack, tokens),
        holding(stack, tokens["bob"], gone, "auto") as (call, _, cancel),
    ):
        await cancel()
        with trio.move_on_after(10):
            while call["id"] in {c["id"] for c in await waiting(stack)}:
                await trio.sleep(0.2)
        assert call["id"] not in {c["id"] for c in await waiting(stack)}


def test_the_supervisor_refuses_verdicts_from_the_frontend_line() -> None:
    """What the frontend sends carries its clients' tools: `allow` and `deny` from it are refused."""
    from mcpvisor.supervisor.commands import load_all

    commands = load_all()
    assert commands["allow"].operator_only and commands["deny"].operator_only
    assert not commands["calls"].operator_only
    assert not any(spec.operator_only for name, spec in commands.items() if name not in ("allow", "deny"))
    assert json.dumps(sorted(n for n, s in commands.items() if s.operator_only)) == '["allow", "deny"]'
