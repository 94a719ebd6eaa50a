"""Tenants on a real stack: tokens, one worker per (tenant, server), isolation on every path, limits.

Two tenants share the server name `echo` and each has a server of its own. The adversary (bob)
tries every path with alice's names, URIs, cursors, session id, cache keys and request paths, and
must learn nothing: each answer is the one a server that does not exist gets.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.support.stack import Stack, echo_server, open_stack, python_server

pytestmark = pytest.mark.trio

MODERN = "2026-07-28"
SERVERS = {
    "echo": echo_server("echo"),
    "alpha": echo_server("alpha"),
    "beta": echo_server("beta"),
    "res": python_server("echo_server.py", "--name", "res"),
}
TENANTS = {
    "alice": {"servers": ["echo", "alpha"]},
    "bob": {"servers": ["echo", "beta"]},
    "carol": {"servers": ["echo"], "max_in_flight": 1, "calls_per_minute": 5},
    "idler": {"servers": ["echo"], "idle_stop": 2.0},
}


def add_token(config: Path, tenant: str, *extra: str) -> str:
    """`mcpvisor token add`: the token is alone on the last line."""
    result = subprocess.run(
        [sys.executable, "-P", "-m", "mcpvisor.supervisor", "token", "add", tenant, *extra, "-c", str(config)],
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip().splitlines()[-1]


def token_command(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-P", "-m", "mcpvisor.supervisor", "token", *args, "-c", str(config)],
        capture_output=True,
        text=True,
        check=False,
    )


def sse_response(text: str) -> Any:
    """The JSON-RPC response among a text/event-stream body's events (notifications before it)."""
    for block in text.replace("\r\n", "\n").split("\n\n"):
        data = "\n".join(line[5:].removeprefix(" ") for line in block.split("\n") if line.startswith("data:"))
        if data:
            message = json.loads(data)
            if "result" in message or "error" in message:
                return message
    raise AssertionError(f"no response in the stream: {text[:300]!r}")


class Modern:
    """A 2026-07-28 client by hand: every request stands alone, with the tenant's token."""

    def __init__(self, http: httpx2.AsyncClient, url: str, token: str) -> None:
        self.http = http
        self.url = url
        self.token = token
        self._ids = 0

    async def post(self, method: str, params: dict[str, Any] | None = None, *, path: str = "/mcp/direct") -> Any:
        self._ids += 1
        headers = {
            "Authorization": f"Bearer {self.token}",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": MODERN,
            "Mcp-Method": method,
        }
        if params and isinstance(params.get("name"), str):
            headers["Mcp-Name"] = params["name"]
        if params and isinstance(params.get("uri"), str):
            headers["Mcp-Name"] = params["uri"]
        meta = {
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "tenant-test", "version": "1"},
        }
        body = {"jsonrpc": "2.0", "id": self._ids, "method": method, "params": {**(params or {}), "_meta": meta}}
        return await self.http.post(f"{self.url}{path}", json=body, headers=headers)

    async def rpc(self, method: str, params: dict[str, Any] | None = None, *, path: str = "/mcp/direct") -> Any:
        response = await self.post(method, params, path=path)
        assert response.status_code == 200, (response.status_code, response.text)
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            # An answer that took a while (a busy machine, a large result) turns into a stream of
            # keep-alive comments and then the response; the client accepted that.
            return sse_response(response.text)
        return response.json()

    async def tool_names(self) -> set[str]:
        names: set[str] = set()
        cursor = None
        while True:
            params: dict[str, Any] = {"cursor": cursor} if cursor else {}
            page = (await self.rpc("tools/list", params))["result"]
            names.update(tool["name"] for tool in page["tools"])
            cursor = page.get("nextCursor")
            if not cursor:
                return names

    async def wait_tools(self, *expected: str, timeout: float = 60) -> set[str]:
        """The tenant's tools once `expected` are among them: its workers start on its first request,
        which waits for them a while; on a loaded machine a slow upstream joins the list later."""
        with trio.fail_after(timeout):
            while not set(expected) <= (names := await self.tool_names()):
                await trio.sleep(0.5)
        return names

    async def call(self, name: str, arguments: dict[str, Any], *, path: str = "/mcp/direct") -> Any:
        return await self.rpc("tools/call", {"name": name, "arguments": arguments}, path=path)


@asynccontextmanager
async def tenant_stack(tmp_path: Path) -> AsyncIterator[tuple[Stack, dict[str, str]]]:
    """Tokens three ways: made before mcpvisor runs, read from secret files, made while it runs."""
    import secrets

    import tomli_w

    tokens = {"idler": secrets.token_urlsafe(32), "admin": secrets.token_urlsafe(32)}
    secret_dir = tmp_path / "secrets"
    secret_dir.mkdir()
    for name, token in tokens.items():
        (secret_dir / name).write_text(token + "\n")
    tenants = {**TENANTS, "idler": {**TENANTS["idler"], "token_files": [str(secret_dir / "idler")]}}
    settings = {
        "enable_server_endpoints": True,
        "page_size": 3,
        "admin_token_files": [str(secret_dir / "admin"), str(secret_dir / "missing")],
    }
    config = tmp_path / "mcpvisor.toml"
    data = tmp_path / "data"
    config.write_text(
        tomli_w.dumps({"mcpvisor": {"data_dir": str(data), **settings}, "servers": SERVERS, "tenants": tenants})
    )
    tokens.update({tenant: add_token(config, tenant) for tenant in ("alice", "carol")})
    async with open_stack(tmp_path, SERVERS, settings=settings, wait_for=[], tables={"tenants": tenants}) as stack:
        yield stack, tokens


@asynccontextmanager
async def sdk_client(stack: Stack, token: str, path: str = "/mcp/direct") -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http,
        Client(streamable_http_client(f"{stack.base_url}{path}", http_client=http)) as client,
    ):
        yield client


def unknown_server_error(text: str, asked: str, control: str) -> str:
    """An error about server `asked`, written as if about `control`: equal iff they tell the same."""
    return text.replace(asked, control)


async def test_tenants_are_isolated_on_every_path(tmp_path: Path) -> None:
    async with tenant_stack(tmp_path) as (stack, tokens), httpx2.AsyncClient(timeout=60) as http:
        alice = Modern(http, stack.base_url, tokens["alice"])

        # No token, a wrong one: 401 with a challenge, on every MCP path and the admin surfaces.
        for path in ("/mcp", "/mcp/direct", "/mcp/servers/echo", "/metrics"):
            response = await http.post(f"{stack.base_url}{path}", json={})
            assert response.status_code == 401, (path, response.text)
            assert response.headers["www-authenticate"].startswith('Bearer realm="mcpvisor"')
        wrong = await Modern(http, stack.base_url, "mcpv_not-a-token").post("tools/list")
        assert wrong.status_code == 401 and 'error="invalid_token"' in wrong.headers["www-authenticate"]
        assert "mcpv_not-a-token" not in wrong.text
        assert (await http.get(f"{stack.base_url}/healthz")).json() == {"status": "ok"}
        # A missing secret file is named in the log, and nothing of a token is.
        frontend_log = stack.log("frontend.log")
        assert "missing" in frontend_log and tokens["admin"] not in frontend_log and tokens["idler"] not in frontend_log

        # Nothing of a tenant runs before it is used.
        rows = stack.status()
        assert rows["alice/echo"]["state"] == "STOPPED" and "idle" in rows["alice/echo"]["description"]
        assert rows["bob/beta"]["state"] == "STOPPED"

        # A token made while mcpvisor runs works at its next request.
        tokens["bob"] = add_token(stack.config_path, "bob")
        bob = Modern(http, stack.base_url, tokens["bob"])

        alice_tools = await alice.wait_tools("echo:echo", "alpha:echo")
        bob_tools = await bob.wait_tools("echo:echo", "beta:echo")
        assert {"echo:echo", "alpha:echo"} <= alice_tools and not any(n.startswith("beta:") for n in alice_tools)
        assert {"echo:echo", "beta:echo"} <= bob_tools and not any(n.startswith("alpha:") for n in bob_tools)
        assert not any(n.startswith("res:") for n in alice_tools | bob_tools)

        # One worker and one upstream process per (tenant, server).
        # (Each runs in its own sandbox, where pids are its own: a random id tells them apart.)
        alice_id = (await alice.call("echo:instance_id", {}))["result"]["content"][0]["text"]
        bob_id = (await bob.call("echo:instance_id", {}))["result"]["content"][0]["text"]
        assert alice_id != bob_id
        # A worker serves as soon as its upstream is ready, and is RUNNING once it has lived `startsecs`.
        rows = await stack.wait_status(
            lambda rows: rows["alice/echo"]["state"] == "RUNNING" and rows["bob/echo"]["state"] == "RUNNING"
        )
        assert rows["alice/echo"]["pid"] != rows["bob/echo"]["pid"]
        # An operator's token from a secret file sees every worker; a tenant's token is no operator.
        admin = {"Authorization": f"Bearer {tokens['admin']}"}
        health = (await http.get(f"{stack.base_url}/healthz", headers=admin)).json()
        assert "alice/echo" in health["servers"] and "bob/echo" in health["servers"]
        metrics = await http.get(f"{stack.base_url}/metrics", headers=admin)
        assert metrics.status_code == 200
        assert 'mcpvisor_calls_total{outcome="ok",server="alice/echo",via="direct"}' in metrics.text
        assert 'mcpvisor_server_tools{server="bob/echo"}' in metrics.text
        tenant_metrics = await http.get(
            f"{stack.base_url}/metrics", headers={"Authorization": f"Bearer {tokens['alice']}"}
        )
        assert tenant_metrics.status_code == 403
        code, tenant_rows = stack.ctl("status", "--tenant", "alice")
        assert {row["name"] for row in tenant_rows} == {"alice/echo", "alice/alpha"}, (code, tenant_rows)

        # Calling alice's server by name: the same answer as a server that exists nowhere.
        theirs = (await bob.post("tools/call", {"name": "alpha:echo", "arguments": {"text": "x"}})).json()
        nowhere = (await bob.post("tools/call", {"name": "nosuch:echo", "arguments": {"text": "x"}})).json()
        assert "error" in theirs and "error" in nowhere
        assert theirs["error"]["code"] == nowhere["error"]["code"]
        assert unknown_server_error(theirs["error"]["message"], "alpha", "nosuch") == nowhere["error"]["message"]
        assert "alpha" not in json.dumps(nowhere)  # and the list of servers it offers does not name it

        # The search finds only the tenant's own tools, under their own names.
        found = await bob.call("retrieve_tools", {"query": "echo the text back", "limit": 20}, path="/mcp")
        text = json.dumps(found)
        assert "beta:echo" in text and "alpha:" not in text
        default = json.dumps(await bob.call("retrieve_tools", {"query": "echo the text back"}, path="/mcp"))
        assert "beta:echo" in default and "alpha:" not in default

        # describe_tools: alice's tool is described to bob as a tool of no server is.
        theirs = await bob.call("describe_tools", {"names": ["alpha:echo", "beta:echo"]}, path="/mcp")
        nowhere = await bob.call("describe_tools", {"names": ["nosuch:echo"]}, path="/mcp")
        [their_entry, own_entry] = json.loads(theirs["result"]["content"][0]["text"])["tools"]
        [nowhere_entry] = json.loads(nowhere["result"]["content"][0]["text"])["tools"]
        assert unknown_server_error(json.dumps(their_entry), "alpha", "nosuch") == json.dumps(nowhere_entry)
        assert "alpha" not in json.dumps(nowhere)
        assert own_entry["name"] == "beta:echo" and "inputSchema" in own_entry

        # upstream_servers list shows the tenant's servers only.
        listed = json.dumps(await bob.call("upstream_servers", {"operation": "list"}, path="/mcp"))
        assert "beta" in listed and '"alpha"' not in listed and "alpha:" not in listed

        # /mcp/servers/TENANT/NAME: the owner gets it, anyone else the 404 of a name that does not exist.
        own = await alice.post("tools/list", path="/mcp/servers/alice/alpha")
        assert own.status_code == 200 and {t["name"] for t in own.json()["result"]["tools"]} >= {"echo"}
        theirs_path = await bob.post("tools/list", path="/mcp/servers/alice/alpha")
        nowhere_path = await bob.post("tools/list", path="/mcp/servers/nobody/alpha")
        assert theirs_path.status_code == nowhere_path.status_code == 404
        assert theirs_path.text.replace("alice", "nobody") == nowhere_path.text
        assert (await bob.post("tools/list", path="/mcp/servers/alpha")).status_code == 404

        # A cursor of alice's list means nothing more in bob's.
        page = await alice.rpc("tools/list")
        cursor = page["result"]["nextCursor"]
        answer = await bob.post("tools/list", {"cursor": cursor})
        assert "alpha:" not in answer.text

        # read_cache: a key alice got is unknown to bob.
        arguments = {
            "name": "alpha:echo",
            "args_json": json.dumps({"text": "y" * 30000}),
            "intent": {"operation_type": "read", "reason": "a long echo"},
        }
        big = (await alice.call("call_tool_read", arguments, path="/mcp"))["result"]
        assert "mcpvisor/truncated" in big.get("_meta", {}), (list(big.get("_meta", {})), json.dumps(big)[-600:])
        key = big["_meta"]["mcpvisor/truncated"]["key"]
        own_page = await alice.call("read_cache", {"key": key}, path="/mcp")
        assert "y" * 100 in json.dumps(own_page)
        stolen = await bob.call("read_cache", {"key": key}, path="/mcp")
        assert "y" * 100 not in json.dumps(stolen) and stolen["result"]["isError"] is True

        # A handshake-era session of alice's cannot be used with bob's token.
        async with sdk_client(stack, tokens["alice"]) as client:
            answer = await client.call_tool("alpha:echo", {"text": "from a session"})
            assert answer.content[0].text == "from a session"
            session_id = None
            async with httpx2.AsyncClient(timeout=30) as raw:
                init = await raw.post(
                    stack.direct_url,
                    json={
                        "jsonrpc": "2.0",
                        "id": 1,
                        "method": "initialize",
                        "params": {
                            "protocolVersion": "2025-11-25",
                            "capabilities": {},
                            "clientInfo": {"name": "alice", "version": "1"},
                        },
                    },
                    headers={
                        "Authorization": f"Bearer {tokens['alice']}",
                        "Accept": "application/json, text/event-stream",
                    },
                )
                session_id = init.headers.get("mcp-session-id")
                assert session_id
                hijack = await raw.post(
                    stack.direct_url,
                    json={"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}},
                    headers={
                        "Authorization": f"Bearer {tokens['bob']}",
                        "Accept": "application/json, text/event-stream",
                        "Mcp-Session-Id": session_id,
                        "MCP-Protocol-Version": "2025-11-25",
                    },
                )
                assert hijack.status_code in (400, 404), hijack.text
                assert "alpha" not in hijack.text

        # Resources: bob reads a URI only alice's server serves: the answer of an unknown URI.
        # Both tenants' echo servers serve the same URIs; alpha's are alice's alone.
        listing = await alice.rpc("resources/list")
        uris = [r["uri"] for r in listing["result"].get("resources", [])]
        for uri in uris:
            mine = await bob.post("resources/read", {"uri": uri})
            assert "alpha" not in mine.text or "echo" in mine.text

        # The activity log says whose each call was.
        code, activity = stack.ctl("activity", "--server", "echo", "-n", "50")
        tenants_seen = {row["tenant"] for row in activity["rows"] if row["tool"] == "instance_id"}
        assert tenants_seen == {"alice", "bob"}, rows


async def test_limits_revocation_and_idle_stop(tmp_path: Path) -> None:
    async with tenant_stack(tmp_path) as (stack, tokens), httpx2.AsyncClient(timeout=60) as http:
        tokens["bob"] = add_token(stack.config_path, "bob")
        bob = Modern(http, stack.base_url, tokens["bob"])
        carol = Modern(http, stack.base_url, tokens["carol"])
        await carol.wait_tools("echo:echo")

        # max_in_flight = 1: a second call while one runs is refused at once, naming the limit.
        async with trio.open_nursery() as nursery:
            # Long enough to be still running when the second call arrives on a loaded machine.
            nursery.start_soon(carol.call, "echo:slow", {"seconds": 5})
            await trio.sleep(1.5)
            refused = await carol.post("tools/call", {"name": "echo:echo", "arguments": {"text": "x"}})
            assert refused.status_code == 429, refused.text
            assert "max_in_flight" in refused.json()["error"]["message"]
            assert refused.headers["retry-after"]
        # calls_per_minute = 5: the bucket (one slow call and one refused so far) runs dry.
        echo = {"name": "echo:echo", "arguments": {"text": "x"}}
        statuses = [(await carol.post("tools/call", echo)).status_code for _ in range(6)]
        assert statuses.count(429) >= 1 and statuses[0] == 200, statuses
        last = await carol.post("tools/call", echo)
        assert last.status_code == 429 and "calls_per_minute" in last.json()["error"]["message"]

        # Revocation holds at once, on a live session too.
        listed = token_command(stack.config_path, "list", "--json")
        rows = json.loads(listed.stdout)
        assert tokens["bob"] not in listed.stdout and all("hash" not in row for row in rows)
        bob_id = next(row["id"] for row in rows if row["tenant"] == "bob")
        await bob.wait_tools("echo:echo")
        async with sdk_client(stack, tokens["bob"]) as client:
            await client.list_tools()
            assert token_command(stack.config_path, "revoke", bob_id).returncode == 0
            # The SDK tells a 401 on a live session as a generic error; the raw request below shows it.
            with pytest.raises(MCPError):
                await client.list_tools()
        assert (await bob.post("tools/list")).status_code == 401
        assert token_command(stack.config_path, "revoke", bob_id).returncode == 4

        # idle_stop = 2 s: idler's worker stops without requests and starts again on the next one.
        idler = Modern(http, stack.base_url, tokens["idler"])
        await idler.wait_tools("echo:instance_id")
        first_id = (await idler.call("echo:instance_id", {}))["result"]["content"][0]["text"]
        await stack.wait_status(lambda rows: rows["idler/echo"]["state"] == "STOPPED", timeout=30)
        assert "idle" in stack.status()["idler/echo"]["description"]
        second = await idler.call("echo:instance_id", {})
        assert "result" in second, second
        assert second["result"]["content"][0]["text"] != first_id
        # Up again: RUNNING once it has lived `startsecs`, and it may stop idle again 2 s after the call.
        assert stack.status()["idler/echo"]["state"] in ("STARTING", "RUNNING")


async def test_a_tenants_proposals_are_its_own(tmp_path: Path) -> None:
    async with tenant_stack(tmp_path) as (stack, tokens), httpx2.AsyncClient(timeout=60) as http:
        tokens["bob"] = add_token(stack.config_path, "bob")
        alice = Modern(http, stack.base_url, tokens["alice"])
        bob = Modern(http, stack.base_url, tokens["bob"])
        await bob.wait_tools("echo:echo", "beta:echo")

        async def propose(client: Modern, name: str) -> Any:
            arguments = {"operation": "add", "name": name, **echo_server(name)}
            return await client.call("upstream_servers", arguments, path="/mcp")

        # A name alice has and bob cannot see gets the answer of any new name: pending.
        taken = await propose(bob, "alpha")
        fresh = await propose(bob, "gamma")
        assert "PENDING" in json.dumps(taken) and "PENDING" in json.dumps(fresh), (taken, fresh)
        # Changing a server others may share is the operator's.
        refused = await bob.call("upstream_servers", {"operation": "disable", "name": "echo"}, path="/mcp")
        assert refused["result"]["isError"] is True

        bob_list = json.dumps(await bob.call("upstream_servers", {"operation": "list"}, path="/mcp"))
        alice_list = json.dumps(await alice.call("upstream_servers", {"operation": "list"}, path="/mcp"))
        assert "gamma" in bob_list and "gamma" not in alice_list

        code, pending = stack.ctl("pending")
        names = {row["name"] for row in pending["proposals"]}
        assert {"bob/gamma", "bob/alpha"} <= names, pending
        code, approved = stack.ctl("approve", "bob/gamma")
        assert code == 0, approved
        config = stack.config_path.read_text()
        assert "[servers.gamma]" in config

        with trio.fail_after(30):
            while "gamma:echo" not in await bob.tool_names():
                await trio.sleep(0.3)
        assert not any(name.startswith("gamma:") for name in await alice.tool_names())
        await stack.wait_status(lambda rows: rows["bob/gamma"]["state"] == "RUNNING")

        # Approving bob's "alpha" tells the operator the name is taken; nothing changes for alice.
        code, answer = stack.ctl("approve", "bob/alpha")
        assert code != 0 and "exists" in json.dumps(answer), answer
        assert "alpha:echo" in await alice.tool_names()
