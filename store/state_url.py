"""`[mcpvisor] state_url`: checking, showing and resolving the URL of the shared state store.

Apart from the store itself (store/state_pg.py), so the config loader checks the URL without
loading a database driver.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import quote, unquote

from mcpvisor.wire.config import ConfigError
from mcpvisor.wire.redaction import redact_url
from mcpvisor.wire.secrets import SECRET_REF, Redactor, SecretError, resolve

SCHEMES: Final = ("postgresql://", "postgres://")
# libpq's query parameters whose values are secrets.
_SECRET_PARAMS: Final = frozenset({"password", "sslpassword"})


class StateStoreError(Exception):
    """The shared store cannot be used; the message names it without its password."""


def check_url(url: str) -> None:
    """Refuse (ConfigError) a `state_url` that is not a PostgreSQL URL; nothing is resolved or contacted."""
    if not url.startswith(SCHEMES):
        raise ConfigError(f"state_url must start with postgresql:// (got {redact_url(url)!r})")
    for kind, ref in SECRET_REF.findall(url):
        if kind == "env" and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", ref):
            raise ConfigError(f"state_url: bad variable name in ${{env:{ref}}}")
    base, _, query = url.partition("?")
    for key, value in _secret_params(query):
        if SECRET_REF.fullmatch(value) is None:
            raise ConfigError(
                f"state_url: a {key} written in the query would be shown with the URL; give the password"
                " in the user info as a reference: postgresql://user:${env:NAME}@host/db (or ${file:/path})"
            )
    # libpq ends the user info at its first '@' or '/': the rest of the password would be taken
    # for the host, and quoted back in its errors.
    userinfo, at, _ = SECRET_REF.sub("", base).partition("://")[2].rpartition("@")
    if at and ("@" in userinfo or "/" in userinfo):
        raise ConfigError(
            "state_url: an '@' or '/' in the user info (or an '@' in the path) must be percent-encoded"
            " (%40, %2F); or give the password as ${env:NAME} / ${file:/path}"
        )


def _secret_params(query: str) -> list[tuple[str, str]]:
    """The (name, value) of the query's parameters that hold a secret."""
    found = []
    for item in query.split("&"):
        key, eq, value = item.partition("=")
        if eq and unquote(key).lower() in _SECRET_PARAMS:
            found.append((unquote(key), value))
    return found


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
    base, _, query = resolved.partition("?")
    userinfo, at, _ = base.partition("://")[2].rpartition("@")
    written = [value for _, value in _secret_params(query)]
    if at and ":" in userinfo:
        written.append(userinfo.split(":", 1)[1])
    for value in written:
        redactor.add(value)
        redactor.add(unquote(value))
    return resolved, redactor
