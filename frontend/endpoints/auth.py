"""Who is asking: the principal of an HTTP request, found once at the boundary.

With no tenants and no OAuth issuer configured (the workstation), the boundary admits only the
user running mcpvisor (and root) on loopback, and that user is the operator of the admin surfaces.
With tenants or an issuer, every request to /mcp*, /api and /ui carries `Authorization: Bearer`:
a token of `mcpvisor token add` (wire/tokens.py) or a JWT of the configured issuer. A tenant's
token makes a client of that tenant; an admin token makes an operator.

Being an operator matters on the admin surfaces only: nothing an MCP request says approves anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

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
