"""Each tenant uses its own upstream accounts: self-service logins, shared logins, per-tenant secrets.

The upstream and its authorization server are tests/upstreams/oauth_upstream.py on loopback. A
browser is an HTTP client with its own cookies; the person logged in at the authorization server
is its `user` cookie there, and the upstream's `whoami` tool tells whose token a call carried.
"""

from __future__ import annotations

import hashlib
import secrets
import sqlite3
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
import trio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from mcpvisor.store import oauth_store
from tests.e2e.test_oauth_upstream import oauth_upstream, refusal, upstream_state
from tests.support.stack import UPSTREAMS, Stack, open_stack

pytestmark = pytest.mark.trio

TENANTS = ("alice", "bob")


def tenant_tables(tmp_path: Path, servers: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """Tenants alice and bob on `servers`, each with a token read from a file."""
    tokens = {tenant: secrets.token_urlsafe(32) for tenant in (*TENANTS, "admin")}
    tables: dict[str, Any] = {}
    for tenant, token in tokens.items():
        (tmp_path / f"{tenant}.token").write_text(token + "\n")
        if tenant != "admin":
            tables[tenant] = {"servers": servers, "token_files": [str(tmp_path / f"{tenant}.token")]}
    return tables, tokens


class Person:
    """A tenant's user: an MCP client with their token, and a browser with their own cookies."""

    def __init__(self, name: str, stack: Stack, token: str) -> None:
        self.name = name
        self.stack = stack
        self.token = token
        self.elicited: list[types.ElicitRequestURLParams] = []
        self.notices: list[str] = []
        # At the authorization server this browser is logged in as this person.
        self.browser = httpx2.AsyncClient(timeout=30, cookies={"user": name})

    @asynccontextmanager
    async def client(
        self, path: str = "/mcp/direct", *, url_elicitation: bool = False, mode: str = "legacy"
    ) -> AsyncIterator[Client]:
        async def elicit(_ctx: Any, params: Any) -> types.ElicitResult:
            self.elicited.append(params)
            return types.ElicitResult(action="accept")

        async def on_message(message: Any) -> None:
            if isinstance(message, types.ToolListChangedNotification):
                self.notices.append("tools")
            elif isinstance(message, types.ElicitCompleteNotification):
                self.notices.append(f"elicitation complete {message.params.elicitation_id}")

        extra: dict[str, Any] = {"mode": mode, "message_handler": on_message}
        if url_elicitation:
            extra["elicitation_callback"] = elicit
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {self.token}"}, timeout=60) as http,
            Client(streamable_http_client(f"{self.stack.base_url}{path}", http_client=http), **extra) as client,
        ):
            yield client

    async def open(self, url: str) -> httpx2.Response:
        return await self.browser.get(url)

    async def authorize(self, link: str) -> str:
        """Open the login link and log in at the authorization server: where it sends the browser back."""
        start = await self.open(link)
        assert start.status_code == 302, start.text
        assert "mcpvisor_login_" in start.headers["set-cookie"] and "HttpOnly" in start.headers["set-cookie"]
        consent = await self.open(start.headers["location"])
        assert consent.status_code == 302, consent.text
        back = consent.headers["location"]
        assert back.startswith(f"{self.stack.base_url}/oauth/callback?"), back
        return back


async def tool_names(client: Client) -> set[str]:
    return {tool.name for tool in (await client.list_tools()).tools}


async def wait_tools(client: Client, predicate: Any, timeout: float = 60) -> set[str]:
    with trio.fail_after(timeout):
        while not predicate(names := await tool_names(client)):
            await trio.sleep(0.3)
    return names


def login_link(result: Any) -> str:
    text = result.content[0].text
    link = result.structured_content["login_url"]
    assert link in text and "/oauth/start/" in link, text
    return link


def activity(stack: Stack) -> list[tuple[str, str, str, str]]:
    with sqlite3.connect(stack.data_dir / "state.sqlite") as db:
        return db.execute(
            "SELECT tenant, server, tool, variant FROM calls WHERE kind = 'account' ORDER BY id"
        ).fetchall()


@asynccontextmanager
async def logins_stack(tmp_path: Path, **settings: Any) -> AsyncIterator[tuple[Stack, Any, dict[str, str]]]:
    tables, tokens = tenant_tables(tmp_path, ["remote"])
    all_settings = {"admin_token_files": [str(tmp_path / "admin.token")], **settings}
    async with (
        oauth_upstream(tmp_path) as upstream,
        open_stack(
            tmp_path, {"remote": {"url": upstream.url}}, settings=all_settings, wait_for=[], tables={"tenants": tables}
        ) as stack,
    ):
        yield stack, upstream, tokens


async def test_alice_connects_her_own_account_and_bob_still_sees_only_his_login_tool(tmp_path: Path) -> None:
    async with logins_stack(tmp_path, enable_server_endpoints=True) as (stack, upstream, tokens):
        alice, bob = Person("alice", stack, tokens["alice"]), Person("bob", stack, tokens["bob"])
        async with alice.client(url_elicitation=True) as client, bob.client() as bob_client:
            # Each tenant's first request starts its worker, which finds the upstream wants a login.
            names = await wait_tools(client, lambda names: "remote:login" in names)
            assert not any(name.startswith("remote:") and name != "remote:login" for name in names)
            login = next(t for t in (await client.list_tools()).tools if t.name == "remote:login")
            assert login.title == "Connect your remote account"
            await wait_tools(bob_client, lambda names: "remote:login" in names)
            row = await upstream_state(stack, "alice/remote", "authenticating")
            assert "connect your account with the tool `remote:login`" in row["error"], row

            # The search-first endpoint finds it too, through the same catalog.
            async with alice.client("/mcp") as search:
                found = await search.call_tool("retrieve_tools", {"query": "connect remote account login"})
                assert "remote:login" in found.content[0].text
                listing = await search.call_tool("upstream_servers", {"operation": "list"})
                remote = next(s for s in listing.structured_content["servers"] if s["name"] == "remote")
                assert remote["state"] == "waiting for your login" and "remote:login" in remote["login"], remote

            # The server's own endpoint lists it under its own name there.
            async with alice.client("/mcp/servers/remote") as alone:
                assert await tool_names(alone) == {"login"}

            # Nothing starts a login until the tenant asks for one.
            assert (await upstream.stats())["authorizations"] == 0
            result = await client.call_tool("remote:login", {})
            assert not result.is_error
            link = login_link(result)
            assert link.startswith(f"{stack.base_url}/oauth/start/")
            # A client that declared URL-mode elicitation was asked to open the same link.
            assert len(alice.elicited) == 1 and alice.elicited[0].mode == "url" and alice.elicited[0].url == link
            assert alice.elicited[0].elicitation_id

            page = await alice.open(await alice.authorize(link))
            assert page.status_code == 200, page.text
            assert "Your remote account is connected for alice" in page.text
            assert "token" not in page.text.lower()

            # The real tools replace the login tool, and the client is told.
            names = await wait_tools(client, lambda names: "remote:whoami" in names)
            assert "remote:login" not in names
            assert "tools" in alice.notices
            # And the URL elicitation it accepted is complete.
            with trio.fail_after(10):
                while f"elicitation complete {alice.elicited[0].elicitation_id}" not in alice.notices:
                    await trio.sleep(0.1)
            answer = await client.call_tool("remote:whoami", {})
            assert not answer.is_error and answer.content[0].text == "you are alice"

            # Bob, on the same server, still has only his login tool; any tool of it answers with his link.
            bob_names = await tool_names(bob_client)
            assert "remote:login" in bob_names and "remote:whoami" not in bob_names
            refused = await bob_client.call_tool("remote:whoami", {})
            assert refused.is_error and "did not run" in refused.content[0].text
            assert "/oauth/start/" in login_link(refused) and not bob.elicited  # bob's client declared no URL mode

        # Tokens per (tenant, server), kept by the worker, never shown.
        stored = oauth_store.load(oauth_store.token_path(stack.data_dir, "alice/remote"))
        assert stored.tokens is not None
        assert oauth_store.load(oauth_store.token_path(stack.data_dir, "bob/remote")).tokens is None
        access = stored.tokens["access_token"]
        code, rows = await stack.actl("logins")
        assert code == 0 and [row["name"] for row in rows] == ["alice/remote"], rows
        assert access not in str(rows) and access not in stack.log("frontend.log")

        # The operator sees it over the admin API, and revokes it there.
        admin = {"Authorization": f"Bearer {tokens['admin']}"}
        async with httpx2.AsyncClient(timeout=30, headers=admin) as http:
            listed = (await http.get(f"{stack.base_url}/api/v1/accounts")).json()
            assert [row["name"] for row in listed["accounts"]] == ["alice/remote"], listed
            assert access not in str(listed)
            revoked = await http.delete(f"{stack.base_url}/api/v1/accounts/alice/remote")
            assert revoked.status_code == 200 and revoked.json()["connected"] is True, revoked.text
        await upstream_state(stack, "alice/remote", "authenticating")
        assert oauth_store.load(oauth_store.token_path(stack.data_dir, "alice/remote")).tokens is None

        # The activity log has the login and the logout, and who did them.
        assert activity(stack) == [("alice", "remote", "login", "tenant"), ("alice", "remote", "logout", "operator")]
        for person in (alice, bob):
            await person.browser.aclose()


async def test_a_tenant_logs_in_from_a_current_client(tmp_path: Path) -> None:
    """The same login driven by a 2026-07-28 client: the SDK's `Client` in its default mode."""
    async with logins_stack(tmp_path, enable_server_endpoints=True) as (stack, _upstream, tokens):
        alice = Person("alice", stack, tokens["alice"])
        async with alice.client(mode="auto") as client:
            assert client.protocol_version == "2026-07-28"
            await wait_tools(client, lambda names: "remote:login" in names)
            # Any tool of the waiting server answers with a link; the login tool itself is no failure.
            refused = await client.call_tool("remote:whoami", {})
            assert refused.is_error and "did not run" in refused.content[0].text
            result = await client.call_tool("remote:login", {})
            assert not result.is_error
            link = login_link(result)
            assert link.startswith(f"{stack.base_url}/oauth/start/")
            page = await alice.open(await alice.authorize(link))
            assert page.status_code == 200 and "connected for alice" in page.text, page.text
            await wait_tools(client, lambda names: "remote:whoami" in names)
            answer = await client.call_tool("remote:whoami", {})
            assert not answer.is_error and answer.content[0].text == "you are alice"
        # On the server's own endpoint, too, a current client calls its tools once logged in.
        async with alice.client("/mcp/servers/remote", mode="auto") as alone:
            assert (await alone.call_tool("whoami", {})).content[0].text == "you are alice"
        await alice.browser.aclose()


async def test_login_links_are_single_use_expire_and_bind_only_the_browser_that_opened_them(tmp_path: Path) -> None:
    async with logins_stack(tmp_path, login_link_ttl=2) as (stack, upstream, tokens):
        alice, bob = Person("alice", stack, tokens["alice"]), Person("bob", stack, tokens["bob"])
        async with alice.client() as client, bob.client() as bob_client:
            await wait_tools(client, lambda names: "remote:login" in names)
            await wait_tools(bob_client, lambda names: "remote:login" in names)

            # Expired: a link not opened within login_link_ttl seconds is refused.
            stale = login_link(await client.call_tool("remote:login", {}))
            await trio.sleep(2.5)
            expired = await alice.open(stale)
            assert expired.status_code == 400 and "expired" in expired.text

            # Alice's redirect opened in bob's browser (holding bob's own login cookie) binds nothing.
            link = login_link(await client.call_tool("remote:login", {}))
            bobs_link = login_link(await bob_client.call_tool("remote:login", {}))
            back = await alice.authorize(link)
            await bob.authorize(bobs_link)
            crossed = await bob.open(back)
            assert crossed.status_code == 400 and "another browser" in crossed.text, crossed.text
            # A browser with no login cookie at all: the same.
            async with httpx2.AsyncClient(timeout=30) as stranger:
                bare = await stranger.get(back)
            assert bare.status_code == 400
            for worker in ("alice/remote", "bob/remote"):
                assert oauth_store.load(oauth_store.token_path(stack.data_dir, worker)).tokens is None
            assert (await upstream.stats())["codes"] == 0  # no code was exchanged

            # Replayed: the link worked once; opening it again is refused.
            replay = await alice.open(link)
            assert replay.status_code == 400 and "already used" in replay.text
            # A guessed or altered ticket is refused like an unknown one.
            guessed = await alice.open(link[:-3] + "xyz")
            assert guessed.status_code == 400

            # Alice's login was not spent by any of that: her own browser completes it.
            done = await alice.open(back)
            assert done.status_code == 200 and "connected for alice" in done.text
            # Her redirect replayed after it completed binds nothing more.
            again = await alice.open(back)
            assert again.status_code == 400
            await wait_tools(client, lambda names: "remote:whoami" in names)
            assert (await client.call_tool("remote:whoami", {})).content[0].text == "you are alice"
            assert "remote:login" in await tool_names(bob_client)

            # Bob cannot name alice's worker: his requests reach his own workers only.
            async with bob.client("/mcp") as search:
                foreign = await search.call_tool("upstream_servers", {"operation": "logout", "name": "alice/remote"})
                assert foreign.is_error
            assert oauth_store.load(oauth_store.token_path(stack.data_dir, "alice/remote")).tokens is not None

            # An unrefreshable token on a real call answers with a new link, never a bare failure.
            await upstream.revoke_everything()
            refused = await client.call_tool("remote:whoami", {})
            assert refused.is_error and "/oauth/start/" in login_link(refused)
            await wait_tools(client, lambda names: "remote:login" in names)

            # Alice disconnects her own account (it was disconnected by the revocation already).
            async with alice.client("/mcp") as search:
                out = await search.call_tool("upstream_servers", {"operation": "logout", "name": "remote"})
                assert not out.is_error, out.content[0].text
        for person in (alice, bob):
            await person.browser.aclose()


async def test_a_shared_login_serves_every_tenant_and_tenants_cannot_log_it_in_or_out(tmp_path: Path) -> None:
    tables, tokens = tenant_tables(tmp_path, ["svc"])
    async with oauth_upstream(tmp_path) as upstream:
        servers = {"svc": {"url": upstream.url, "oauth": {"shared": True}}}
        async with open_stack(tmp_path, servers, wait_for=[], tables={"tenants": tables}) as stack:
            alice = Person("alice", stack, tokens["alice"])
            async with alice.client() as client:
                await client.list_tools()
                row = await upstream_state(stack, "alice/svc", "authenticating")
                assert "waiting for the operator" in row["error"] and "ctl login svc" in row["error"], row
                assert "svc:login" not in await tool_names(client)
                refused = await refusal(client, "svc:whoami", {})
                assert "waiting for the operator" in refused and "/oauth/start/" not in refused, refused
                async with alice.client("/mcp") as search:
                    attempt = await search.call_tool("upstream_servers", {"operation": "login", "name": "svc"})
                    assert attempt.is_error and "operator" in attempt.content[0].text, attempt.content[0].text

                # The operator logs in once, as the service account; every tenant's worker uses it.
                code, started = await stack.actl("start", "svc")
                assert code == 0, started
                await upstream_state(stack, "svc", "authenticating")
                code, result = await stack.actl("login", "svc", "--no-wait")
                assert code == 0, result
                async with httpx2.AsyncClient(timeout=30, cookies={"user": "service"}) as browser:
                    consent = await browser.get(result["url"])
                    page = await browser.get(consent.headers["location"])
                assert page.status_code == 200 and "Logged in to svc" in page.text
                await wait_tools(client, lambda names: "svc:whoami" in names)
                assert (await client.call_tool("svc:whoami", {})).content[0].text == "you are service"
            assert not oauth_store.token_path(stack.data_dir, "alice/svc").exists()
            code, out = await stack.actl("logout", "alice/svc")
            assert code != 0 and "shared" in str(out), out
            await alice.browser.aclose()


async def test_per_tenant_secrets_give_each_tenant_its_own_key(tmp_path: Path) -> None:
    secret_root = tmp_path / "secrets"
    (secret_root / "alice").mkdir(parents=True)
    alice_key = secrets.token_urlsafe(24)
    (secret_root / "alice" / "api_key").write_text(alice_key + "\n")
    tables, tokens = tenant_tables(tmp_path, ["keyed"])
    servers = {
        "keyed": {
            "command": sys.executable,
            "args": [str(UPSTREAMS / "keyed_server.py")],
            "env": {"API_KEY": f"${{file:{secret_root}/{{tenant}}/api_key}}"},
        }
    }
    async with open_stack(tmp_path, servers, wait_for=[], tables={"tenants": tables}) as stack:
        alice, bob = Person("alice", stack, tokens["alice"]), Person("bob", stack, tokens["bob"])
        async with alice.client() as client, bob.client() as bob_client:
            await wait_tools(client, lambda names: "keyed:key_digest" in names)
            digest = (await client.call_tool("keyed:key_digest", {})).content[0].text
            assert digest == hashlib.sha256(alice_key.encode()).hexdigest()[:16]

            # Bob's key is missing: his worker waits for the operator; he never gets alice's key.
            await bob_client.list_tools()
            row = await upstream_state(stack, "bob/keyed", "error")
            assert "waiting for the operator" in row["error"] and "cannot read secret file" in row["error"], row
            refused = await refusal(bob_client, "keyed:key_digest", {})
            assert "waiting for the operator" in refused, refused
            assert alice_key not in refused and alice_key not in row["error"]
            async with bob.client("/mcp") as search:
                listing = await search.call_tool("upstream_servers", {"operation": "list"})
                keyed = next(s for s in listing.structured_content["servers"] if s["name"] == "keyed")
                assert "waiting for the operator" in keyed["error"] and alice_key not in str(listing.structured_content)

            # The operator puts bob's key in place: his worker finds it and starts.
            (secret_root / "bob").mkdir()
            bob_key = secrets.token_urlsafe(24)
            (secret_root / "bob" / "api_key").write_text(bob_key)
            await wait_tools(bob_client, lambda names: "keyed:key_digest" in names, timeout=90)
            bob_digest = (await bob_client.call_tool("keyed:key_digest", {})).content[0].text
            assert bob_digest == hashlib.sha256(bob_key.encode()).hexdigest()[:16]
        for person in (alice, bob):
            await person.browser.aclose()


async def test_the_operator_sees_and_disconnects_a_tenants_account_in_the_console(tmp_path: Path) -> None:
    from tests.e2e.test_console import CHROMIUM, in_browser

    if CHROMIUM is None:
        pytest.skip("system package missing: chromium")
    async with logins_stack(tmp_path) as (stack, _upstream, tokens):
        alice = Person("alice", stack, tokens["alice"])
        async with alice.client() as client:
            await wait_tools(client, lambda names: "remote:login" in names)
            link = login_link(await client.call_tool("remote:login", {}))
            assert (await alice.open(await alice.authorize(link))).status_code == 200
            await wait_tools(client, lambda names: "remote:whoami" in names)
        access = oauth_store.load(oauth_store.token_path(stack.data_dir, "alice/remote")).tokens["access_token"]

        def scenario(page: Any) -> None:
            page.goto(f"{stack.base_url}/ui/login")
            page.fill("#token", tokens["admin"])
            page.click("button[type=submit]")
            page.goto(f"{stack.base_url}/ui/#/accounts")
            row = page.locator('tr[data-account="alice/remote"]')
            row.wait_for()
            assert access not in page.content()
            row.locator("button[data-action=disconnect]").click()
            page.locator("td.empty", has_text="No upstream logins kept").wait_for()

        await trio.to_thread.run_sync(in_browser(scenario))
        await upstream_state(stack, "alice/remote", "authenticating")
        assert activity(stack)[-1] == ("alice", "remote", "logout", "operator")
        await alice.browser.aclose()


async def test_the_operator_revokes_a_kept_login_whose_tenant_or_server_left_the_config(tmp_path: Path) -> None:
    tables, _tokens = tenant_tables(tmp_path, ["echo"])
    echo = {"command": sys.executable, "args": [str(UPSTREAMS / "echo_server.py")]}
    async with open_stack(
        tmp_path, {"echo": echo}, wait_for=[], tables={"tenants": {"alice": tables["alice"]}}
    ) as stack:
        # Logins kept from before bob, github and alice's github were taken out of the config.
        gone = ["bob/echo", "alice/github", "github"]
        for name in gone:
            path = oauth_store.token_path(stack.data_dir, name)
            oauth_store.save(path, oauth_store.TokenFile(tokens={"access_token": f"at-{name}"}, expires_at=9e9))
        code, rows = await stack.actl("logins")
        assert code == 0 and sorted(row["name"] for row in rows) == sorted(gone), rows

        for name in gone:
            code, result = await stack.actl("logout", name)
            assert code == 0 and result == {"name": name, "connected": True}, result
            assert not oauth_store.token_path(stack.data_dir, name).exists()
        code, rows = await stack.actl("logins")
        assert code == 0 and rows == [], rows
        # A name nothing knows, in the config or kept, is still unknown.
        code, result = await stack.actl("logout", "bob/echo")
        assert code == 4, result
