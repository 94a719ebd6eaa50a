"""A tenant's own upstream login: the `SERVER:login` tool and the single-use links it hands out.

A server that waits for a tenant to connect its account lists one tool, `SERVER:login`. Calling
it (or any tool of that server) starts the worker's OAuth flow and answers with a link to
mcpvisor's `/oauth/start/TICKET`, not the authorization server's URL itself: opening the link
once, within minutes, sets a cookie bound to that login and redirects to the authorization
server. The callback completes the login only in the browser that holds that cookie, so a link
seen by someone else, a replayed or expired link, or a redirect opened in another person's browser
binds nothing (login CSRF).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

LOGIN_TOOL: Final = "login"
TICKET_TTL: Final = 300.0  # seconds a login link can be opened, once
COOKIE_PREFIX: Final = "mcpvisor_login_"


def login_tool(server: str) -> dict[str, Any]:
    """The definition of `SERVER:login`, mcpvisor's own tool (never pinned like an upstream's)."""
    return {
        "name": LOGIN_TOOL,
        "title": f"Connect your {server} account",
        "description": (
            f"Connect your own {server} account: {server} needs you to log in before its tools can be used. "
            "Returns a link to open in your browser; once you have logged in there, the tools of "
            f"{server} replace this one."
        ),
        "inputSchema": {"type": "object", "properties": {}, "additionalProperties": False},
        "annotations": {
            "title": f"Connect your {server} account",
            "readOnlyHint": True,
            "destructiveHint": False,
            "openWorldHint": True,
        },
    }


def binding_of(secret: str) -> str:
    """What the worker keeps of a login link's cookie: a hash, so the cookie itself travels no further."""
    return hashlib.sha256(secret.encode()).hexdigest()


def cookie_name(state: str) -> str:
    """The cookie of one login, named after its `state`, so logins in one browser do not collide."""
    return COOKIE_PREFIX + hashlib.sha256(state.encode()).hexdigest()[:16]


def state_of(authorization_url: str) -> str:
    return parse_qs(urlsplit(authorization_url).query).get("state", [""])[0]


@dataclass
class Ticket:
    """One login link: the worker it belongs to and where it leads, until it is opened or expires."""

    worker: str
    server: str
    tenant: str
    authorization_url: str
    secret: str  # the cookie value; its hash is the binding the worker holds
    expires: float
    used: bool = False


class LinkRefused(Exception):
    """A login link that cannot be opened; the message is what the page says."""


class LoginTickets:
    """The links handed out and not yet opened, for every tenant of this frontend."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, ttl: float = TICKET_TTL) -> None:
        self._clock = clock
        self.ttl = ttl
        self._tickets: dict[str, Ticket] = {}

    @staticmethod
    def new_secret() -> str:
        return secrets.token_urlsafe(32)

    def issue(self, worker: str, server: str, tenant: str, authorization_url: str, secret: str) -> str:
        """A ticket for a login the worker just started; the worker's older links stop working."""
        now = self._clock()
        self._tickets = {
            key: ticket for key, ticket in self._tickets.items() if ticket.expires > now and ticket.worker != worker
        }
        ticket_id = secrets.token_urlsafe(24)
        self._tickets[ticket_id] = Ticket(worker, server, tenant, authorization_url, secret, now + self.ttl)
        return ticket_id

    def redeem(self, ticket_id: str) -> Ticket:
        """Open a link, once: the ticket, or LinkRefused (unknown, used or expired)."""
        ticket = self._tickets.get(ticket_id)
        if ticket is None:
            raise LinkRefused("This login link is not valid, or it was replaced by a newer one.")
        if ticket.used:
            raise LinkRefused("This login link was already used. Ask for a new one with the login tool.")
        if ticket.expires <= self._clock():
            del self._tickets[ticket_id]
            raise LinkRefused("This login link has expired. Ask for a new one with the login tool.")
        ticket.used = True
        return ticket

    def pending(self) -> int:
        now = self._clock()
        return sum(1 for ticket in self._tickets.values() if not ticket.used and ticket.expires > now)


def login_answer(server: str, tenant: str, url: str, ttl: float, *, tool: str = "") -> dict[str, Any]:
    """The tool result that carries the link: for the login tool, or for a tool that could not run."""
    minutes = max(1, round(ttl / 60))
    why = (
        f"Tool '{server}:{tool}' did not run: your {server} account is not connected (or its login expired)."
        if tool
        else f"Your {server} account is not connected yet."
    )
    text = (
        f"{why} To connect it for {tenant}, open this link in your browser within {minutes} minutes "
        f"(it works once):\n\n{url}\n\nOnce you have logged in, the tools of {server} are listed in place of "
        f"{server}:login."
    )
    return {
        "content": [{"type": "text", "text": text}],
        "structuredContent": {"server": server, "login_url": url, "expires_in": round(ttl)},
        "isError": bool(tool),
    }
