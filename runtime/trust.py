"""Who may connect: the rules that follow from the listen address and the authentication configured.

With no tokens and a loopback listen address, only the user running mcpvisor (and root) may
connect; a listen address others can reach needs authentication, or an explicit opt-out.
"""

from __future__ import annotations

import ipaddress
from typing import Final

from mcpvisor.wire.config import Settings, parse_listen

OPT_OUT: Final = "allow_unauthenticated_network"


def is_loopback(host: str) -> bool:
    """Whether a listen host is a loopback address (or `localhost`)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]").split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def local_users_only(settings: Settings, *, authenticated: bool = False) -> bool:
    """Whether the listener serves only the user running mcpvisor (and root): loopback without tokens.

    `authenticated`: tenants or an OAuth issuer are configured, so every client presents a token.
    """
    return is_loopback(parse_listen(settings.listen)[0]) and not authenticated


def exposure_problem(settings: Settings, *, authenticated: bool = False) -> str | None:
    """Why mcpvisor must not start with these settings (one line), or None."""
    host, _ = parse_listen(settings.listen)
    if is_loopback(host) or authenticated or getattr(settings, OPT_OUT):
        return None
    return (
        f"listen = {settings.listen!r} is reachable from other hosts and no authentication is configured: "
        f"listen on a loopback address, or set {OPT_OUT} = true in [mcpvisor] to accept that"
    )


def exposure_warning(settings: Settings, *, authenticated: bool = False) -> str | None:
    """The warning to log at every start when the operator opted out of authentication, or None."""
    host, _ = parse_listen(settings.listen)
    if is_loopback(host) or authenticated or not getattr(settings, OPT_OUT):
        return None
    return (
        f"listen = {settings.listen!r} without authentication ({OPT_OUT} = true): anyone who can reach "
        "this address can call, add and manage the upstream servers"
    )
