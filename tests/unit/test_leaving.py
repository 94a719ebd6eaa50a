"""The frontend's leaving gate, in front of an ASGI app answering with what it received.

Before leaving nothing changes; once leaving, /healthz answers 503, an `initialize` without a
session is refused with 503 and Retry-After before the app sees it, every other request reaches
the app whole with `Connection: close` on its answer, and `wait_idle` returns once the calls in
flight are done.
"""

from __future__ import annotations

import json
from typing import Any

import trio
import trio.testing

from mcpvisor.frontend.endpoints.leaving import Leaving

INITIALIZE = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "initialize", "params": {}}).encode()
CALL = json.dumps({"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": "x"}}).encode()


class Echo:
    """Answers with the body it read; `hold` keeps a request in flight until released."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.hold = False
        self.release = trio.Event()
        self.holding = trio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.bodies.append(body)
        if self.hold:
            self.holding.set()
            await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})


async def request(
    gate: Leaving, path: str, body: bytes = b"", *, method: str = "POST", session: bool = False
) -> tuple[int, dict[bytes, bytes], bytes]:
    headers = [(b"mcp-session-id", b"abc")] if session else []
    scope = {"type": "http", "method": method, "path": path, "headers": headers}
    parts = [body[:5], body[5:]]  # the body in two parts, as a client may send it

    async def receive() -> dict[str, Any]:
        if parts:
            part = parts.pop(0)
            return {"type": "http.request", "body": part, "more_body": bool(parts)}
        await trio.sleep_forever()
        raise AssertionError

    answer: dict[str, Any] = {"body": b""}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
            answer["headers"] = dict(message["headers"])
        else:
            answer["body"] += message.get("body", b"")

    await gate(scope, receive, send)
    return answer["status"], answer["headers"], answer["body"]


async def test_before_leaving_requests_pass_unchanged() -> None:
    app = Echo()
    gate = Leaving(app, max_body=1024)
    status, headers, body = await request(gate, "/mcp/direct", INITIALIZE)
    assert (status, body) == (200, INITIALIZE) and b"connection" not in headers
    assert gate.in_flight == 0


async def test_once_leaving_health_is_503_and_a_new_session_is_refused_before_the_app() -> None:
    app = Echo()
    gate = Leaving(app, max_body=1024)
    gate.start()
    status, _, body = await request(gate, "/healthz", method="GET")
    assert status == 503 and json.loads(body) == {"status": "leaving"}
    status, headers, body = await request(gate, "/mcp", INITIALIZE)
    assert status == 503 and headers[b"retry-after"] == b"1"
    refusal = json.loads(body)
    assert refusal["id"] == 7 and "stopping" in refusal["error"]["message"]
    assert app.bodies == []
    # Calls, in a session or not, still reach the app whole, and their connections end.
    for session in (False, True):
        status, headers, body = await request(gate, "/mcp/direct", CALL, session=session)
        assert (status, body, headers[b"connection"]) == (200, CALL, b"close")
    # An initialize inside an existing session is the app's to answer.
    assert (await request(gate, "/mcp", INITIALIZE, session=True))[0] == 200
    assert app.bodies == [CALL, CALL, INITIALIZE]


async def mark_idle(gate: Leaving, idle: trio.Event) -> None:
    """Set `idle` once the gate has no call in flight."""
    await gate.wait_idle()
    idle.set()


async def test_leaving_waits_for_the_calls_in_flight() -> None:
    app = Echo()
    app.hold = True
    gate = Leaving(app, max_body=1024)
    idle = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(request, gate, "/mcp/direct", CALL)
        await app.holding.wait()
        gate.start()

        nursery.start_soon(mark_idle, gate, idle)
        await trio.testing.wait_all_tasks_blocked()
        assert not idle.is_set() and gate.in_flight == 1
        app.release.set()
    assert idle.is_set() and gate.in_flight == 0


async def test_a_call_arriving_after_the_leave_began_idle_is_waited_for() -> None:
    app = Echo()
    app.hold = True
    gate = Leaving(app, max_body=1024)
    gate.start()  # nothing in flight yet
    idle = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(request, gate, "/mcp/direct", CALL)  # during the leave delay
        await app.holding.wait()

        nursery.start_soon(mark_idle, gate, idle)
        await trio.testing.wait_all_tasks_blocked()
        assert not idle.is_set() and gate.in_flight == 1
        app.release.set()
    assert idle.is_set() and gate.in_flight == 0 and app.bodies == [CALL]
