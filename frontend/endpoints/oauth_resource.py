"""mcpvisor as an OAuth 2.1 resource server: JWT access tokens of one issuer, and RFC 9728 metadata.

`JwtAuthority` is the `jwt=` check of the Authenticator (frontend/endpoints/auth.py): it verifies
a token's signature against the issuer's published keys (JWKS), its issuer, lifetime and
audience (RFC 8707: this resource), and maps one of its claims to a tenant or to the operator.
`ResourceMetadata` answers `/.well-known/oauth-protected-resource` (RFC 9728), where an MCP client
that got a 401 learns which authorization server to log in at.

The issuer's keys are fetched once, cached, and fetched again only for a token signed with a key
not in the cache, and then at most once per `refetch_interval`: whoever sends made-up key ids
cannot make mcpvisor hammer the issuer.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import trio
from joserfc import jws, jwt
from joserfc.errors import (
    BadSignatureError,
    ExpiredTokenError,
    InvalidClaimError,
    JoseError,
    MissingClaimError,
)
from joserfc.jwk import Key, KeySet

from mcpvisor.frontend.endpoints.auth import InvalidToken, Principal
from mcpvisor.frontend.endpoints.http_server import Receive, Scope, Send
from mcpvisor.runtime.fetch import FetchError, get_json
from mcpvisor.wire.config import OAuthResourceConfig, TenantConfig

log = logging.getLogger(__name__)

WELL_KNOWN: Final = "/.well-known/oauth-protected-resource"
MAX_TOKEN_BYTES: Final = 16 * 1024  # far above any real access token; more is refused unread
MAX_DOCUMENT_BYTES: Final = 1024 * 1024  # a JWKS or metadata document larger than this is not read
FETCH_TIMEOUT: Final = 10.0
KEYS_MAX_AGE: Final = 3600.0  # keys are fetched again after this long even when every kid is known
REFETCH_INTERVAL: Final = 30.0


class IssuerUnavailable(Exception):
    """The issuer's metadata or keys could not be had; the message names what and why, safely."""


class JwtAuthority:
    """Turns a JWT access token of the configured issuer into a principal, or raises InvalidToken."""

    def __init__(
        self,
        config: OAuthResourceConfig,
        tenants: Mapping[str, TenantConfig],
        *,
        refetch_interval: float = REFETCH_INTERVAL,
    ) -> None:
        self.config = config
        self.refetch_interval = refetch_interval
        self._tenant_of = _claim_table(tenants)
        self._admin_values = frozenset(config.admin_values)
        self._keys: KeySet | None = None
        self._fetched_at: float | None = None  # trio time of the last fetch attempt, successful or not
        self._fetch_lock = trio.Lock()
        self.fetches = 0  # key set fetches attempted, for the operator's metrics and the tests

    async def __call__(self, token: str) -> Principal:
        """The principal a JWT access token admits; InvalidToken (safe to send back) otherwise."""
        if len(token) > MAX_TOKEN_BYTES:
            raise InvalidToken("the token is too long to be an access token")
        try:
            signed = jws.extract_compact(token.encode("ascii"))
            header = signed.headers()
        except (JoseError, ValueError, UnicodeError):
            raise InvalidToken("the token is neither an mcpvisor token nor a signed JWT") from None
        alg = header.get("alg")
        if alg not in self.config.algorithms:
            shown = alg if isinstance(alg, str) and alg.isalnum() and len(alg) <= 16 else "an unknown algorithm"
            raise InvalidToken(f"the token is signed with {shown}, which this mcpvisor does not accept")
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise InvalidToken("the token's key id (kid) is not a string")
        key = await self._key_for(kid, alg)
        try:
            claims = jwt.decode(token, key, algorithms=self.config.algorithms).claims
        except BadSignatureError:
            raise InvalidToken("the token's signature does not verify with the issuer's key") from None
        except JoseError as exc:
            raise InvalidToken(f"the token cannot be verified: {exc.error}") from None
        self._check_claims(claims)
        return self._principal(claims)

    async def _key_for(self, kid: str | None, alg: str) -> Key:
        """The issuer's key that signed a token, fetching the key set when it is not cached or not in it."""
        keys = self._keys
        stale = self._fetched_at is not None and trio.current_time() - self._fetched_at > KEYS_MAX_AGE
        if keys is None or stale or _pick(keys, kid, alg) is None:
            keys = await self._refresh_keys()
        key = _pick(keys, kid, alg) if keys is not None else None
        if key is not None:
            return key
        if keys is None:
            raise InvalidToken("the issuer's signing keys cannot be fetched at the moment; try again later")
        if kid is None:
            raise InvalidToken("the token names no key id (kid) and the issuer has no single key for its algorithm")
        raise InvalidToken("the token is signed with a key the issuer does not publish")

    async def _refresh_keys(self) -> KeySet | None:
        """Fetch the key set unless a fetch was tried within `refetch_interval`; the keys held after."""
        seen = self._fetched_at
        async with self._fetch_lock:
            if self._fetched_at != seen:
                return self._keys  # another request fetched while this one waited for the lock
            now = trio.current_time()
            if seen is not None and now - seen < self.refetch_interval:
                return self._keys
            self._fetched_at = now
            self.fetches += 1
            try:
                self._keys = await self._fetch_keys()
            except IssuerUnavailable as exc:
                log.warning("the issuer's signing keys could not be fetched: %s", exc)
            return self._keys

    async def _fetch_keys(self) -> KeySet:
        jwks_uri = self.config.jwks_uri or await self._discover_jwks_uri()
        document = await _get_json(jwks_uri, "the key set (JWKS)")
        keys = document.get("keys") if isinstance(document, dict) else None
        if not isinstance(keys, list):
            raise IssuerUnavailable(f"{jwks_uri} holds no `keys` list")
        usable = [k for k in keys if isinstance(k, dict) and k.get("kty") != "oct" and k.get("use", "sig") == "sig"]
        try:
            return KeySet.import_key_set({"keys": usable})
        except (JoseError, ValueError, TypeError) as exc:
            raise IssuerUnavailable(f"{jwks_uri} holds no usable public signing key ({type(exc).__name__})") from None

    async def _discover_jwks_uri(self) -> str:
        """The issuer's `jwks_uri`, from its RFC 8414 metadata or else its OpenID Connect discovery document."""
        problems: list[str] = []
        for url in metadata_urls(self.config.issuer):
            try:
                document = await _get_json(url, "the issuer's metadata")
            except IssuerUnavailable as exc:
                problems.append(str(exc))
                continue
            if not isinstance(document, dict):
                problems.append(f"{url} is not a JSON object")
                continue
            # RFC 8414 §3.3: metadata naming another issuer must not be used.
            if document.get("issuer") != self.config.issuer:
                problems.append(f"{url} names another issuer")
                continue
            jwks_uri = document.get("jwks_uri")
            if not isinstance(jwks_uri, str) or not jwks_uri.startswith(("https://", "http://")):
                problems.append(f"{url} has no http(s) jwks_uri")
                continue
            return jwks_uri
        raise IssuerUnavailable("; ".join(problems))

    def _check_claims(self, claims: dict[str, Any]) -> None:
        registry = jwt.JWTClaimsRegistry(
            leeway=int(self.config.leeway),
            iss={"essential": True, "value": self.config.issuer},
            aud={"essential": True, "value": self.config.resource},
            exp={"essential": True},
        )
        try:
            registry.validate(claims)
        except ExpiredTokenError:
            raise InvalidToken("the token has expired") from None
        except MissingClaimError as exc:
            raise InvalidToken(f"the token lacks the claims {exc.claim}, which this mcpvisor requires") from None
        except InvalidClaimError as exc:
            raise InvalidToken(_claim_problem(exc.claim, self.config.resource)) from None

    def _principal(self, claims: dict[str, Any]) -> Principal:
        values = _claim_values(claims, self.config.claim)
        subject = claims.get("sub") if isinstance(claims.get("sub"), str) else ""
        token_id = claims.get("jti") if isinstance(claims.get("jti"), str) else subject
        if self._admin_values.intersection(values):
            return Principal(tenant=None, admin=True, token_id=token_id, subject=subject)
        tenants = sorted({self._tenant_of[v] for v in values if v in self._tenant_of})
        if not tenants:
            raise InvalidToken(f"the token's `{self.config.claim}` claim names no tenant of this mcpvisor")
        if len(tenants) > 1:
            raise InvalidToken(f"the token's `{self.config.claim}` claim names more than one tenant")
        return Principal(tenant=tenants[0], admin=False, token_id=token_id, subject=subject)


def _pick(keys: KeySet, kid: str | None, alg: str) -> Key | None:
    """The key of `keys` for a token's kid and alg: by kid, or the only one of the right type without one."""
    if kid is not None:
        matches = [k for k in keys if k.kid == kid]
    else:
        key_types = _KEY_TYPES.get(alg, ())
        matches = [k for k in keys if k.key_type in key_types]
        if len(matches) != 1:
            return None
    matches = [k for k in matches if k.get("alg") in (None, alg)]
    return matches[0] if matches else None


_KEY_TYPES: Final = {
    **{f"{family}{bits}": ("RSA",) for family in ("RS", "PS") for bits in (256, 384, 512)},
    **{f"ES{bits}": ("EC",) for bits in (256, 384, 512)},
    "EdDSA": ("OKP",),
    "Ed25519": ("OKP",),
}


def _claim_table(tenants: Mapping[str, TenantConfig]) -> dict[str, str]:
    """Claim value -> tenant: each tenant's name and its `claim_values`."""
    table: dict[str, str] = {}
    for name, tenant in tenants.items():
        for value in (name, *tenant.claim_values):
            table.setdefault(value, name)
    return table


def _claim_values(claims: Mapping[str, Any], claim: str) -> list[str]:
    """The string values of a claim: a string or a list of strings; a dotted name reaches into objects."""
    value: Any = claims.get(claim)
    if value is None and "." in claim:
        value = claims
        for part in claim.split("."):
            value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


def _claim_problem(claim: str, resource: str) -> str:
    match claim:
        case "aud":
            return f"the token is not meant for this resource: its audience (aud) must include {resource}"
        case "iss":
            return "the token was issued by another issuer than the one this mcpvisor trusts"
        case "nbf":
            return "the token is not valid yet (nbf)"
        case "iat":
            return "the token was issued in the future (iat)"
        case _:
            return f"the token's {claim!r} claim is not valid"


def metadata_urls(issuer: str) -> list[str]:
    """Where an issuer's metadata may be: RFC 8414 (path inserted), then OpenID Connect Discovery."""
    parts = urlsplit(issuer)
    path = parts.path.rstrip("/")
    origin = urlunsplit((parts.scheme, parts.netloc, "", "", ""))
    return [
        f"{origin}/.well-known/oauth-authorization-server{path}",
        f"{origin}/.well-known/openid-configuration{path}",
        f"{origin}{path}/.well-known/openid-configuration",
    ]


async def _get_json(url: str, what: str) -> Any:
    """GET a JSON document of the issuer, without following redirects and reading no more than the limit."""
    try:
        return await get_json(
            url, timeout=FETCH_TIMEOUT, max_bytes=MAX_DOCUMENT_BYTES, headers={"Accept": "application/json"}
        )
    except FetchError as exc:
        reasons = {
            "status": f"HTTP {exc.detail}",
            "too_large": f"is larger than {MAX_DOCUMENT_BYTES} bytes",
            "timeout": f"no answer within {FETCH_TIMEOUT:.0f} s",
            "unreachable": f"cannot be reached ({exc.detail})",
            "not_json": "is not JSON",
        }
        separator = ": " if exc.kind in ("status", "timeout") else " "
        raise IssuerUnavailable(f"{what} at {url}{separator}{reasons[exc.kind]}") from None


def resource_metadata_url(resource: str) -> str:
    """The URL of a resource's RFC 9728 document: the well-known path inserted before the resource's path."""
    parts = urlsplit(resource)
    return urlunsplit((parts.scheme, parts.netloc, WELL_KNOWN + parts.path.rstrip("/"), "", ""))


class ResourceMetadata:
    """The ASGI handler of `/.well-known/oauth-protected-resource` (RFC 9728), root and path-suffixed forms."""

    def __init__(self, config: OAuthResourceConfig) -> None:
        document: dict[str, Any] = {
            "resource": config.resource,
            "authorization_servers": [config.issuer],
            "bearer_methods_supported": ["header"],
            "resource_name": "mcpvisor",
        }
        if config.scopes_supported:
            document["scopes_supported"] = list(config.scopes_supported)
        self.body = json.dumps(document).encode()
        self._resource_path = urlsplit(config.resource).path.rstrip("/")

    def serves(self, path: str) -> bool:
        """Whether `path` is this document's: the root form, or the form of this resource or a path under it."""
        if not path.startswith(WELL_KNOWN):
            return False
        suffix = path[len(WELL_KNOWN) :].rstrip("/")
        return suffix in ("", self._resource_path) or suffix.startswith(self._resource_path + "/")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The document is public and read by browser-based clients on other origins too.
        headers = [(b"access-control-allow-origin", b"*")]
        if scope["method"] == "OPTIONS":
            headers += [(b"access-control-allow-methods", b"GET, OPTIONS"), (b"access-control-allow-headers", b"*")]
            await _respond(send, 204, b"", headers)
        elif scope["method"] not in ("GET", "HEAD"):
            await _respond(send, 405, b'{"error": "method not allowed"}', [*headers, (b"allow", b"GET, OPTIONS")])
        else:
            headers.append((b"cache-control", b"max-age=300"))
            await _respond(send, 200, self.body, headers, head=scope["method"] == "HEAD")


async def _respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]], *, head: bool = False
) -> None:
    start_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]
    await send({"type": "http.response.start", "status": status, "headers": start_headers})
    await send({"type": "http.response.body", "body": b"" if head else body})
