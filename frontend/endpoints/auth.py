"""Who is asking: the principal of an HTTP request, found once at the boundary.

With no tenants and no OAuth issuer configured (the workstation), the boundary admits only the
user running mcpvisor (and root) on loopback, and that user is the operator of the admin surfaces.
With tenants or an issuer, every request to /mcp*, /api and /ui carries `Authorization: Bearer`:
a token of `mcpvisor token add` (store/tokens.py) or a JWT of the configured issuer. A tenant's
token makes a client of that tenant; an admin token makes an operator.

Being an operator matters on the admin surfaces only: nothing an MCP request says approves anything.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from mcpvisor.store.tokens import PREFIX as TOKEN_PREFIX
from mcpvisor.store.tokens import TokenError, TokenStore, digest, read_token_file
from mcpvisor.wire.config import TenantConfig

log = logging.getLogger(__name__)

PRINCIPAL_KEY: Final = "mcpvisor.principal"  # where the boundary leaves the principal in the ASGI scope


@dataclass(frozen=True, slots=True)
class Principal:
    """The asker of one request."""

    tenant: str | None  # the tenant whose servers this client sees; None: every server (operator, workstation)
    admin: bool  # may use the admin API and the console
    token_id: str = ""  # the stored token's id, or the JWT's `jti`/subject
    subject: str = ""  # who, for the activity log and the console (never a secret)


WORKSTATION: Final = Principal(tenant=None, admin=True, subject="local user")


def principal_of(scope: dict[str, Any]) -> Principal | None:
    """The principal the boundary admitted this request as, or None (no request passed it)."""
    return scope.get(PRINCIPAL_KEY)


class InvalidToken(Exception):
    """A bearer token that does not admit its bearer; the message is safe to send back (no token in it).

    `given` is False when the request carried no token at all (RFC 6750: then no error code).
    """

    def __init__(self, message: str, *, given: bool = True) -> None:
        super().__init__(message)
        self.message = message
        self.given = given


# Paths anyone may reach when clients authenticate: the discovery document a client needs to find
# out how to get a token, the redirect of an operator's upstream login, and the liveness probe
# (which then says no more than "ok").
PUBLIC_PATHS: Final = ("/.well-known/oauth-protected-resource", "/oauth/callback", "/oauth/start/", "/healthz")

JwtCheck = Callable[[str], Awaitable[Principal]]  # raises InvalidToken


class Authenticator:
    """Turns a request's `Authorization: Bearer` into a principal, or says why it cannot."""

    def __init__(
        self,
        tokens: TokenStore,
        tenants: Mapping[str, TenantConfig],
        *,
        jwt: JwtCheck | None = None,
        resource_metadata: str | None = None,
        admin_token_files: list[str] | None = None,
    ) -> None:
        self.tokens = tokens
        self.tenants = tenants
        self.jwt = jwt
        self.resource_metadata = resource_metadata  # URL of /.well-known/oauth-protected-resource
        # Tokens from secret files (the config's token_files): their hashes, read once at start.
        self.from_files: dict[str, Principal] = {}
        for path in admin_token_files or []:
            self._read_file(path, Principal(tenant=None, admin=True, token_id="file", subject=f"token file {path}"))
        for name, table in tenants.items():
            for path in table.token_files:
                self._read_file(
                    path, Principal(tenant=name, admin=False, token_id="file", subject=f"token file {path}")
                )

    def _read_file(self, path: str, principal: Principal) -> None:
        try:
            self.from_files[digest(read_token_file(path))] = principal
        except TokenError as exc:
            log.error("%s; that token is not accepted", exc)

    async def principal(self, scope: dict[str, Any]) -> Principal:
        """The principal of a request; InvalidToken (its message for the 401) when there is none."""
        token = bearer_token(scope)
        if token is None:
            raise InvalidToken("this mcpvisor needs `Authorization: Bearer TOKEN`", given=False)
        if self.from_files and (found := self.from_files.get(digest(token))) is not None:
            if found.tenant is not None and found.tenant not in self.tenants:
                raise InvalidToken("the token's tenant is no longer configured")
            return found
        if token.startswith(TOKEN_PREFIX):
            info = await self.tokens.acheck(token)
            if info is None:
                raise InvalidToken("the token is unknown, revoked or expired")
            if info.admin:
                return Principal(tenant=None, admin=True, token_id=info.id, subject=f"token {info.id}")
            if info.tenant not in self.tenants:
                raise InvalidToken("the token's tenant is no longer configured")
            return Principal(tenant=info.tenant, admin=False, token_id=info.id, subject=f"token {info.id}")
        if self.jwt is not None:
            return await self.jwt(token)
        raise InvalidToken("the token is unknown, revoked or expired")

    def challenge(self, error: str | None) -> bytes:
        """The `WWW-Authenticate` value of a 401 (RFC 6750, with RFC 9728's resource_metadata)."""
        parts = ['Bearer realm="mcpvisor"']
        if error is not None:
            parts.append('error="invalid_token"')
            parts.append(f'error_description="{_quoted(error)}"')
        if self.resource_metadata is not None:
            parts.append(f'resource_metadata="{_quoted(self.resource_metadata)}"')
        return ", ".join(parts).encode()


def bearer_token(scope: dict[str, Any]) -> str | None:
    """The token of an `Authorization: Bearer` header, or None."""
    for name, value in scope["headers"]:
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            return None
    return None


def _quoted(text: str) -> str:
    return "".join(c for c in text if c.isprintable() and c not in '"\\')
