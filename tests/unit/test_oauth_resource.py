"""JwtAuthority and the RFC 9728 document against a real authorization server on loopback.

Good tokens come from the server's own flow (registration, authorization code with PKCE, token);
the tokens no honest server issues (expired, another issuer, an unknown key, `alg: none`, HMAC
keyed with the public key) are minted by the test.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

import msgspec
import pytest
import trio
from joserfc.jwk import RSAKey

from mcpvisor.frontend.endpoints.auth import InvalidToken, Principal
from mcpvisor.frontend.endpoints.oauth_resource import (
    JwtAuthority,
    ResourceMetadata,
    metadata_urls,
    resource_metadata_url,
)
from mcpvisor.wire.config import OAuthResourceConfig, TenantConfig
from tests.upstreams.identity_provider import IdentityProvider, login

RESOURCE = "http://127.0.0.1:8080/mcp"
USERS = {
    "alice": {"tenant": "team-a"},
    "bob": {"groups": ["staff", "eng"]},  # team-b through its claim_values
    "root": {"tenant": ["team-a", "operators"]},
    "mallory": {"tenant": "team-c"},
    "both": {"tenant": ["team-a", "team-b"]},
}
TENANTS = {"team-a": TenantConfig(servers=[]), "team-b": TenantConfig(servers=[], claim_values=["eng"])}


@pytest.fixture
async def idp(nursery: trio.Nursery) -> IdentityProvider:
    return await nursery.start(IdentityProvider(USERS).serve)


def authority(idp: IdentityProvider, **config: Any) -> JwtAuthority:
    refetch_interval = config.pop("refetch_interval", 30.0)
    settings: dict[str, Any] = {"issuer": idp.issuer, "resource": RESOURCE, "admin_values": ["operators"], **config}
    return JwtAuthority(msgspec.convert(settings, OAuthResourceConfig), TENANTS, refetch_interval=refetch_interval)


async def refused(check: JwtAuthority, token: str) -> str:
    """The message of the InvalidToken `check` raises for `token`, which never holds the token."""
    with pytest.raises(InvalidToken) as caught:
        await check(token)
    assert token not in caught.value.message
    assert not any(len(part) > 8 and part in caught.value.message for part in token.split("."))
    return caught.value.message


def unsigned(header: dict[str, Any], claims: dict[str, Any]) -> bytes:
    def part(value: dict[str, Any]) -> bytes:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=")

    return part(header) + b"." + part(claims)


async def test_a_token_from_the_login_flow_admits_its_tenant(idp: IdentityProvider) -> None:
    check = authority(idp)
    token = await login(idp.issuer, "alice", RESOURCE)
    principal = await check(token)
    assert principal == Principal(tenant="team-a", admin=False, token_id=principal.token_id, subject="alice")
    assert principal.token_id  # the token's jti
    # Found through the issuer's RFC 8414 metadata, then cached: the next token fetches nothing.
    assert idp.metadata_requests == 1 and idp.jwks_requests == 1
    assert (await check(await login(idp.issuer, "alice", RESOURCE))).tenant == "team-a"
    assert idp.jwks_requests == 1


async def test_claim_values_and_lists_map_to_a_tenant(idp: IdentityProvider) -> None:
    check = authority(idp, claim="groups", jwks_uri=f"{idp.issuer}/jwks")
    principal = await check(await login(idp.issuer, "bob", RESOURCE))
    assert (principal.tenant, principal.admin) == ("team-b", False)
    assert idp.metadata_requests == 0  # a configured jwks_uri needs no discovery


async def test_an_admin_value_makes_an_operator(idp: IdentityProvider) -> None:
    principal = await authority(idp)(await login(idp.issuer, "root", RESOURCE))
    assert (principal.tenant, principal.admin, principal.subject) == (None, True, "root")


async def test_a_claim_naming_no_tenant_is_refused(idp: IdentityProvider) -> None:
    check = authority(idp)
    assert "names no tenant" in await refused(check, await login(idp.issuer, "mallory", RESOURCE))
    assert "more than one tenant" in await refused(check, await login(idp.issuer, "both", RESOURCE))
    assert "names no tenant" in await refused(check, idp.mint(idp.claims("alice", RESOURCE, tenant=None)))


async def test_a_token_for_another_resource_is_refused(idp: IdentityProvider) -> None:
    token = await login(idp.issuer, "alice", "http://127.0.0.1:8080/other")
    message = await refused(authority(idp), token)
    assert "audience" in message and RESOURCE in message
    # The audience may list several resources; this one must be among them.
    assert (await authority(idp)(idp.mint(idp.claims("alice", RESOURCE, aud=["x", RESOURCE])))).tenant == "team-a"
    assert "lacks the claims aud" in await refused(authority(idp), idp.mint(idp.claims("alice", RESOURCE, aud=None)))


async def test_an_expired_token_is_refused_beyond_the_leeway(idp: IdentityProvider) -> None:
    check = authority(idp, leeway=30)
    assert "expired" in await refused(check, idp.mint(idp.claims("alice", RESOURCE, lifetime=-120)))
    assert (await check(idp.mint(idp.claims("alice", RESOURCE, lifetime=-5)))).tenant == "team-a"
    assert "lacks the claims exp" in await refused(check, idp.mint(idp.claims("alice", RESOURCE, exp=None)))
    in_an_hour = idp.claims("alice", RESOURCE)["iat"] + 3600
    assert "not valid yet" in await refused(check, idp.mint(idp.claims("alice", RESOURCE, nbf=in_an_hour)))


async def test_a_token_of_another_issuer_is_refused(idp: IdentityProvider) -> None:
    token = idp.mint(idp.claims("alice", RESOURCE, iss="http://127.0.0.1:9/evil"))
    assert "another issuer" in await refused(authority(idp), token)


async def test_an_unknown_key_id_is_refused_without_hammering_the_issuer(idp: IdentityProvider) -> None:
    check = authority(idp, refetch_interval=3600)
    assert (await check(await login(idp.issuer, "alice", RESOURCE))).tenant == "team-a"
    stranger = RSAKey.generate_key(2048, auto_kid=True)
    forged = [idp.mint(idp.claims("alice", RESOURCE), key=stranger, header={"kid": f"k{i}"}) for i in range(20)]
    for token in forged:
        assert "a key the issuer does not publish" in await refused(check, token)
    # The keys were fetched for the first token, within the refetch interval: no kid, however new,
    # makes mcpvisor fetch them again before it has passed.
    assert idp.jwks_requests == 1
    assert check.fetches == 1
    # A stranger's key under the issuer's own kid fails on the signature.
    same_kid = idp.mint(idp.claims("alice", RESOURCE), key=stranger, header={"kid": idp.key.kid})
    assert "signature" in await refused(check, same_kid)


async def test_concurrent_unknown_kids_share_one_fetch(idp: IdentityProvider) -> None:
    check = authority(idp, refetch_interval=3600)
    stranger = RSAKey.generate_key(2048, auto_kid=True)
    messages: list[str] = []

    async def attempt(i: int) -> None:
        messages.append(
            await refused(check, idp.mint(idp.claims("alice", RESOURCE), key=stranger, header={"kid": str(i)}))
        )

    async with trio.open_nursery() as nursery:
        for i in range(10):
            nursery.start_soon(attempt, i)
    assert len(messages) == 10 and idp.jwks_requests == 1


async def test_a_rotated_key_is_fetched_when_tokens_name_it(idp: IdentityProvider) -> None:
    check = authority(idp, refetch_interval=0)
    old = await login(idp.issuer, "alice", RESOURCE)
    assert (await check(old)).tenant == "team-a"
    idp.rotate_key(keep_old=False)
    assert (await check(await login(idp.issuer, "alice", RESOURCE))).tenant == "team-a"
    assert idp.jwks_requests == 2
    assert "does not publish" in await refused(check, old)  # the retired key is gone from the JWKS


async def test_alg_none_and_hmac_forgeries_are_refused(idp: IdentityProvider) -> None:
    check = authority(idp)
    claims = idp.claims("root", RESOURCE)
    none_token = (unsigned({"alg": "none", "typ": "JWT"}, claims) + b".").decode()
    assert "none, which this mcpvisor does not accept" in await refused(check, none_token)
    # The classic confusion: HS256 keyed with the issuer's public key, which anyone can fetch.
    public_pem = idp.key.as_pem(private=False)
    signing_input = unsigned({"alg": "HS256", "typ": "JWT", "kid": idp.key.kid}, claims)
    signature = base64.urlsafe_b64encode(hmac.new(public_pem, signing_input, hashlib.sha256).digest()).rstrip(b"=")
    assert "HS256, which this mcpvisor does not accept" in await refused(
        check, (signing_input + b"." + signature).decode()
    )
    # An algorithm name no one knows is not echoed back.
    odd = (unsigned({"alg": "<script>", "typ": "JWT"}, claims) + b".AAAA").decode()
    assert "an unknown algorithm" in await refused(check, odd)
    assert idp.jwks_requests == 0  # refused before any key was needed


async def test_garbage_is_refused_plainly(idp: IdentityProvider) -> None:
    check = authority(idp)
    for token in ("not-a-jwt", "a.b.c", "é.x.y", "x" * 20000):
        message = await refused(check, token)
        assert "JWT" in message or "too long" in message


async def test_an_unreachable_issuer_is_a_clear_refusal(idp: IdentityProvider) -> None:
    # A port nothing listens on: its metadata cannot be had, so no key is.
    check = JwtAuthority(OAuthResourceConfig(issuer="http://127.0.0.1:9", resource=RESOURCE), TENANTS)
    token = idp.mint(idp.claims("alice", RESOURCE, iss="http://127.0.0.1:9"))
    assert "cannot be fetched" in await refused(check, token)
    # Metadata that names another issuer is not used (RFC 8414 §3.3).
    check = authority(idp, issuer=f"{idp.issuer}/tenant-x")
    assert "cannot be fetched" in await refused(
        check, idp.mint(idp.claims("alice", RESOURCE, iss=f"{idp.issuer}/tenant-x"))
    )


def test_the_config_refuses_none_and_hmac_algorithms() -> None:
    for algorithms in (["none"], ["RS256", "HS256"], []):
        with pytest.raises(msgspec.ValidationError, match=r"oauth\.algorithms"):
            msgspec.convert(
                {"issuer": "https://i", "resource": RESOURCE, "algorithms": algorithms}, OAuthResourceConfig
            )


def test_metadata_locations() -> None:
    assert resource_metadata_url("https://mcp.example.com/mcp") == (
        "https://mcp.example.com/.well-known/oauth-protected-resource/mcp"
    )
    assert (
        resource_metadata_url("https://mcp.example.com")
        == "https://mcp.example.com/.well-known/oauth-protected-resource"
    )
    assert metadata_urls("https://id.example.com/realms/x") == [
        "https://id.example.com/.well-known/oauth-authorization-server/realms/x",
        "https://id.example.com/.well-known/openid-configuration/realms/x",
        "https://id.example.com/realms/x/.well-known/openid-configuration",
    ]


async def test_the_protected_resource_document() -> None:
    config = OAuthResourceConfig(issuer="https://id.example.com", resource=RESOURCE, scopes_supported=["mcp"])
    document = ResourceMetadata(config)
    for path in (
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-protected-resource/mcp/direct",
    ):
        assert document.serves(path)
    assert not document.serves("/.well-known/oauth-protected-resource/other")
    assert not document.serves("/.well-known/oauth-protected-resource/mcpx")

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    scope = {"type": "http", "method": "GET", "path": "/.well-known/oauth-protected-resource/mcp", "headers": []}
    await document(scope, receive, send)
    assert sent[0]["status"] == 200
    assert json.loads(sent[1]["body"]) == {
        "resource": RESOURCE,
        "authorization_servers": ["https://id.example.com"],
        "scopes_supported": ["mcp"],
        "bearer_methods_supported": ["header"],
        "resource_name": "mcpvisor",
    }
    sent.clear()
    await document({**scope, "method": "POST"}, receive, send)
    assert sent[0]["status"] == 405
