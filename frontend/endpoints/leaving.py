"""Leaving the load balancer's rotation without failing a call.

From SIGTERM on, /healthz answers 503 (the balancer's health check takes the replica out), a new
handshake-era session is refused with 503 and Retry-After (the balancer retries it on another
replica: nothing ran here), every answer ends its connection (keep-alive connections move to the
other replicas), and everything else is still served. The calls in flight are counted, so the
frontend stops accepting after `leave_delay` and stops once they are done (frontend/main.py).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import trio

from mcpvisor.frontend.endpoints.http_server import Receive, Scope, Send

ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class _Request(msgspec.Struct):
    method: str = ""
    id: int | str | None = None


_decode = msgspec.json.Decoder(_Request)


def _is_initialize(body: bytes) -> tuple[bool, int | str | None]:
    try:
        request = _decode.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False, None  # not one JSON-RPC request: the app answers it as it would any time
    return request.method == "initialize", request.id


async def _json(send: Send, status: int, document: Any, *extra: tuple[bytes, bytes]) -> None:
    body = json.dumps(document).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Leaving:
    """Wraps the frontend's ASGI app: counts calls in flight, and changes its answers once leaving."""

    def __init__(self, app: ASGIApp, max_body: int) -> None:
        self.app = app
        self.max_body = max_body
        self.leaving = False
        self.in_flight = 0
        self._idle = trio.Event()  # set when in_flight falls to 0; a new one at each call after that

    def start(self) -> None:
        """Leave: from now on the replica reports not-ready and takes no new session."""
        self.leaving = True

    async def wait_idle(self) -> None:
        """Until no call is in flight (after `start`)."""
        # Calls keep arriving until the listener stops accepting: idle once is not idle now.
        while self.in_flight:
            await self._idle.wait()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.leaving:
            path = scope["path"].rstrip("/") or "/"
            if path == "/healthz":
                await _json(send, 503, {"status": "leaving"}, (b"connection", b"close"))
                return
            send = _closing(send)
            if scope["method"] == "POST" and path.startswith("/mcp"):
                refused, receive = await self._new_session(scope, receive)
                if refused is not None:
                    await _json(send, 503, refused, (b"retry-after", b"1"))
                    return
        if scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        if self.in_flight == 0:
            self._idle = trio.Event()
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()

    async def _new_session(self, scope: Scope, receive: Receive) -> tuple[dict[str, Any] | None, Receive]:
        """(the refusal of an `initialize`, or None; a receive that replays the body read to tell)."""
        if any(name == b"mcp-session-id" for name, _ in scope["headers"]):
            return None, receive
        parts: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return None, _replay([message], receive)
            parts.append(message.get("body", b""))
            size += len(parts[-1])
            more = bool(message.get("more_body", False))
            if size > self.max_body:
                break  # the app refuses it as too large
        body = b"".join(parts)
        initialize, request_id = _is_initialize(body) if not more else (False, None)
        if initialize:
            error = {"code": -32000, "message": "this mcpvisor replica is stopping: start the session again"}
            return {"jsonrpc": "2.0", "id": request_id, "error": error}, receive
        return None, _replay([{"type": "http.request", "body": body, "more_body": more}], receive)


def _replay(messages: list[dict[str, Any]], receive: Receive) -> Receive:
    async def replayed() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        return await receive()

    return replayed


def _closing(send: Send) -> Send:
    """`send` that ends the connection after the answer (unless the app already said so)."""

    async def closing(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", ()))
            if not any(bytes(name).lower() == b"connection" for name, _ in headers):
                headers.append((b"connection", b"close"))
            message = {**message, "headers": headers}
        await send(message)

    return closing
