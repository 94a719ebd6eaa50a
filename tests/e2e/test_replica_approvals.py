"""Approvals across replicas: a call held by one replica is listed, allowed or denied through any other.

Given two replicas on one PostgreSQL store and a policy that makes destructive tools wait, a call
waiting on replica 0 is listed by replica 1's `ctl calls`, and `ctl allow` there runs it on
replica 0; a call waiting on replica 1 is denied through replica 0. Both replicas appended their
rows to one activity chain, which verifies.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import trio

from tests.e2e.test_approval_attacks import WAITS
from tests.e2e.test_policies import text_of
from tests.support import postgres
from tests.support.stack import Stack, echo_server, open_replicas

postgres_cluster = postgres.cluster_fixture()
postgres_url = postgres.database_fixture()


async def calls_of(stack: Stack) -> list[dict[str, Any]]:
    reply = await trio.to_thread.run_sync(stack.control, "calls")
    assert reply.ok, reply
    return reply.result


async def held_on(holder: Stack, other: Stack, path: Path, outcome: dict[str, Any], nursery: trio.Nursery) -> str:
    """Start a call of echo:touch on `holder`; its id once `other` lists it."""
    before = {call["id"] for call in await calls_of(other)}

    async def call() -> None:
        async with holder.client("/mcp/direct", mode="legacy") as client:
            outcome["result"] = await client.call_tool("echo:touch", {"path": str(path)})

    nursery.start_soon(call)
    with trio.fail_after(60):
        while not (new := [c for c in await calls_of(other) if c["id"] not in before]):
            await trio.sleep(0.2)
    return new[0]["id"]


async def test_a_call_held_by_one_replica_is_decided_through_another(tmp_path: Path, postgres_url: str) -> None:
    policies = tmp_path / "policies.cedar"
    policies.write_text(WAITS)
    tables = {"policy": {"files": [str(policies)], "approval_timeout": 120}}
    servers = {"echo": echo_server()}
    async with open_replicas(tmp_path, 2, servers, state_url=postgres_url, tables=tables) as (first, second):
        allowed, denied = tmp_path / "allowed", tmp_path / "denied"
        ran: dict[str, Any] = {}
        refused: dict[str, Any] = {}
        async with trio.open_nursery() as nursery:
            call_id = await held_on(first, second, allowed, ran, nursery)
            assert [call["tool"] for call in await calls_of(first)] == ["echo:touch"]  # both list it
            code, verdict = await second.actl("allow", call_id)
            assert code == 0 and verdict["verdict"] == "allow", verdict
        assert not ran["result"].is_error and allowed.exists()

        async with trio.open_nursery() as nursery:
            call_id = await held_on(second, first, denied, refused, nursery)
            code, output = await first.actl("deny", call_id, "--reason", "from the other replica", json_output=False)
            assert code == 0, output
        assert text_of(refused["result"]) == (
            f"Tool 'echo:touch' was not run: an operator denied it (call {call_id}): from the other replica."
        )
        assert not denied.exists()
        assert await calls_of(first) == [] and await calls_of(second) == []
        code, output = await first.actl("allow", call_id, json_output=False)
        assert code == 4, output

        verified = subprocess.run(
            [sys.executable, "-m", "mcpvisor.supervisor.cli", "activity", "verify", "-c", str(first.config_path)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert verified.returncode == 0, verified.stdout + verified.stderr
        code, rows = await second.actl("activity", "-n", "20")
        kinds = [(row["kind"], row["variant"]) for row in rows["rows"]]
        assert ("approval", "allow") in kinds and ("approval", "deny") in kinds
