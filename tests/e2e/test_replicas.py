"""Replicas sharing one state store in a real PostgreSQL: three `mcpvisor serve` on one database.

Given three replicas started at once on an empty database, a token made through one admits on
all, a revoked one is refused by all at their next request, the activity log is one log, and an
operator's block or approve through one holds on all (the time it took is printed, not asserted).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx2
import trio

from tests.support import postgres
from tests.support.postgres import PostgresCluster
from tests.support.stack import Stack, echo_server, launch_stack, open_replicas, stop_stack

postgres_cluster = postgres.cluster_fixture()
postgres_url = postgres.database_fixture()

MODERN = "2026-07-28"


def mcpvisor(config: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`mcpvisor ARGS -c CONFIG` (for `token`, whose -c follows the action)."""
    return subprocess.run(
        [sys.executable, "-P", "-m", "mcpvisor.supervisor", *args, "-c", str(config)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


async def rpc(http: httpx2.AsyncClient, stack: Stack, token: str, method: str, params: dict[str, Any]) -> Any:
    """One 2026-07-28 request (it may go to any replica) with `token`; the HTTP response."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "replica-test", "version": "1"},
    }
    headers = {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": method,
    }
    if isinstance(params.get("name"), str):
        headers["Mcp-Name"] = params["name"]
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}
    return await http.post(f"{stack.base_url}/mcp/direct", json=body, headers=headers)


async def call_echo(http: httpx2.AsyncClient, stack: Stack, token: str, text: str) -> dict[str, Any]:
    """Call echo:echo through `stack`; the tenant's worker there starts on its first request."""
    with trio.fail_after(60):
        while True:
            response = await rpc(http, stack, token, "tools/call", {"name": "echo:echo", "arguments": {"text": text}})
            assert response.status_code == 200, (response.status_code, response.text)
            answer = response.json()
            if "result" in answer and not answer["result"].get("isError"):
                return answer["result"]
            await trio.sleep(0.3)  # the worker is still starting on this replica


async def test_tokens_and_the_activity_log_are_shared_by_three_replicas(tmp_path: Path, postgres_url: str) -> None:
    servers = {"echo": echo_server("echo")}
    tables = {"tenants": {"team": {"servers": ["echo"]}}}
    # Started together on an empty database: the first ones race to create the schema.
    async with open_replicas(tmp_path, 3, servers, state_url=postgres_url, tables=tables, wait_for=[]) as replicas:
        config = replicas[0].config_path
        added = mcpvisor(config, "token", "add", "team")
        assert added.returncode == 0, added.stderr
        token = added.stdout.strip().splitlines()[-1]

        async with httpx2.AsyncClient(timeout=30) as http:
            # A token made through one replica's store admits on every replica.
            texts = {}
            for index, stack in enumerate(replicas):
                texts[index] = f"from replica {index}"
                result = await call_echo(http, stack, token, texts[index])
                assert texts[index] in str(result["content"])

            # Every replica lists the same one token (the store is one).
            listed = mcpvisor(replicas[2].config_path, "token", "list", "--json")
            assert listed.returncode == 0, listed.stderr
            assert '"tenant": "team"' in listed.stdout and token not in listed.stdout

            # The activity log is one log: any replica shows the calls made through all three.
            with trio.fail_after(10):
                while True:
                    code, answer = await replicas[1].actl("activity", "--server", "echo")
                    assert code == 0, answer
                    if len(answer["rows"]) >= 3:
                        break
                    await trio.sleep(0.2)
            assert {row["tenant"] for row in answer["rows"]} == {"team"}
            assert len({row["request_id"] for row in answer["rows"]}) == 3

            # Revoked through the third replica: the next request to each replica is refused.
            token_id = next(line for line in listed.stdout.splitlines() if '"id"' in line).split('"')[3]
            revoked = mcpvisor(replicas[2].config_path, "token", "revoke", token_id)
            assert revoked.returncode == 0, revoked.stderr
            for stack in replicas:
                response = await rpc(http, stack, token, "tools/list", {})
                assert response.status_code == 401, (response.status_code, response.text)
                assert "unknown, revoked or expired" in response.headers.get("www-authenticate", "")


async def rpc_plain(http: httpx2.AsyncClient, stack: Stack) -> set[str]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "replica-test", "version": "1"},
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "tools/list",
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": meta}}
    response = await http.post(f"{stack.base_url}/mcp/direct", json=body, headers=headers)
    assert response.status_code == 200, (response.status_code, response.text)
    return {tool["name"] for tool in response.json()["result"]["tools"]}


async def until_all(http: httpx2.AsyncClient, replicas: list[Stack], holds: Any) -> float:
    """Seconds until `holds(tool names)` is true on every replica (printed by the callers, never asserted)."""
    started = time.monotonic()
    with trio.fail_after(15):
        for stack in replicas:
            while not holds(await rpc_plain(http, stack)):
                await trio.sleep(0.02)
    return time.monotonic() - started


async def test_a_block_or_approve_through_one_replica_holds_on_all(tmp_path: Path, postgres_url: str) -> None:
    servers = {"echo": echo_server("echo"), "other": echo_server("other")}
    async with open_replicas(tmp_path, 3, servers, state_url=postgres_url) as replicas:
        files = {stack.config_path: stack.config_path.read_bytes() for stack in replicas}
        async with httpx2.AsyncClient(timeout=30) as http:
            assert "echo:echo" in await rpc_plain(http, replicas[2])

            code, answer = await replicas[0].actl("block", "echo")
            assert code == 0, answer
            took = await until_all(http, replicas, lambda names: "echo:echo" not in names and "other:echo" in names)
            print(f"\nblock through replica 0 held on all three after {took * 1000:.0f} ms")

            # The other replicas know the server is quarantined: their operators see it pending.
            code, pending = await replicas[2].actl("pending")
            assert code == 0, pending
            assert [row["name"] for row in pending["servers"]] == ["echo"]

            code, answer = await replicas[1].actl("approve", "echo")
            assert code == 0, answer
            took = await until_all(http, replicas, lambda names: "echo:echo" in names)
            print(f"approve through replica 1 held on all three after {took * 1000:.0f} ms")

            code, answer = await replicas[2].actl("disable", "other")
            assert code == 0, answer
            took = await until_all(http, replicas, lambda names: "other:echo" not in names)
            print(f"disable through replica 2 held on all three after {took * 1000:.0f} ms")
            status = await trio.to_thread.run_sync(replicas[0].status)
            assert status["other"]["state"] == "STOPPED"  # its worker stopped on replica 0 too

        # With a shared store the config file (a ConfigMap) is the base and is never written.
        assert {path: path.read_bytes() for path in files} == files

    # A replica started later applies the run-time changes made before it came.
    late = launch_stack(tmp_path / "late", servers, settings={"state_url": postgres_url})
    try:
        await late.wait_ready(["echo"])
        async with httpx2.AsyncClient(timeout=30) as http:
            names = await rpc_plain(http, late)
        assert "echo:echo" in names and "other:echo" not in names
    finally:
        await stop_stack(late)


def test_replicas_upgrading_an_empty_database_at_once_all_succeed(postgres_url: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from mcpvisor.store.state_pg import PostgresState

    stores = [PostgresState(postgres_url) for _ in range(6)]
    with ThreadPoolExecutor(len(stores)) as pool:
        versions = list(pool.map(lambda store: store.migrate(), stores))
    assert len(set(versions)) == 1 and versions[0] >= 1
    rows = stores[0].execute("SELECT version FROM mcpvisor_schema").fetchall()
    assert rows == [(versions[0],)]
    for store in stores:
        store.close()


async def test_a_bad_state_url_is_a_clear_error_without_the_password(
    tmp_path: Path, postgres_cluster: PostgresCluster
) -> None:
    secret = "Wr0ng-Secret-Value-42"
    config = tmp_path / "mcpvisor.toml"
    password_file = tmp_path / "pg-password"
    password_file.write_text(secret + "\n")
    env = {"PG_PASSWORD": secret}
    cases = {
        "wrong password (env)": (postgres_cluster.url(password="${env:PG_PASSWORD}"), "password authentication failed"),
        "wrong password (file)": (
            postgres_cluster.url(password=f"${{file:{password_file}}}"),
            "password authentication failed",
        ),
        "nothing listening": (f"postgresql://postgres:{secret}@127.0.0.1:1/db", "connection"),
        "unset variable": ("postgresql://postgres:${env:NOT_SET_ANYWHERE}@127.0.0.1:1/db", "NOT_SET_ANYWHERE"),
    }
    for case, (url, reason) in cases.items():
        config.write_text(f'[mcpvisor]\nlisten = "127.0.0.1:1"\nstate_url = "{url}"\ndata_dir = "{tmp_path / "d"}"\n')
        for command in (["serve"], ["token", "list"]):
            result = await trio.to_thread.run_sync(lambda command=command: mcpvisor(config, *command, env=env))
            output = result.stdout + result.stderr
            assert result.returncode == 1, (case, command, output)
            # The password as the URL has it: a reference as written (it names where the secret lives).
            password = url.partition("//postgres:")[2].rsplit("@", 1)[0]
            shown = password if password.startswith("${") else "***"
            assert f"state store postgresql://postgres:{shown}@127.0.0.1:" in output or "state_url" in output, output
            assert reason in output, (case, output)
            assert secret not in output, (case, output)

    config.write_text('[mcpvisor]\nstate_url = "mysql://u:p@h/db"\n')
    result = mcpvisor(config, "check")
    assert result.returncode == 2 and "state_url must start with postgresql://" in result.stderr
    assert "u:p@" not in result.stderr


async def test_a_proposal_made_on_one_replica_is_approved_on_another_and_runs_on_all(
    tmp_path: Path, postgres_url: str, postgres_cluster: PostgresCluster
) -> None:
    servers = {"echo": echo_server("echo")}
    async with open_replicas(tmp_path, 3, servers, state_url=postgres_url) as replicas:
        gamma = echo_server("gamma")
        async with replicas[0].client("/mcp") as client:
            with trio.fail_after(30):
                answer = await client.call_tool("upstream_servers", {"operation": "add", "name": "gamma", **gamma})
            assert "PENDING, NOT APPLIED" in str(answer.content)

        # The operator of another replica sees the proposal, and approves it there.
        with trio.fail_after(10):
            while True:
                code, pending = await replicas[2].actl("pending")
                assert code == 0, pending
                if pending["proposals"]:
                    break
                await trio.sleep(0.1)
        assert [row["name"] for row in pending["proposals"]] == ["gamma"]
        code, answer = await replicas[1].actl("approve", "gamma")
        assert code == 0, answer

        async with httpx2.AsyncClient(timeout=30) as http:
            took = await until_all(http, replicas, lambda names: "gamma:echo" in names)
            print(f"\napproved proposal ran on all three after {took * 1000:.0f} ms")
            code, pending = await replicas[0].actl("pending")
            assert code == 0 and pending["proposals"] == []

            # A change that reached the store without its notification (a dropped connection) is
            # still applied: every replica re-reads the store every few seconds.
            postgres_cluster.psql(
                'UPDATE server_changes SET server = replace(server, \'"command"\', \'"enabled":false,"command"\')'
                " WHERE name = 'gamma'",
                database=postgres_url.rsplit("/", 1)[1],
            )
            took = await until_all(http, replicas, lambda names: "gamma:echo" not in names)
            print(f"a change without a notification held on all three after {took * 1000:.0f} ms")
        for stack in replicas:
            assert not (stack.data_dir / "proposals.json").exists()


async def test_replicas_outlive_an_outage_of_the_store_and_follow_it_again(tmp_path: Path) -> None:
    servers = {"echo": echo_server("echo")}
    tables = {"tenants": {"team": {"servers": ["echo"]}}}
    with postgres.running_postgres() as cluster:
        url = cluster.create_database("outage")
        async with open_replicas(tmp_path, 2, servers, state_url=url, tables=tables, wait_for=[]) as replicas:
            added = mcpvisor(replicas[0].config_path, "token", "add", "team")
            assert added.returncode == 0, added.stderr
            token = added.stdout.strip().splitlines()[-1]
            async with httpx2.AsyncClient(timeout=30) as http:
                await call_echo(http, replicas[1], token, "before")

                await trio.to_thread.run_sync(cluster.stop)
                # No token can be checked: a clear 503 to retry, never a token admitted unchecked.
                for stack in replicas:
                    response = await rpc(http, stack, token, "tools/list", {})
                    assert response.status_code == 503, (response.status_code, response.text)
                    assert "state store cannot be reached" in response.json()["message"]
                    assert response.headers["retry-after"] == "2"
                code, answer = await replicas[0].actl("disable", "echo")
                assert code != 0 and "not changed" in str(answer), answer

                await trio.to_thread.run_sync(cluster.start)
                with trio.fail_after(30):
                    while (await rpc(http, replicas[0], token, "tools/list", {})).status_code != 200:
                        await trio.sleep(0.2)
                # Each replica listens again: a change through one reaches the other.
                code, answer = await replicas[0].actl("disable", "echo")
                assert code == 0, answer
                with trio.fail_after(15):
                    while True:
                        response = await rpc(http, replicas[1], token, "tools/list", {})
                        if response.status_code == 200:
                            names = {tool["name"] for tool in response.json()["result"]["tools"]}
                            if "echo:echo" not in names:
                                break
                        await trio.sleep(0.1)
            for stack in replicas:
                assert stack.process.poll() is None
                assert cluster.password not in stack.log("frontend.log") + stack.log("supervisor.log")
