"""`[mcpvisor] state_url`: checking, showing and resolving the URL of the shared state store.

Apart from the store itself (wire/state_pg.py), so the config loader checks the URL without
loading a database driver.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import quote, unquote

from mcpvisor.wire.config import ConfigError
from mcpvisor.wire.secrets import SECRET_REF, Redactor, SecretError, resolve

SCHEMES: Final = ("postgresql://", "postgres://")


class StateStoreError(Exception):
    """The shared store cannot be used; the message names it without its password."""


def check_url(url: str) -> None:
    """Refuse (ConfigError) a `state_url` that is not a PostgreSQL URL; nothing is resolved or contacted."""
    if not url.startswith(SCHEMES):
        raise ConfigError(f"state_url must start with postgresql:// (got {redact_url(url)!r})")
    for kind, ref in SECRET_REF.findall(url):
        if kind == "env" and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", ref):
            raise ConfigError(f"state_url: bad variable name in ${{env:{ref}}}")


def redact_url(url: str) -> str:
    """The URL as it may be shown: any password (a reference or the secret itself) replaced by ***."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "***"
    # The user info ends at the last '@' before the path; a `${file:/...}` may hold '/' itself.
    userinfo, at, hostpart = rest.rpartition("@")
    if not at:
        return url
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{hostpart}" if ":" in userinfo else f"{scheme}://{user}@{hostpart}"


def resolve_url(url: str) -> tuple[str, Redactor]:
    """`url` with its secret references resolved (each value percent-encoded), and a redactor of them."""
    redactor = Redactor()

    def substitute(match: re.Match[str]) -> str:
        value = resolve(match.group(0))
        redactor.add(value)
        redactor.add(quote(value, safe=""))
        return quote(value, safe="")

    try:
        resolved = SECRET_REF.sub(substitute, url)
    except SecretError as exc:
        raise StateStoreError(f"state_url {redact_url(url)}: {exc}") from None
    # libpq quotes a URL it cannot parse whole, so the password as written (percent-encoded) and
    # as meant are both hidden, whether it was a reference or written in the URL.
    userinfo, at, _ = resolved.partition("://")[2].rpartition("@")
    if at and ":" in userinfo:
        written = userinfo.split(":", 1)[1]
        redactor.add(written)
        redactor.add(unquote(written))
    return resolved, redactor
