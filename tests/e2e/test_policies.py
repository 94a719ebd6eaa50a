"""The five worked examples of docs/policies.md, read from the page and run against a real stack.

Given two tenants, alice and bob, each with the echo test server, and the page's policies put in
force one example after the other with `ctl update`, SDK clients of both protocol eras see exactly
what the page says: the refusals' texts, the waits for an operator and their verdicts, the limits,
and dry-run's record of what would have been refused.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
import tomli_w
import trio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.e2e.test_tenants import add_token
from tests.support.stack import REPO, Stack, echo_server, open_stack

PAGE = REPO / "docs" / "policies.md"
SERVERS = {"echo": echo_server("echo")}


def servers_writing_to(files: Path) -> dict[str, Any]:
    """The echo server, whose sandbox (tenants' servers always run in one) may write to `files`."""
    files.mkdir(exist_ok=True)
    files.chmod(0o777)  # the sandbox runs the upstream as an unprivileged user
    return {"echo": echo_server("echo", sandbox={"rw": [str(files)]})}


TENANTS = {"alice": {"servers": ["echo"]}, "bob": {"servers": ["echo"]}}
ERAS = ("legacy", "auto")  # 2025-11-25 sessions, and 2026-07-28 requests


def example(name: str) -> str:
    """The code block under `<!-- example: NAME -->` on the policies page."""
    text = PAGE.read_text(encoding="utf-8")
    marker = f"<!-- example: {name} -->\n```"
    assert marker in text, f"no example {name!r} on {PAGE}"
    block = text.split(marker, 1)[1].split("```", 1)[0]
    return block.split("\n", 1)[1]


def text_of(result: Any) -> str:
    return "".join(block.text for block in result.content if getattr(block, "text", None))


@asynccontextmanager
async def tenant_client(stack: Stack, token: str, mode: str, path: str = "/mcp/direct") -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120) as http,
        Client(streamable_http_client(f"{stack.base_url}{path}", http_client=http), mode=mode) as client,
    ):
        yield client


async def put_in_force(stack: Stack, cedar: str, policy_table: dict[str, Any] | None = None) -> None:
    """Write the policy file (and the config's [policy] table) and apply them with `ctl update`."""
    (stack.config_path.parent / "policies.cedar").write_text(cedar)
    config = tomllib.loads(stack.config_path.read_text())
    config["policy"] = policy_table or {"files": ["policies.cedar"], "approval_timeout": 60}
    stack.config_path.write_text(tomli_w.dumps(config))
    code, output = await stack.actl("update", json_output=False)
    assert code == 0, output


@asynccontextmanager
async def policy_stack(tmp_path: Path) -> AsyncIterator[tuple[Stack, dict[str, str]]]:
    config = tmp_path / "mcpvisor.toml"
    (tmp_path / "policies.cedar").write_text('@id("baseline")\npermit(principal, action, resource);\n')
    tables = {"tenants": TENANTS, "policy": {"files": ["policies.cedar"], "approval_timeout": 60}}
    data = tmp_path / "data"
    servers = servers_writing_to(tmp_path / "files")
    config.write_text(tomli_w.dumps({"mcpvisor": {"data_dir": str(data)}, "servers": servers, **tables}))
    tokens = {tenant: add_token(config, tenant) for tenant in ("alice", "bob")}
    tokens["ops"] = add_token(config, "ops", "--admin")
    async with open_stack(tmp_path, servers, wait_for=[], tables=tables) as stack:
        yield stack, tokens


async def waiting_calls(stack: Stack, count: int, timeout: float = 60) -> list[dict[str, Any]]:
    """The waiting calls once there are `count`, asked on the control socket as `ctl calls` asks."""
    with trio.fail_after(timeout):
        while True:
            reply = await trio.to_thread.run_sync(stack.control, "calls")
            assert reply.ok, reply
            if len(reply.result) >= count:
                return reply.result
            await trio.sleep(0.2)


async def test_the_five_examples_of_the_policies_page(tmp_path: Path) -> None:
    async with policy_stack(tmp_path) as (stack, tokens):
        await read_only_tenant(stack, tokens)
        await destructive_needs_approval(stack, tokens, tmp_path)
        await argument_conditions(stack, tokens, tmp_path)
        await per_tool_limits(stack, tokens)
        await dry_run_rollout(stack, tokens)


async def read_only_tenant(stack: Stack, tokens: dict[str, str]) -> None:
    await put_in_force(stack, example("read-only-tenant"))
    for mode in ERAS:
        async with tenant_client(stack, tokens["alice"], mode) as alice:
            refused = await alice.call_tool("echo:add", {"a": 1, "b": 2})
            assert refused.is_error
            assert text_of(refused) == (
                "Tool 'echo:add' was not run: refused by policy 'alice-read-only': "
                "alice's team may only use read-only tools."
            )
            meta = refused.meta or {}
            assert (meta["io.mcpvisor/decision"], meta["io.mcpvisor/policies"]) == ("deny", ["alice-read-only"])
            echoed = await alice.call_tool("echo:echo", {"text": "hi"})
            assert (echoed.is_error, text_of(echoed)) == (False, "hi")
        async with tenant_client(stack, tokens["bob"], mode) as bob:
            added = await bob.call_tool("echo:add", {"a": 1, "b": 2})
            assert (added.is_error, text_of(added)) == (False, "3")


async def destructive_needs_approval(stack: Stack, tokens: dict[str, str], tmp_path: Path) -> None:
    await put_in_force(stack, example("destructive-needs-approval"))
    files = tmp_path / "files"
    allowed, denied, forgotten = files / "allowed", files / "denied", files / "forgotten"
    results: dict[str, Any] = {}
    progress: list[str] = []

    async def on_progress(_done: float, _total: float | None, message: str | None) -> None:
        progress.append(message or "")

    async def call(name: str, mode: str, path: Path) -> None:
        async with tenant_client(stack, tokens["bob"], mode) as bob:
            results[name] = await bob.call_tool("echo:touch", {"path": str(path)}, progress_callback=on_progress)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call, "allowed", "legacy", allowed)
        (allow,) = await waiting_calls(stack, 1)
        nursery.start_soon(call, "denied", "auto", denied)
        deny = next(call for call in await waiting_calls(stack, 2) if call["id"] != allow["id"])
        # Arguments are redacted as the activity log redacts them (a long path looks like a token).
        assert json.loads(allow["arguments"]).keys() == {"path"}
        assert (allow["tenant"], allow["tool"], allow["policies"]) == (
            "bob",
            "echo:touch",
            ["destructive-needs-approval"],
        )
        assert not allowed.exists() and not denied.exists()  # nothing ran while they wait
        code, table = await stack.actl("calls", json_output=False)
        assert code == 0 and allow["id"] in table and "echo:touch" in table
        code, verdict = await stack.actl("allow", allow["id"])
        assert (code, verdict["verdict"], verdict["tenant"]) == (0, "allow", "bob"), verdict
        code, verdict = await stack.actl("deny", deny["id"], "--reason", "not now")
        assert code == 0, verdict
    assert not results["allowed"].is_error and allowed.exists(), text_of(results["allowed"])
    # Both eras' clients were told, while they waited, that an operator must decide (never how).
    for held in (allow, deny):
        assert f"Waiting for an operator's approval of echo:touch (call {held['id']}" in "\n".join(progress), progress
    assert not any("ctl" in line or "allow" in line for line in progress), progress
    assert results["denied"].is_error and not denied.exists()
    assert (
        text_of(results["denied"])
        == f"Tool 'echo:touch' was not run: an operator denied it (call {deny['id']}): not now."
    )

    # No verdict: refused after approval_timeout (6 s here).
    await put_in_force(
        stack, example("destructive-needs-approval"), {"files": ["policies.cedar"], "approval_timeout": 6}
    )
    await call("forgotten", "legacy", forgotten)
    assert text_of(results["forgotten"]) == (
        "Tool 'echo:touch' was not run: it waited for an operator's approval (policy 'destructive-needs-approval')"
        " and no operator decided within 6 s (approval_timeout)."
    )
    assert not forgotten.exists()
    code, output = await stack.actl("allow", allow["id"], json_output=False)
    assert code == 4 and "is waiting for approval: it was decided already" in output


async def argument_conditions(stack: Stack, tokens: dict[str, str], tmp_path: Path) -> None:
    await put_in_force(stack, example("argument-conditions"))
    inside, outside = tmp_path / "files" / "scratch" / "a", tmp_path / "files" / "elsewhere" / "a"
    for folder in (inside.parent, outside.parent):
        folder.mkdir()
        folder.chmod(0o777)
    for mode in ERAS:
        async with tenant_client(stack, tokens["alice"], mode) as alice:
            written = await alice.call_tool("echo:touch", {"path": str(inside)})
            assert not written.is_error and inside.exists()
            refused = await alice.call_tool("echo:touch", {"path": str(outside)})
            assert text_of(refused) == (
                "Tool 'echo:touch' was not run: refused by policy 'touch-only-in-scratch': "
                "echo:touch writes only inside a scratch directory."
            )
            assert not outside.exists()
            no_path = await alice.call_tool("echo:touch", {})  # no argument at all: refused too
            assert no_path.is_error and "touch-only-in-scratch" in text_of(no_path)
        inside.unlink()


async def per_tool_limits(stack: Stack, tokens: dict[str, str]) -> None:
    await put_in_force(
        stack,
        '@id("baseline")\npermit(principal, action, resource);\n',
        tomllib.loads(example("per-tool-limits"))["policy"],
    )
    async with (
        tenant_client(stack, tokens["alice"], "legacy") as alice,
        tenant_client(stack, tokens["bob"], "auto") as bob,
    ):
        for _ in range(2):
            assert not (await alice.call_tool("echo:add", {"a": 1, "b": 1})).is_error
        over = await alice.call_tool("echo:add", {"a": 1, "b": 1})
        assert over.is_error
        assert re.fullmatch(
            r"Tool 'echo:add' was not run: tenant 'alice' is over its limit of 2 calls per minute of 'echo:add'"
            r" \(policy\.limits calls_per_minute\); retry in \d+\.\ds",
            text_of(over),
        ), text_of(over)
        assert 1 <= over.meta["io.mcpvisor/retryAfter"] <= 30
        assert not (await bob.call_tool("echo:add", {"a": 1, "b": 1})).is_error  # bob counts apart

        results: list[Any] = []

        async def slow() -> None:
            results.append(await alice.call_tool("echo:slow", {"seconds": 3}))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(slow)
            await trio.sleep(1.5)
            second = await alice.call_tool("echo:slow", {"seconds": 0})
        assert text_of(second) == (
            "Tool 'echo:slow' was not run: tenant 'alice' has 1 calls of 'echo:slow' running, its limit"
            " (policy.limits max_in_flight = 1); retry when one has finished"
        )
        assert not results[0].is_error
        assert not (await alice.call_tool("echo:slow", {"seconds": 0})).is_error  # released


async def dry_run_rollout(stack: Stack, tokens: dict[str, str]) -> None:
    await put_in_force(stack, example("read-only-tenant"), tomllib.loads(example("dry-run-rollout"))["policy"])
    async with tenant_client(stack, tokens["alice"], "auto") as alice:
        added = await alice.call_tool("echo:add", {"a": 1, "b": 2})
        assert (added.is_error, text_of(added)) == (False, "3")
    code, log = await stack.actl("activity", "-n", "5", json_output=False)
    assert code == 0 and "[would deny: alice-read-only]" in log, log
    code, rows = await stack.actl("activity", "-n", "5")
    row = [r for r in rows["rows"] if r["tool"] == "add" and r["tenant"] == "alice"][-1]
    assert (row["decision"], row["policies"], row["outcome"]) == ("would deny", '["alice-read-only"]', "ok")
    # Operators' changes are rows of the log (and of its chain) too.
    code, rows = await stack.actl("activity", "-n", "100")
    changes = [(r["tool"], r["client"]) for r in rows["rows"] if r["kind"] == "operator"]
    assert ("update", "ctl") in changes, changes
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {tokens['ops']}"}) as http:
        metrics = (await http.get(f"{stack.base_url}/metrics")).text
    assert re.search(r'mcpvisor_policy_decisions_total\{action="call",effect="deny",mode="dry-run"\} [1-9]', metrics)
    verified = await trio.to_thread.run_sync(
        lambda: __import__("subprocess").run(
            [
                __import__("sys").executable,
                "-m",
                "mcpvisor.supervisor.cli",
                "activity",
                "verify",
                "-c",
                str(stack.config_path),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
    )
    assert verified.returncode == 0 and verified.stdout.startswith("activity log intact"), verified.stdout


@pytest.mark.parametrize("name", ["read-only-tenant", "destructive-needs-approval", "argument-conditions"])
def test_each_example_policy_passes_check_and_policy_test(tmp_path: Path, name: str) -> None:
    """The page's policies are valid as written, and `policy test` decides them as the stack does."""
    import subprocess
    import sys

    (tmp_path / "policies.cedar").write_text(example(name))
    config = tmp_path / "mcpvisor.toml"
    config.write_text(
        tomli_w.dumps(
            {
                "mcpvisor": {"data_dir": str(tmp_path / "data")},
                "servers": SERVERS,
                "tenants": TENANTS,
                "policy": {"files": ["policies.cedar"]},
            }
        )
    )

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "mcpvisor.supervisor.cli", *args], capture_output=True, text=True, check=False
        )

    checked = run("check", "-c", str(config))
    assert checked.returncode == 0, checked.stderr
    assert "warning" not in checked.stdout
    expected = {
        "read-only-tenant": ("alice", "echo:add", "{}", "deny"),
        "destructive-needs-approval": ("bob", "echo:touch", '{"path": "/tmp/x"}', "approval"),
        "argument-conditions": ("bob", "echo:touch", '{"path": "/tmp/elsewhere/x"}', "deny"),
    }[name]
    tenant, tool, args, effect = expected
    decided = run(
        "policy", "test", "-c", str(config), "--tenant", tenant, "--tool", tool, "--args", args, "--expect", effect
    )
    assert decided.returncode == 0, decided.stdout + decided.stderr
    assert decided.stdout.startswith(f"decision: {effect}")
