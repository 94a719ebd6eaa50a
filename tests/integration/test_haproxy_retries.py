"""What the shipped HAProxy config sends again, and where it sends a session.

Given two listeners behind HAProxy, one of them leaving but still passing the health check (the
moment between SIGTERM and HAProxy's next check): a new session it refuses with 503 is sent again
to the other one, so the client sees it start. A call a replica leaves unanswered is never sent
again (a tool may have side effects): tests/e2e/test_leaving.py kills a replica mid-call.
A session goes back to the replica that created it; a session id no replica gave is remembered
nowhere, so no client can push the real sessions out of HAProxy's table.
"""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx2
import trio

from mcpvisor.frontend.endpoints.leaving import Leaving
from tests.support.haproxy import open_haproxy
from tests.unit.test_http_server import Recorder, listening

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}


class StillChecked:
    """A leaving replica whose health check has not failed yet: /healthz still says ok."""

    def __init__(self, app: Recorder) -> None:
        self.app = app
        self.gate = Leaving(app, max_body=4096)
        self.gate.start()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        target = self.app if scope["type"] == "http" and scope["path"] == "/healthz" else self.gate
        await target(scope, receive, send)


async def test_a_new_session_refused_by_a_leaving_replica_starts_on_the_other(tmp_path: Path) -> None:
    leaving, staying = Recorder(), Recorder()
    async with AsyncExitStack() as stack:
        _, first = await stack.enter_async_context(listening(StillChecked(leaving)))  # type: ignore[arg-type]
        _, second = await stack.enter_async_context(listening(staying))
        proxy = await stack.enter_async_context(open_haproxy(tmp_path, {"replica1": first, "replica2": second}))
        async with httpx2.AsyncClient(timeout=10) as http:
            for _ in range(6):
                answer = await http.post(f"{proxy.base_url}/mcp", json=INITIALIZE)
                assert answer.status_code == 200, answer.text
                assert json.loads(answer.text)["path"] == "/mcp"  # the staying replica's answer
        with trio.fail_after(5):
            while len([line for line in proxy.log() if line.status == 200]) < 6:
                await trio.sleep(0.05)
    posts = [seen for seen in staying.seen if seen["method"] == "POST"]
    assert len(posts) == 6 and [seen for seen in leaving.seen if seen["method"] == "POST"] == []
    # Round robin sent about half of them to the leaving replica first: HAProxy says it retried those.
    logged = [line for line in proxy.log() if line.status == 200]
    assert all(line.server == "replica2" for line in logged)
    assert sum(line.retries > 0 for line in logged) >= 2


class Sessions:
    """A replica that gives each request without a session one of its own, and names itself."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        body = self.name.encode()
        headers = [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(body))]
        if not any(name == b"mcp-session-id" for name, _ in scope["headers"]):
            headers.append((b"mcp-session-id", f"session-of-{self.name}".encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


async def test_only_session_ids_a_replica_gave_are_remembered(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        _, first = await stack.enter_async_context(listening(Sessions("replica1")))  # type: ignore[arg-type]
        _, second = await stack.enter_async_context(listening(Sessions("replica2")))  # type: ignore[arg-type]
        proxy = await stack.enter_async_context(open_haproxy(tmp_path, {"replica1": first, "replica2": second}))
        async with httpx2.AsyncClient(timeout=10) as http:
            started = await http.post(f"{proxy.base_url}/mcp", json=INITIALIZE)
            session, home = started.headers["mcp-session-id"], started.text
            for n in range(50):  # ids no replica gave, sent by anyone
                await http.post(f"{proxy.base_url}/mcp", json=INITIALIZE, headers={"mcp-session-id": f"made-up-{n}"})
            for _ in range(4):  # the real session still goes back to its replica
                answer = await http.post(f"{proxy.base_url}/mcp", json=INITIALIZE, headers={"mcp-session-id": session})
                assert answer.text == home
        table = await proxy.ask("show table mcpvisor")
    assert "used:1" in table.splitlines()[0] and f"key={session} " in table and "made-up" not in table
