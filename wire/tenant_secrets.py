"""Secret references that name the tenant: `${file:/run/secrets/{tenant}/slack_token}`.

One server definition then gives each tenant its own key. `{tenant}` is filled in by the
supervisor when it launches a tenant's worker, from the tenant table it loaded: the name is never
taken from a request, and a tenant name cannot leave its place in a path (tenant names have no
`/`). A worker without a tenant (the operators') cannot resolve such a reference: it waits for the
operator rather than read someone's key.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

import msgspec

from mcpvisor.wire.config import TENANT_NAME, ServerConfig
from mcpvisor.wire.secrets import SECRET_REF

PLACEHOLDER = "{tenant}"
# A reference whose name may hold the placeholder (the plain pattern stops at its first `}`).
TEMPLATE_REF = re.compile(r"\$\{(env|file):((?:[^{}]|\{tenant\})+)\}")


class TenantSecretError(ValueError):
    """A tenant name that cannot be put into a secret reference."""


def names_tenant(value: str) -> bool:
    """Whether a value holds a secret reference that names the tenant."""
    return any(PLACEHOLDER in match.group(2) for match in TEMPLATE_REF.finditer(value))


def server_names_tenant(server: ServerConfig) -> bool:
    return any(names_tenant(value) for value in (*server.env.values(), *server.headers.values()))


def fill(value: str, tenant: str) -> str:
    """`{tenant}` inside the value's secret references replaced by the tenant's name."""
    if not TENANT_NAME.fullmatch(tenant):
        raise TenantSecretError(f"{tenant!r} is not a tenant name")

    def substitute(match: re.Match[str]) -> str:
        kind, ref = match.group(1), match.group(2)
        return "${" + kind + ":" + ref.replace(PLACEHOLDER, tenant) + "}"

    return TEMPLATE_REF.sub(substitute, value)


def for_tenant(server: ServerConfig, tenant: str) -> ServerConfig:
    """The server as one tenant's worker runs it: its references name that tenant's secrets."""
    if not tenant or not server_names_tenant(server):
        return server
    return msgspec.structs.replace(
        server,
        env={key: fill(value, tenant) for key, value in server.env.items()},
        headers={key: fill(value, tenant) for key, value in server.headers.items()},
    )


def missing(value: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """The references in `value` that cannot be resolved here, as written (never a secret)."""
    env = os.environ if environ is None else environ
    absent = []
    for match in SECRET_REF.finditer(value):
        kind, ref = match.group(1), match.group(2)
        if kind == "env":
            found = ref in env
        else:
            path = Path(os.path.expanduser(ref))
            found = path.is_file() and os.access(path, os.R_OK)
        if not found:
            absent.append(match.group(0))
    return absent


def missing_by_tenant(
    servers: Mapping[str, ServerConfig], tenants: Mapping[str, list[str]], environ: Mapping[str, str] | None = None
) -> list[tuple[str, str, str]]:
    """(tenant, server, reference) for each per-tenant secret that a tenant's server lacks."""
    lacking = []
    for tenant in sorted(tenants):
        for name in tenants[tenant]:
            server = servers.get(name)
            if server is None or not server.enabled or not server_names_tenant(server):
                continue
            filled = for_tenant(server, tenant)
            for value in (*filled.env.values(), *filled.headers.values()):
                lacking.extend((tenant, name, ref) for ref in missing(value, environ))
    return lacking
