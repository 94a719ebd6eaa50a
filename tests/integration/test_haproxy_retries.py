"""What the shipped HAProxy config sends again.

Given two listeners behind HAProxy, one of them leaving but still passing the health check (the
moment between SIGTERM and HAProxy's next check): a new session it refuses with 503 is sent again
to the other one, so the client sees it start. A call a replica leaves unanswered is never sent
again (a tool may have side effects): tests/e2e/test_leaving.py kills a replica mid-call.
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
