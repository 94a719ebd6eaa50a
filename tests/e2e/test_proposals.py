"""The client is the attacker: what it asks `upstream_servers` to change runs nothing until an operator approves.

Each scenario runs a real stack. An MCP client adds, patches, removes or disables servers; none of
it spawns a process, opens a connection or resolves a secret reference. The operator sees the
proposals with `mcpvisor ctl pending` / `inspect`, applies one with `approve` and drops one with
`block`.
"""

from __future__ import annotations

import json
import shlex
import stat
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import mcp_types as types
import tomlkit
import trio
from mcp import Client

from tests.support.stack import UPSTREAMS, Stack, echo_server, free_port, open_stack, stop_stack

QUIET_SECONDS = 3.0  # how long a refused or pending change is given to do harm before we look


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(item.text for item in result.content if isinstance(item, types.TextContent))


def data_of(result: types.CallToolResult) -> Any:
    assert not result.is_error, text_of(result)
    return json.loads(text_of(result))


async def manage(client: Client, **arguments: Any) -> types.CallToolResult:
    with trio.fail_after(30):
        return await client.call_tool("upstream_servers", arguments)


async def listing(client: Client) -> dict[str, Any]:
    return data_of(await manage(client, operation="list"))


async def ctl(stack: Stack, *args: str) -> tuple[int, Any]:
    code, output = await stack.actl(*args)
    assert not isinstance(output, str), f"not JSON: {output}"
    return code, output


async def ctl_text(stack: Stack, *args: str) -> tuple[int, str]:
    return await stack.actl(*args, json_output=False)


async def echo(client: Client, server: str, text: str) -> str:
    with trio.fail_after(30):
        result = await client.call_tool(f"{server}:echo", {"text": text})
    assert not result.is_error, text_of(result)
    return text_of(result)


async def upstream_pid(client: Client, server: str) -> int:
    with trio.fail_after(30):
        return int(text_of(await client.call_tool(f"{server}:pid", {})))


async def wait_until(condition: Any, what: str, timeout: float = 30.0) -> None:
    with trio.move_on_after(timeout):
        while not await condition():
            await trio.sleep(0.2)
        return
    raise AssertionError(f"timed out waiting for {what}")


def assert_pending_answer(result: types.CallToolResult, name: str, action: str) -> dict[str, Any]:
    answer = data_of(result)
    assert answer["pending"] is True and answer["action"] == action and answer["name"] == name, answer
    assert "PENDING, NOT APPLIED" in answer["message"]
    assert f"mcpvisor ctl approve {name}" in answer["message"]
    return answer


async def test_a_clients_add_runs_nothing_until_the_operator_approves_it(tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    async with open_stack(tmp_path, {"alpha": echo_server("alpha")}) as stack, stack.client() as client:
        before = stack.pids()
        config_before = stack.config_path.read_text()
        evil = {"command": "sh", "args": ["-c", f"touch {marker}"], "policy": {"startretries": 0}}
        assert_pending_answer(await manage(client, operation="add", name="evil", **evil), "evil", "add")

        await trio.sleep(QUIET_SECONDS)
        assert not marker.exists(), "a client's add ran its command before any approval"
        assert stack.pids() - before == set(), "a client's add spawned a process"
        assert stack.config_path.read_text() == config_before
        listed = await listing(client)
        assert [server["name"] for server in listed["servers"]] == ["alpha"]
        assert listed["pending"] == [
            {
                "name": "evil",
                "action": "add",
                "proposed_at": listed["pending"][0]["proposed_at"],
                "transport": "stdio",
                "command": "sh",
                "args": ["-c", f"touch {marker}"],
            }
        ]
        assert not any(name.startswith("evil:") for name in [t.name for t in (await client.list_tools()).tools])

        # The operator sees it, with the exact command line it would run.
        code, pending = await ctl(stack, "pending")
        assert code == 0 and pending["servers"] == []
        assert [(row["name"], row["action"]) for row in pending["proposals"]] == [("evil", "add")]
        code, text = await ctl_text(stack, "pending")
        assert code == 0 and text.split()[:3] == ["evil", "proposed", "add"]
        code, inspection = await ctl(stack, "inspect", "evil")
        assert code == 0
        assert (inspection["kind"], inspection["action"]) == ("proposal", "add")
        assert inspection["command"] == ["sh", "-c", f"touch {marker}"]
        assert inspection["transport"] == "stdio"
        code, text = await ctl_text(stack, "inspect", "evil")
        assert code == 0 and shlex.join(["sh", "-c", f"touch {marker}"]) in text
        assert "mcpvisor ctl approve evil" in text
        assert not marker.exists()

        # Approved, it runs: the operator decided what runs.
        code, decision = await ctl(stack, "approve", "evil")
        assert code == 0, decision
        assert (decision["kind"], decision["action"], decision["proposal"]) == ("proposal", "approve", "add")

        async def marker_made() -> bool:
            return marker.exists()

        await wait_until(marker_made, "the approved command to run")
        assert "[servers.evil]" in stack.config_path.read_text()

        # A real server proposed the same way answers clients once approved, unquarantined.
        gamma = echo_server("gamma", env={"MODE": "plain"})
        proposed = await manage(
            client, operation="add", name="gamma", command=gamma["command"], args_json=json.dumps(gamma["args"])
        )
        assert_pending_answer(proposed, "gamma", "add")
        code, pending = await ctl(stack, "pending")
        assert [row["name"] for row in pending["proposals"]] == ["gamma"]
        code, text = await ctl_text(stack, "approve", "gamma")
        assert code == 0 and text.strip() == "gamma: proposed add approved and applied"
        await stack.wait_ready(["gamma"])

        async def gamma_listed() -> bool:
            return "gamma:echo" in [tool.name for tool in (await client.list_tools()).tools]

        await wait_until(gamma_listed, "gamma's tools after approval")
        assert await echo(client, "gamma", "approved") == "approved"
        assert "quarantined = true" not in stack.config_path.read_text().split("[servers.gamma]")[1]
        code, pending = await ctl(stack, "pending")
        assert code == 0 and pending["proposals"] == []
        assert (await listing(client))["pending"] == []


async def test_patch_remove_and_disable_from_a_client_wait_while_the_old_server_keeps_serving(tmp_path: Path) -> None:
    marker = tmp_path / "PATCHED"
    script = UPSTREAMS / "echo_server.py"
    wrapped = (
        f"touch {shlex.quote(str(marker))}; exec {shlex.quote(sys.executable)} {shlex.quote(str(script))} --name gamma"
    )
    async with open_stack(tmp_path, {"gamma": echo_server("gamma")}) as stack, stack.client() as client:
        old_pid = await upstream_pid(client, "gamma")
        patched = await manage(client, operation="patch", name="gamma", command="sh", args=["-c", wrapped])
        assert_pending_answer(patched, "gamma", "patch")

        await trio.sleep(QUIET_SECONDS)
        assert not marker.exists(), "a client's patch ran the new command before any approval"
        assert await upstream_pid(client, "gamma") == old_pid, "the old command stopped serving"
        assert await echo(client, "gamma", "old still here") == "old still here"
        assert 'command = "sh"' not in stack.config_path.read_text()

        code, inspection = await ctl(stack, "inspect", "gamma")
        assert code == 0 and (inspection["kind"], inspection["action"]) == ("proposal", "patch")
        assert inspection["command"] == ["sh", "-c", wrapped]
        assert inspection["server"]["command"] == [sys.executable, str(script), "--name", "gamma"]
        changes = {change["field"]: change for change in inspection["changes"]}
        assert set(changes) == {"command", "args"}
        assert (changes["command"]["before"], changes["command"]["after"]) == (sys.executable, "sh")
        assert changes["args"]["before"] == [str(script), "--name", "gamma"]
        assert changes["args"]["after"] == ["-c", wrapped]
        code, text = await ctl_text(stack, "inspect", "gamma")
        assert code == 0 and f'{json.dumps(sys.executable)} -> "sh"' in text

        code, decision = await ctl(stack, "approve", "gamma")
        assert code == 0 and decision["proposal"] == "patch"

        async def restarted() -> bool:
            return marker.exists()

        await wait_until(restarted, "the approved patch to run")
        await stack.wait_ready(["gamma"])
        new_pid = await upstream_pid(client, "gamma")
        assert new_pid != old_pid
        assert 'command = "sh"' in stack.config_path.read_text()

        # disable and remove are proposals too; the later replaces the earlier.
        assert_pending_answer(await manage(client, operation="disable", name="gamma"), "gamma", "disable")
        removal = assert_pending_answer(await manage(client, operation="remove", name="gamma"), "gamma", "remove")
        assert removal["replaced"] == "disable"
        await trio.sleep(QUIET_SECONDS)
        assert await upstream_pid(client, "gamma") == new_pid, "a pending remove or disable stopped the server"
        code, pending = await ctl(stack, "pending")
        assert [(row["name"], row["action"]) for row in pending["proposals"]] == [("gamma", "remove")]
        code, inspection = await ctl(stack, "inspect", "gamma")
        assert inspection["action"] == "remove" and inspection["command"] == ["sh", "-c", wrapped]

        # The operator rejects it: nothing changes, the proposal is gone.
        code, text = await ctl_text(stack, "block", "gamma")
        assert code == 0 and text.strip() == "gamma: proposed remove rejected"
        code, pending = await ctl(stack, "pending")
        assert code == 0 and pending["proposals"] == []
        assert "[servers.gamma]" in stack.config_path.read_text()
        assert await echo(client, "gamma", "kept") == "kept"
        # With no proposal left, block means what it always meant: quarantine.
        code, decision = await ctl(stack, "block", "gamma")
        assert code == 0 and decision["kind"] == "decision" and decision["quarantined"] is True

        # A policy patch changes neither what runs nor where it connects: it applies at once.
        direct = data_of(await manage(client, operation="patch", name="gamma", policy={"call_timeout": 42}))
        assert direct["config"]["policy"]["call_timeout"] == 42
        assert "pending" not in direct
        assert "call_timeout = 42" in stack.config_path.read_text()


@contextmanager
def capture_server() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on loopback that records every request it gets (path and headers)."""
    seen: list[str] = []

    class Capture(BaseHTTPRequestHandler):
        def _record(self) -> None:
            seen.append(f"{self.command} {self.path} {dict(self.headers)}")
            self.send_response(404)
            self.end_headers()

        do_GET = do_POST = do_DELETE = _record

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Capture)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/mcp", seen
    finally:
        server.shutdown()
        server.server_close()


async def test_secret_references_from_a_client_are_refused_and_nothing_is_sent(tmp_path: Path) -> None:
    secret_file = tmp_path / "id_rsa"
    secret_file.write_text("PRIVATE-KEY-CONTENT-1234")
    servers = {
        "alpha": echo_server("alpha", env={"DATABASE_URL": "postgres://app:hunter2pass@db/x"}),
        # The operator's own secrets in a URL: never shown in a client's listing.
        "creds": {"url": f"http://user:topsecretpw@127.0.0.1:{free_port()}/mcp?access_token=tok123secret99"},
    }
    with capture_server() as (url, seen):
        async with (
            open_stack(tmp_path, servers, env={"STOLEN_TOKEN": "env-secret-5678"}, wait_for=["alpha"]) as stack,
            stack.client() as client,
        ):
            shown = json.dumps(await listing(client))
            assert "postgres://app:" in shown and "127.0.0.1" in shown
            for secret in ("hunter2pass", "topsecretpw", "tok123secret99"):
                assert secret not in shown, secret
            attempts = [
                {"operation": "add", "name": "steal", "url": url, "headers": {"X-Steal": f"${{file:{secret_file}}}"}},
                {"operation": "add", "name": "steal", "url": url, "headers_json": '{"X-Token": "${env:STOLEN_TOKEN}"}'},
                {"operation": "add", "name": "steal", "url": url + "?k=${env:STOLEN_TOKEN}"},
                {"operation": "add", "name": "steal", "command": "sh", "args": ["-c", "echo ${file:/etc/passwd}"]},
                {"operation": "add", "name": "steal", "command": "sh", "env": {"T": "${env:STOLEN_TOKEN}"}},
                {"operation": "patch", "name": "alpha", "env": {"T": f"${{file:{secret_file}}}"}},
                {"operation": "update", "name": "alpha", "cwd": "${env:HOME}"},
                {"operation": "patch", "name": "alpha", "args_json": '["${env:STOLEN_TOKEN}"]'},
            ]
            for attempt in attempts:
                result = await manage(client, **attempt)
                message = text_of(result)
                assert result.is_error, attempt
                assert "secret references" in message and "not accepted from an MCP client" in message, message
                assert "PRIVATE-KEY" not in message and "env-secret" not in message
            await trio.sleep(QUIET_SECONDS)
            assert seen == [], "a refused server reached the capture server"
            code, pending = await ctl(stack, "pending")
            assert code == 0 and pending["proposals"] == []
            assert (await listing(client))["pending"] == []
            assert "steal" not in stack.config_path.read_text()
            assert "${" not in stack.config_path.read_text()

            # A URL server without references is only proposed: still nothing reaches the address.
            assert_pending_answer(await manage(client, operation="add", name="remote", url=url), "remote", "add")
            await trio.sleep(QUIET_SECONDS)
            assert seen == [], "a pending proposal connected to its URL"


async def test_client_changes_turned_off_are_refused_with_the_setting_named(tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    settings = {"client_server_changes": "off"}
    async with (
        open_stack(tmp_path, {"alpha": echo_server("alpha")}, settings=settings) as stack,
        stack.client() as client,
    ):
        config_before = stack.config_path.read_text()
        for attempt in [
            {"operation": "add", "name": "evil", "command": "sh", "args": ["-c", f"touch {marker}"]},
            {"operation": "patch", "name": "alpha", "policy": {"call_timeout": 5}},
            {"operation": "patch", "name": "alpha", "command": "sh"},
            {"operation": "remove", "name": "alpha"},
            {"operation": "disable", "name": "alpha"},
            {"operation": "enable", "name": "alpha"},
        ]:
            result = await manage(client, **attempt)
            assert result.is_error, attempt
            assert 'client_server_changes = "off"' in text_of(result), text_of(result)
        listed = await listing(client)
        assert [server["name"] for server in listed["servers"]] == ["alpha"] and listed["pending"] == []
        await trio.sleep(1)
        assert not marker.exists()
        assert stack.config_path.read_text() == config_before
        assert await echo(client, "alpha", "still on") == "still on"


async def test_a_proposal_survives_a_restart_and_is_approved_afterwards(tmp_path: Path) -> None:
    servers = {"alpha": echo_server("alpha")}
    gamma = echo_server("gamma")
    async with open_stack(tmp_path, servers) as stack, stack.client() as client:
        proposed = await manage(client, operation="add", name="gamma", command=gamma["command"], args=gamma["args"])
        assert_pending_answer(proposed, "gamma", "add")
        store = stack.data_dir / "proposals.json"
        assert stat.S_IMODE(store.stat().st_mode) == 0o600
        await stop_stack(stack)

    async with open_stack(tmp_path, servers) as stack, stack.client() as client:
        code, pending = await ctl(stack, "pending")
        assert code == 0 and [(row["name"], row["action"]) for row in pending["proposals"]] == [("gamma", "add")]
        assert [row["name"] for row in (await listing(client))["pending"]] == ["gamma"]
        assert "gamma" not in {row["name"] for row in (await ctl(stack, "status"))[1]}
        code, decision = await ctl(stack, "approve", "gamma", "--json")
        assert code == 0 and decision["proposal"] == "add"
        await stack.wait_ready(["gamma"])
        assert json.loads(store.read_text())["proposals"] == []
        # Approving again finds no proposal: it approves the tools, as it does for any server.
        code, decision = await ctl(stack, "approve", "gamma")
        assert code == 0 and decision["kind"] == "decision"
        assert await echo(client, "gamma", "after restart") == "after restart"

        # The operator adds the proposed name, or removes the server a proposal is about, in the
        # config file: those proposals are stale and go.
        delta = echo_server("delta")
        assert_pending_answer(await manage(client, operation="add", name="delta", **delta), "delta", "add")
        assert_pending_answer(await manage(client, operation="disable", name="alpha"), "alpha", "disable")
        document = tomlkit.parse(stack.config_path.read_text())
        document["servers"]["delta"] = delta
        del document["servers"]["alpha"]
        stack.config_path.write_text(tomlkit.dumps(document))
        code, _ = await ctl(stack, "update")
        assert code == 0
        code, pending = await ctl(stack, "pending")
        assert code == 0 and pending["proposals"] == []
        assert json.loads(store.read_text())["proposals"] == []
