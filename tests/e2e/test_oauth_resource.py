"""mcpvisor as an OAuth resource server, against a real stack and a real authorization server.

Given mcpvisor with `[oauth]` naming an authorization server on loopback and two tenants, when
the MCP SDK's own OAuth client connects with no token, it learns from mcpvisor's 401 and RFC 9728
document where to log in, registers, logs in with PKCE, and then sees its own tenant's servers
and nothing of the other's.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx2
import pytest
import trio
from joserfc.jwk import RSAKey
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from mcp.shared.exceptions import MCPError

from tests.support.stack import Stack, echo_server, free_port, open_stack
from tests.upstreams.identity_provider import IdentityProvider

REDIRECT_URI = "http://127.0.0.1:1/callback"  # never reached: the test reads the redirect itself
USERS = {
    "alice": {"groups": ["a-team"]},
    "bob": {"groups": ["b-people", "everyone"]},
    "eve": {"groups": ["everyone"]},
    "root": {"groups": ["mcp-admins"]},
}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


class Storage:
    """The SDK's token storage, in memory: every test logs in afresh."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


class HeadlessLogin:
    """The person at the browser: opens the authorization URL as `user` and hands the redirect back."""

    def __init__(self, user: str) -> None:
        self.user = user
        self.redirect: dict[str, list[str]] = {}
        self.authorization_url = ""

    async def open(self, authorization_url: str) -> None:
        self.authorization_url = authorization_url
        async with httpx2.AsyncClient(timeout=10, trust_env=False) as http:
            answer = await http.get(f"{authorization_url}&{urlencode({'login_hint': self.user})}")
        assert answer.status_code == 302, answer.text
        self.redirect = parse_qs(urlsplit(answer.headers["location"]).query)

    async def callback(self) -> AuthorizationCodeResult:
        return AuthorizationCodeResult(code=self.redirect["code"][0], state=self.redirect["state"][0])


@asynccontextmanager
async def logged_in(url: str, user: str) -> AsyncIterator[tuple[Client, Storage, HeadlessLogin]]:
    """An SDK client of `url` that logs in as `user` when mcpvisor asks it to."""
    storage, login = Storage(), HeadlessLogin(user)
    metadata = OAuthClientMetadata(redirect_uris=[REDIRECT_URI], client_name=f"e2e {user}")
    provider = OAuthClientProvider(url, metadata, storage, login.open, login.callback)
    async with (
        create_mcp_http_client(auth=provider) as http,
        Client(streamable_http_client(url, http_client=http)) as c,
    ):
        yield c, storage, login


async def tool_names(client: Client, wanted: str, timeout: float = 30.0) -> set[str]:
    """The client's tool names once one of them starts with `wanted` (a tenant's workers start on first use)."""
    names: set[str] = set()
    with trio.move_on_after(timeout):
        while not any(name.startswith(wanted) for name in names):
            names = {tool.name for tool in (await client.list_tools()).tools}
            if not any(name.startswith(wanted) for name in names):
                await trio.sleep(0.2)
    return names


@asynccontextmanager
async def oauth_stack(tmp_path, idp: IdentityProvider) -> AsyncIterator[tuple[Stack, str]]:
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    tables = {
        "tenants": {
            "a-team": {"servers": ["alpha"]},
            "b-team": {"servers": ["beta"], "claim_values": ["b-people"]},
        },
        "oauth": {
            "issuer": idp.issuer,
            "resource": resource,
            "claim": "groups",
            "admin_values": ["mcp-admins"],
            "scopes_supported": ["mcp"],
        },
    }
    servers = {"alpha": echo_server("alpha"), "beta": echo_server("beta")}
    async with open_stack(tmp_path, servers, port=port, wait_for=[], tables=tables) as stack:
        yield stack, resource


async def test_the_sdk_client_logs_in_through_the_issuer_and_sees_only_its_tenant(
    tmp_path, nursery: trio.Nursery
) -> None:
    idp = await nursery.start(IdentityProvider(USERS, scopes=["mcp"]).serve)
    async with oauth_stack(tmp_path, idp) as (stack, resource):
        for user, mine, theirs in (("alice", "alpha:", "beta:"), ("bob", "beta:", "alpha:")):
            async with logged_in(stack.direct_url, user) as (client, storage, login):
                names = await tool_names(client, mine)
                assert any(name.startswith(mine) for name in names), (user, names)
                assert not any(name.startswith(theirs) for name in names), (user, names)
                echoed = await client.call_tool(f"{mine}echo", {"text": f"hello {user}"})
                assert echoed.content[0].text == f"hello {user}"
                # The other tenant's server answers as one that exists nowhere does.
                with pytest.raises(MCPError) as theirs_refused:
                    await client.call_tool(f"{theirs}echo", {"text": "let me in"})
                with pytest.raises(MCPError) as nowhere_refused:
                    await client.call_tool("nowhere:echo", {"text": "let me in"})
                other = theirs.rstrip(":")
                assert str(theirs_refused.value).replace(other, "nowhere") == str(nowhere_refused.value)
                # The client found the issuer through mcpvisor's metadata and asked for this resource.
                asked = parse_qs(urlsplit(login.authorization_url).query)
                assert asked["resource"] == [resource] and asked["code_challenge_method"] == ["S256"]
                assert storage.tokens is not None and storage.client is not None
        assert len(idp.clients) == 2 and idp.issued == 2


async def test_unauthenticated_and_bad_tokens_get_a_401_that_points_at_the_metadata(
    tmp_path, nursery: trio.Nursery
) -> None:
    idp = await nursery.start(IdentityProvider(USERS, scopes=["mcp"]).serve)
    async with (
        oauth_stack(tmp_path, idp) as (stack, resource),
        httpx2.AsyncClient(timeout=60) as http,
    ):  # a tenant's first request starts its workers
        metadata_url = f"{stack.base_url}/.well-known/oauth-protected-resource/mcp"
        answer = await http.post(stack.direct_url, json=INITIALIZE, headers=HEADERS)
        assert answer.status_code == 401
        assert f'resource_metadata="{metadata_url}"' in answer.headers["www-authenticate"]
        assert "error=" not in answer.headers["www-authenticate"]  # RFC 6750 §3.1: no token, no error code

        for path in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"):
            document = (await http.get(stack.base_url + path)).json()
            assert document == {
                "resource": resource,
                "authorization_servers": [idp.issuer],
                "scopes_supported": ["mcp"],
                "bearer_methods_supported": ["header"],
                "resource_name": "mcpvisor",
            }

        bad = {
            "another audience": idp.mint(idp.claims("alice", "http://127.0.0.1:1/mcp")),
            "expired": idp.mint(idp.claims("alice", resource, lifetime=-3600)),
            "another issuer": idp.mint(idp.claims("alice", resource, iss="http://127.0.0.1:1")),
            "no tenant": idp.mint(idp.claims("eve", resource)),
            "unknown key": idp.mint(idp.claims("alice", resource), key=RSAKey.generate_key(2048, auto_kid=True)),
        }
        for case, token in bad.items():
            answer = await http.post(
                stack.direct_url, json=INITIALIZE, headers={**HEADERS, "Authorization": f"Bearer {token}"}
            )
            assert answer.status_code == 401, case
            challenge = answer.headers["www-authenticate"]
            assert 'error="invalid_token"' in challenge and f'resource_metadata="{metadata_url}"' in challenge, case
            assert token not in challenge and token not in answer.text, case
            assert json.loads(answer.text)["error"] == "invalid_token", case

        good = idp.mint(idp.claims("alice", resource))
        answer = await http.post(
            stack.direct_url, json=INITIALIZE, headers={**HEADERS, "Authorization": f"Bearer {good}"}
        )
        assert answer.status_code == 200, answer.text

        # An admin value of the claim makes an operator: the operators' surfaces open to it alone.
        for user, status in (("root", 200), ("alice", 403)):
            token = idp.mint(idp.claims(user, resource))
            answer = await http.get(f"{stack.base_url}/metrics", headers={"Authorization": f"Bearer {token}"})
            assert answer.status_code == status, (user, answer.text)
