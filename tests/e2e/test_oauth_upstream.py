"""A remote upstream behind an OAuth 2.1 login: authenticating, `ctl login`, the redirect, tokens, refresh.

The upstream and its authorization server are tests/upstreams/oauth_upstream.py on loopback; the
browser is an HTTP client that follows the authorization URL the way a user who clicks "allow" would.
"""

from __future__ import annotations

import os
import secrets
import signal
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx2
import trio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from mcpvisor.store import oauth_store
from mcpvisor.workers.oauth import MAX_TOKEN_LIFETIME, UpstreamAuth
from mcpvisor.workers.oauth_login import CallbackParams, LoginDesk
from tests.support.stack import UPSTREAMS, Stack, free_port, open_stack, wait_listening


@dataclass
class OAuthUpstream:
    url: str  # the MCP endpoint
    issuer: str  # the authorization server

    async def stats(self) -> dict[str, int]:
        async with httpx2.AsyncClient(timeout=5) as http:
            return (await http.get(f"{self.issuer}/admin/stats")).json()

    async def revoke_everything(self) -> None:
        async with httpx2.AsyncClient(timeout=5) as http:
            (await http.post(f"{self.issuer}/admin/revoke")).raise_for_status()

    async def revoke_access_tokens(self) -> None:
        async with httpx2.AsyncClient(timeout=5) as http:
            (await http.post(f"{self.issuer}/admin/revoke", params={"only": "access"})).raise_for_status()


@asynccontextmanager
async def oauth_upstream(
    log_dir: Path,
    *,
    access_ttl: int = 3600,
    sse: bool = False,
    reuse_revokes: bool = False,
    expires_in: int | None = None,
) -> AsyncIterator[OAuthUpstream]:
    port, as_port = free_port(), free_port()
    command = [sys.executable, str(UPSTREAMS / "oauth_upstream.py"), "--port", str(port), "--as-port", str(as_port)]
    if sse:
        command.append("--sse")
    if reuse_revokes:
        command.append("--reuse-revokes")
    if expires_in is not None:
        command += ["--expires-in", str(expires_in)]
    with open(log_dir / "oauth-upstream.log", "wb") as log:
        process = subprocess.Popen(
            [*command, "--access-ttl", str(access_ttl)], stdout=log, stderr=log, start_new_session=True
        )
    try:
        await wait_listening(port, process)
        await wait_listening(as_port, process)
        yield OAuthUpstream(f"http://127.0.0.1:{port}/{'sse' if sse else 'mcp'}", f"http://127.0.0.1:{as_port}")
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


async def refusal(client: Any, tool: str, arguments: dict[str, Any]) -> str:
    """The text of a call that must fail, as an error result or a JSON-RPC error."""
    try:
        result = await client.call_tool(tool, arguments)
    except MCPError as exc:
        return exc.message
    assert result.is_error, result
    return result.content[0].text


async def upstream_state(stack: Stack, name: str, state: str, timeout: float = 30.0) -> dict[str, Any]:
    """The row once the upstream is in `state` and its worker RUNNING: a worker reports its upstream
    at once but is RUNNING only after `startsecs`, as in supervisord."""

    def reached(rows: dict[str, dict[str, Any]]) -> bool:
        row = rows.get(name, {})
        return row.get("upstream") == state and row.get("state") == "RUNNING"

    rows = await stack.wait_status(reached, timeout=timeout)
    return rows[name]


async def log_in(stack: Stack, name: str) -> str:
    """`ctl login NAME`, then the browser's round trip; the page mcpvisor's listener showed."""
    code, result = await stack.actl("login", name, "--no-wait")
    assert code == 0, result
    url = result["url"]
    async with httpx2.AsyncClient(timeout=30) as browser:
        consent = await browser.get(url)
        assert consent.status_code == 302, consent.text
        landing = consent.headers["location"]
        assert landing.startswith(f"{stack.base_url}/oauth/callback?"), landing
        page = await browser.get(landing)
    assert page.status_code == 200, page.text
    return page.text


async def test_login_by_the_operator_then_tools_are_listed_and_callable(tmp_path: Path) -> None:
    async with (
        oauth_upstream(tmp_path) as upstream,
        open_stack(tmp_path, {"remote": {"url": upstream.url}}, wait_for=[]) as stack,
    ):
        row = await upstream_state(stack, "remote", "authenticating")
        assert row["state"] == "RUNNING"
        assert "run `mcpvisor ctl login remote`" in row["error"], row

        # Nothing starts a login but the operator: the upstream saw no authorization request yet.
        assert (await upstream.stats())["authorizations"] == 0

        code, result = await stack.actl("login", "remote", "--no-wait")
        assert code == 0, result
        query = parse_qs(urlsplit(result["url"]).query)
        assert query["code_challenge_method"] == ["S256"]
        assert query["resource"] == [upstream.url]
        assert query["redirect_uri"] == [f"{stack.base_url}/oauth/callback"]
        assert len(query["state"][0]) >= 32
        # Asking again hands out the login in flight, not a second one.
        code, again = await stack.actl("login", "remote", "--no-wait")
        assert again["url"] == result["url"]

        async with httpx2.AsyncClient(timeout=30) as browser:
            forged = await browser.get(f"{stack.base_url}/oauth/callback", params={"code": "x", "state": "guess"})
            assert forged.status_code == 400
            crowded = await browser.get(f"{stack.base_url}/oauth/callback", params={f"f{i}": "x" for i in range(25)})
            assert crowded.status_code == 400 and "Not a login redirect" in crowded.text
            consent = await browser.get(result["url"])
            page = await browser.get(consent.headers["location"])
        assert page.status_code == 200 and "Logged in to remote" in page.text

        await stack.wait_ready(["remote"])
        async with stack.client() as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert "remote:echo" in names
            answer = await client.call_tool("remote:echo", {"text": "through oauth"})
            assert not answer.is_error and answer.content[0].text == "through oauth"

        row = stack.status()["remote"]
        assert row["upstream"] == "ready" and row["token_expires"] > 0
        code, text = await stack.actl("status", "remote", json_output=False)
        assert "token expires in" in text, text

        token_file = oauth_store.token_path(stack.data_dir, "remote")
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert stat.S_IMODE(token_file.parent.stat().st_mode) == 0o700
        stored = oauth_store.load(token_file)
        assert stored.tokens is not None
        secret = stored.tokens["access_token"]
        for path in [stack.config_path, *(stack.data_dir / "logs").iterdir()]:
            assert secret not in path.read_text(errors="replace"), path
        assert secret not in str(stack.status())


async def test_tokens_are_refreshed_before_they_expire_and_rotated(tmp_path: Path) -> None:
    async with (
        oauth_upstream(tmp_path, access_ttl=8) as upstream,
        open_stack(tmp_path, {"remote": {"url": upstream.url, "policy": {"ping_interval": 1}}}, wait_for=[]) as stack,
    ):
        await upstream_state(stack, "remote", "authenticating")
        await log_in(stack, "remote")
        await stack.wait_ready(["remote"])
        token_file = oauth_store.token_path(stack.data_dir, "remote")
        first = oauth_store.load(token_file).tokens
        assert first is not None

        # The worker pings every second; a token living 8s is refreshed 2s before it expires.
        with trio.fail_after(30):
            while (await upstream.stats())["refreshes"] < 2:
                await trio.sleep(0.5)
        latest = oauth_store.load(token_file).tokens
        assert latest is not None
        assert latest["refresh_token"] != first["refresh_token"]  # rotated as the server said
        assert stack.status()["remote"]["upstream"] == "ready"
        async with stack.client() as client:
            answer = await client.call_tool("remote:echo", {"text": "still in"})
            assert not answer.is_error
        # No call ever went out with an expired token: the server never refused one to refresh it.
        assert (await upstream.stats())["refused_refreshes"] == 0

        # A token the server stops accepting before its time: the 401 is answered by a refresh
        # and the call goes through, without a login. The worker's next ping may meet the 401
        # first (it pings every second), so refreshes are counted from before the revocation.
        # Revoked just after a refresh, the token has seconds left before the next one, so on a loaded machine
        # too a request meets the 401 before the worker's own refresh would have replaced the token unused.
        start = (await upstream.stats())["refreshes"]
        with trio.fail_after(30):
            while (await upstream.stats())["refreshes"] == start:
                await trio.sleep(0.1)
        before = await upstream.stats()
        await upstream.revoke_access_tokens()
        async with stack.client() as client:
            answer = await client.call_tool("remote:echo", {"text": "after a 401"})
            assert not answer.is_error and answer.content[0].text == "after a 401", answer
        after = await upstream.stats()
        assert after["refused_tokens"] > before["refused_tokens"]  # the revoked token met a 401
        assert after["refreshes"] > before["refreshes"]  # which a refresh answered
        assert stack.status()["remote"]["upstream"] == "ready"


async def test_a_revoked_refresh_token_goes_back_to_authenticating_with_the_way_out(tmp_path: Path) -> None:
    async with (
        oauth_upstream(tmp_path) as upstream,
        open_stack(tmp_path, {"remote": {"url": upstream.url}}, wait_for=[]) as stack,
    ):
        await upstream_state(stack, "remote", "authenticating")
        await log_in(stack, "remote")
        await stack.wait_ready(["remote"])

        await upstream.revoke_everything()
        async with stack.client() as client:
            # The next request meets a 401; the refresh token is refused too: a login is needed.
            refused = await refusal(client, "remote:echo", {"text": "after revocation"})
            assert "mcpvisor ctl login remote" in refused, refused
        row = await upstream_state(stack, "remote", "authenticating")
        assert "refused to refresh" in row["error"] and "mcpvisor ctl login remote" in row["error"], row
        assert (await upstream.stats())["refused_refreshes"] >= 1

        # Calls now fail at once, with the same way out.
        async with stack.client() as client:
            with trio.fail_after(5):
                again = await refusal(client, "remote:echo", {"text": "x"})
            assert "ctl login remote" in again, again

        # The operator's way: `ctl login` prints the URL, waits for the round trip, says it is done.
        command = [sys.executable, "-P", "-m", "mcpvisor.supervisor", "ctl", "-c", str(stack.config_path)]
        env = {key: value for key, value in stack.env.items() if key not in ("DISPLAY", "WAYLAND_DISPLAY")}
        ctl = subprocess.Popen(
            [*command, "login", "remote"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        assert ctl.stdout is not None
        lines = [await trio.to_thread.run_sync(ctl.stdout.readline) for _ in range(3)]
        url = lines[2].strip()
        assert lines[0].startswith("To log in to remote") and url.startswith(upstream.issuer), lines
        async with httpx2.AsyncClient(timeout=30) as browser:
            consent = await browser.get(url)
            assert (await browser.get(consent.headers["location"])).status_code == 200
        _out, err = await trio.to_thread.run_sync(lambda: ctl.communicate(timeout=60))
        assert ctl.returncode == 0, err
        assert "remote: logged in (token expires in" in err, err
        async with stack.client() as client:
            assert not (await client.call_tool("remote:echo", {"text": "back"})).is_error


async def test_step_up_asks_for_the_union_of_scopes_and_logout_forgets_the_tokens(tmp_path: Path) -> None:
    async with (
        oauth_upstream(tmp_path) as upstream,
        open_stack(tmp_path, {"remote": {"url": upstream.url}}, wait_for=[]) as stack,
    ):
        await upstream_state(stack, "remote", "authenticating")
        await log_in(stack, "remote")
        await stack.wait_ready(["remote"])
        async with stack.client() as client:
            refused = await refusal(client, "remote:write_note", {"text": "n"})
            assert "more permission" in refused and "mcpvisor ctl login remote" in refused, refused
            # The other tools keep working meanwhile.
            assert not (await client.call_tool("remote:echo", {"text": "read"})).is_error

            code, result = await stack.actl("login", "remote", "--no-wait")
            assert code == 0, result
            scopes = parse_qs(urlsplit(result["url"]).query)["scope"][0].split()
            assert {"echo:read", "notes:write"} <= set(scopes)
            async with httpx2.AsyncClient(timeout=30) as browser:
                consent = await browser.get(result["url"])
                assert (await browser.get(consent.headers["location"])).status_code == 200
            noted = await client.call_tool("remote:write_note", {"text": "n"})
            assert not noted.is_error and noted.content[0].text == "noted: n", noted

        code, result = await stack.actl("logout", "remote")
        assert code == 0, result
        row = await upstream_state(stack, "remote", "authenticating")
        assert "mcpvisor ctl login remote" in row["error"]
        assert oauth_store.load(oauth_store.token_path(stack.data_dir, "remote")).tokens is None
        assert "token_expires" not in row
        # Nothing was refused since the logout: the login asks the server itself for its challenge.
        await log_in(stack, "remote")
        await stack.wait_ready(["remote"])


async def test_a_tenants_worker_logs_in_for_its_own_session(tmp_path: Path) -> None:
    token = secrets.token_urlsafe(32)
    token_file = tmp_path / "acme.token"
    token_file.write_text(token + "\n")
    tenants = {"acme": {"servers": ["remote"], "token_files": [str(token_file)]}}
    async with (
        oauth_upstream(tmp_path) as upstream,
        open_stack(tmp_path, {"remote": {"url": upstream.url}}, wait_for=[], tables={"tenants": tenants}) as stack,
    ):

        @asynccontextmanager
        async def acme() -> AsyncIterator[Client]:
            async with (
                httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http,
                Client(streamable_http_client(stack.direct_url, http_client=http)) as client,
            ):
                yield client

        async with acme() as client:
            await client.list_tools()  # the tenant's first request starts its worker
        row = await upstream_state(stack, "acme/remote", "authenticating")
        # The tenant connects its own account (tests/e2e/test_tenant_logins.py); an operator still may.
        assert "connect your account with the tool `remote:login`" in row["error"], row

        page = await log_in(stack, "acme/remote")
        assert "Your remote account is connected for acme" in page
        await upstream_state(stack, "acme/remote", "ready")
        stored = oauth_store.token_path(stack.data_dir, "acme/remote")
        assert stored.name == "acme%2Fremote.json" and oauth_store.load(stored).tokens is not None
        # The login is that tenant's alone: the worker without a tenant has none.
        assert oauth_store.load(oauth_store.token_path(stack.data_dir, "remote")).tokens is None
        async with acme() as client:
            answer = await client.call_tool("remote:echo", {"text": "acme"})
            assert not answer.is_error and answer.content[0].text == "acme"


async def test_a_legacy_sse_upstream_logs_in_the_same_way(tmp_path: Path) -> None:
    async with (
        oauth_upstream(tmp_path, sse=True) as upstream,
        open_stack(tmp_path, {"legacy": {"url": upstream.url}}, wait_for=[]) as stack,
    ):
        row = await upstream_state(stack, "legacy", "authenticating")
        assert "run `mcpvisor ctl login legacy`" in row["error"], row
        await log_in(stack, "legacy")
        await stack.wait_ready(["legacy"])
        async with stack.client() as client:
            answer = await client.call_tool("legacy:echo", {"text": "over sse"})
            assert not answer.is_error and answer.content[0].text == "over sse", answer

        # After a logout nothing was refused yet: the login asks the stream itself for its challenge.
        code, result = await stack.actl("logout", "legacy")
        assert code == 0, result
        await upstream_state(stack, "legacy", "authenticating")
        await log_in(stack, "legacy")
        await stack.wait_ready(["legacy"])


async def test_an_absurd_token_lifetime_is_taken_as_a_year_at_login_and_at_refresh(tmp_path: Path) -> None:
    # The worker's own login desk against the loopback authorization server, which announces 10**400 s.
    async with oauth_upstream(tmp_path, expires_in=10**400) as upstream:
        auth = UpstreamAuth(upstream.url, oauth_store.FileRecord(tmp_path / "login.json"), None, lambda _: None)
        failures: list[str] = []
        desk = LoginDesk("remote", auth, lambda: None, failures.append)
        async with trio.open_nursery() as nursery:
            started = await desk.start("http://127.0.0.1:9/oauth/callback", nursery)
            async with httpx2.AsyncClient(timeout=30) as browser:
                consent = await browser.get(started["url"])
            back = parse_qs(urlsplit(consent.headers["location"]).query)
            answer = await desk.callback(
                CallbackParams(state=back["state"][0], code=back["code"][0], iss=back["iss"][0])
            )
        assert answer["ok"] is True and not failures, answer
        assert auth.expires_at is not None and auth.expires_at <= time.time() + MAX_TOKEN_LIFETIME
        assert oauth_store.load(tmp_path / "login.json").tokens["expires_in"] == MAX_TOKEN_LIFETIME

        async with httpx2.AsyncClient(timeout=30) as http:
            refreshed = await http.send(await auth._refresh_token())
            await auth._refreshed(refreshed)
        assert auth.has_tokens and (await upstream.stats())["refreshes"] == 1
        assert auth.expires_at <= time.time() + MAX_TOKEN_LIFETIME
