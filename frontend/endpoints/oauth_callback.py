"""`/oauth/start/TICKET` and `/oauth/callback`: a browser's way through an upstream login.

A tenant's login link (the `SERVER:login` tool's) is `/oauth/start/TICKET`: opened once, within
minutes, it sets a cookie bound to that login and redirects to the authorization server (see
frontend/door/logins.py). The redirect back carries a code and the `state` of the authorization
URL (the tenant's, or the one `mcpvisor ctl login` printed). The frontend does not know which
worker started that login, so it asks every running worker of a remote server; only the one
holding that `state` (unguessable, compared in constant time) takes the code and exchanges it, and
a tenant's login only with the cookie of its link. Nothing here can start a login, and the page
says only which server was connected for which tenant, or that it was not.
"""

from __future__ import annotations

import html
import logging
from typing import Any
from urllib.parse import parse_qs

import msgspec
import trio

from mcpvisor.frontend.door.logins import (
    COOKIE_PREFIX,
    LinkRefused,
    LoginTickets,
    binding_of,
    cookie_name,
    state_of,
)
from mcpvisor.frontend.door.router import Router
from mcpvisor.frontend.endpoints.http_server import Send
from mcpvisor.store.oauth_store import CALLBACK_METHOD, CALLBACK_PATH, LOGIN_AFTER_OPENING, START_PATH
from mcpvisor.wire.config import ServerConfig
from mcpvisor.wire.errors import WireError

log = logging.getLogger(__name__)

PATH = CALLBACK_PATH
ANSWER_TIMEOUT = 45.0  # the owner exchanges the code for tokens before it answers
_FIELDS = ("state", "code", "iss", "error", "error_description")
_MAX_VALUE = 4096
LOGIN_COOKIE_AGE = LOGIN_AFTER_OPENING


async def serve_oauth_callback(
    router: Router, servers: dict[str, ServerConfig], scope: dict[str, Any], send: Send
) -> None:
    """Hand the redirect to the worker whose login it answers, and tell the browser how it went."""
    try:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"), max_num_fields=20)
    except ValueError:  # more fields than any redirect carries
        query = {}
    params = {key: query[key][0][:_MAX_VALUE] for key in _FIELDS if query.get(key)}
    if scope.get("method") != "GET" or not params.get("state") or not (params.get("code") or params.get("error")):
        await _page(send, 400, "Not a login redirect", "This address receives the redirect of an upstream login.")
        return
    # The cookie a tenant's login link set in this browser, as a hash: the worker compares it.
    cookie = _cookies(scope).get(cookie_name(params["state"]), "")
    params["binding"] = binding_of(cookie) if cookie else ""
    candidates = [
        worker
        for worker, view in router.catalogs.workers()
        if view.alive and (config := servers.get(worker.rpartition("/")[2])) is not None and config.kind != "stdio"
    ]
    answers: list[dict[str, Any]] = []

    async def ask(worker: str) -> None:
        try:
            raw = await router.request(worker, CALLBACK_METHOD, params, ANSWER_TIMEOUT)
        except WireError as exc:
            log.debug("oauth callback: %s did not answer: %s", worker, exc.message)
            return
        try:
            answer = msgspec.json.decode(raw, type=dict[str, Any])
        except msgspec.DecodeError:
            return
        if answer.get("mine"):
            answers.append(answer)

    async with trio.open_nursery() as nursery:
        for worker in candidates:
            nursery.start_soon(ask, worker)
    if not answers:
        await _page(
            send,
            400,
            "No login is waiting for this answer",
            "It may have expired or completed already. Start the login again.",
        )
        return
    answer = answers[0]
    tenant, _, server = str(answer.get("name", "")).rpartition("/")
    if answer.get("ok"):
        if tenant:
            await _page(send, 200, f"Your {server} account is connected for {tenant}", "You can close this window.")
        else:
            await _page(send, 200, f"Logged in to {server}", "You can close this window; mcpvisor connects to it now.")
    else:
        await _page(send, 400, f"The login to {server} failed", str(answer.get("error", "")))


async def serve_oauth_start(logins: LoginTickets, scope: dict[str, Any], send: Send, *, secure: bool) -> None:
    """Open a tenant's login link once: bind this browser to the login, then go to the authorization server."""
    ticket_id = scope.get("path", "")[len(START_PATH) :]
    try:
        if scope.get("method") != "GET" or not ticket_id:
            raise LinkRefused("This address opens the login links mcpvisor hands out.")
        ticket = logins.redeem(ticket_id)
    except LinkRefused as exc:
        await _page(send, 400, "This login link cannot be used", str(exc))
        return
    cookie = (
        f"{cookie_name(state_of(ticket.authorization_url))}={ticket.secret}; Path={CALLBACK_PATH}; "
        f"Max-Age={int(LOGIN_COOKIE_AGE)}; HttpOnly; SameSite=Lax" + ("; Secure" if secure else "")
    )
    headers = [
        (b"location", ticket.authorization_url.encode()),
        (b"set-cookie", cookie.encode()),
        (b"content-length", b"0"),
        (b"cache-control", b"no-store"),
        (b"referrer-policy", b"no-referrer"),
    ]
    log.info("login link of %s/%s opened", ticket.tenant, ticket.server)
    await send({"type": "http.response.start", "status": 302, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


def _cookies(scope: dict[str, Any]) -> dict[str, str]:
    found: dict[str, str] = {}
    for key, value in scope.get("headers", []):
        if key.lower() != b"cookie":
            continue
        for part in value.decode("latin-1").split(";"):
            name, sep, text = part.strip().partition("=")
            if sep and name.startswith(COOKIE_PREFIX):
                found.setdefault(name, text[:_MAX_VALUE])
    return found


async def _page(send: Send, status: int, title: str, text: str) -> None:
    body = (
        "<!doctype html><meta charset=utf-8><title>mcpvisor</title>"
        f"<h1>{html.escape(title)}</h1><p>{html.escape(text)}</p>"
    ).encode()
    headers = [
        (b"content-type", b"text/html; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
        (b"referrer-policy", b"no-referrer"),  # the code in this URL must not travel further
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
