"""`/oauth/callback`: where an upstream's authorization server sends the operator's browser back.

The redirect carries a code and the `state` of the authorization URL that `mcpvisor ctl login`
printed. The frontend does not know which worker started that login, so it asks every running
worker of a remote server; only the one holding that `state` (unguessable, compared in constant
time) takes the code and exchanges it. Nothing here can start a login, and the page shown says
only whether the login completed.
"""

from __future__ import annotations

import html
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

import msgspec
import trio

from mcpvisor.frontend.door.router import Router
from mcpvisor.wire.config import ServerConfig
from mcpvisor.wire.errors import WireError
from mcpvisor.wire.oauth_store import CALLBACK_METHOD

log = logging.getLogger(__name__)

PATH = "/oauth/callback"
ANSWER_TIMEOUT = 45.0  # the owner exchanges the code for tokens before it answers
_FIELDS = ("state", "code", "iss", "error", "error_description")
_MAX_VALUE = 4096

Send = Callable[[dict[str, Any]], Awaitable[None]]


async def serve_oauth_callback(
    router: Router, servers: dict[str, ServerConfig], scope: dict[str, Any], send: Send
) -> None:
    """Hand the redirect to the worker whose login it answers, and tell the browser how it went."""
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"), max_num_fields=20)
    params = {key: query[key][0][:_MAX_VALUE] for key in _FIELDS if query.get(key)}
    if scope.get("method") != "GET" or not params.get("state") or not (params.get("code") or params.get("error")):
        await _page(send, 400, "Not a login redirect", "This address receives the redirect of an upstream login.")
        return
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
            "It may have expired or completed already. Run `mcpvisor ctl login NAME` again.",
        )
        return
    answer = answers[0]
    name = str(answer.get("name", ""))
    if answer.get("ok"):
        await _page(send, 200, f"Logged in to {name}", "You can close this window; mcpvisor connects to it now.")
    else:
        await _page(send, 400, f"The login to {name} failed", str(answer.get("error", "")))


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
