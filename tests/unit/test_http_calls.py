"""workers/http_calls.py against a real HTTP server on loopback (hypercorn), scripted per tool name:
the ways a streamable-HTTP upstream answers a pass-through request, and what the worker makes of each."""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import mcp_types as types
import pytest
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from mcpvisor.workers.http_calls import HttpCalls, Malformed, TooLarge, Unreachable
from mcpvisor.workers.stdio import RawError

RESULT = {"content": [{"type": "text", "text": "done"}], "isError": False}


SECRET = "sk-upstream-data-7f3a"


def _event(message: dict[str, Any]) -> bytes:
    return b"event: message\r\ndata: " + json.dumps(message).encode() + b"\r\n\r\n"


class Upstream:
    """An ASGI app that answers each tools/call the way its tool's name says."""

    def __init__(self) -> None:
        self.posts: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.peers: list[Any] = []  # the client's address of each POST: its connection
        self.answered = trio.Event()  # the elicitation's answer came
        self.cancelled = trio.Event()
        self.holding = trio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {name.decode(): value.decode() for name, value in scope["headers"]}
        request = json.loads(body)
        self.posts.append((headers, request))
        self.peers.append(tuple(scope["client"]))
        if "method" not in request:  # the client's answer to the upstream's question
            self.answered.set()
            await self._reply(send, 202, b"", "application/json")
            return
        if request["method"] == "notifications/cancelled":
            self.cancelled.set()
            await self._reply(send, 202, b"", "application/json")
            return
        tool = request["params"]["name"]
        answer = {"jsonrpc": "2.0", "id": request["id"], "result": RESULT}
        if tool == "json":
            await self._reply(send, 200, json.dumps(answer).encode(), "application/json")
        elif tool == "error":
            error = {"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32602, "message": "bad arguments"}}
            await self._reply(send, 400, json.dumps(error).encode(), "application/json")
        elif tool == "gone":
            await self._reply(send, 404, b"", "text/plain")
        elif tool == "proxy-error":
            await self._reply(send, 502, b"<html>bad gateway</html>", "text/html")
        elif tool == "junk":
            await self._reply(send, 200, b'{"jsonrpc": "2.0", "id": "x", "result": [[[', "application/json")
        elif tool == "stranger":
            answer["id"] = f"{request['id']}-other"
            await self._reply(send, 200, json.dumps(answer).encode(), "application/json")
        elif tool == "big":
            answer["result"] = {"content": [{"type": "text", "text": "x" * 5000}]}
            await self._reply(send, 200, json.dumps(answer).encode(), "application/json")
        else:
            await self._stream(tool, request, send)

    async def _stream(self, tool: str, request: dict[str, Any], send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        progress = {"progressToken": 7, "progress": 1, "total": 2}
        parts = [
            {"jsonrpc": "2.0", "method": "notifications/progress", "params": progress},
            {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"},
            {"jsonrpc": "2.0", "method": "notifications/unknown", "params": {}},
            {"jsonrpc": "2.0", "id": 99, "result": {}},  # an answer to something else
        ]
        for part in parts:
            await send({"type": "http.response.body", "body": _event(part), "more_body": True})
        noise = b"event: message\ndata: not json: " + SECRET.encode() + b"\n\n"
        await send({"type": "http.response.body", "body": noise, "more_body": True})
        if tool == "ask":
            question = {"message": "sure?", "requestedSchema": {"type": "object", "properties": {}}}
            ask = {"jsonrpc": "2.0", "id": "q1", "method": "elicitation/create", "params": question}
            await send({"type": "http.response.body", "body": _event(ask), "more_body": True})
            await self.answered.wait()
        if tool == "hold":
            self.holding.set()
            await trio.sleep_forever()
        if tool != "cut":
            answer = {"jsonrpc": "2.0", "id": request["id"], "result": RESULT}
            await send({"type": "http.response.body", "body": _event(answer), "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    @staticmethod
    async def _reply(send: Any, status: int, body: bytes, kind: str) -> None:
        headers = [(b"content-type", kind.encode()), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class Seen:
    def __init__(self) -> None:
        self.notifications: list[tuple[str, dict[str, Any]]] = []
        self.asked: list[tuple[str, dict[str, Any]]] = []
        self.list_changes = 0

    async def notify(self, method: str, params: bytes) -> None:
        self.notifications.append((method, json.loads(params)))

    async def answer(self, method: str, params: dict[str, Any]) -> dict[str, Any] | types.ErrorData | None:
        self.asked.append((method, params))
        return {"action": "accept", "content": {}}

    def list_changed(self) -> None:
        self.list_changes += 1


@asynccontextmanager
async def upstream_calls(max_result: int = 1_000_000) -> AsyncIterator[tuple[Upstream, HttpCalls, Seen]]:
    app = Upstream()
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    seen = Seen()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(functools.partial(serve, app, config))  # type: ignore[arg-type]
        url = binds[0] + "/mcp"
        async with httpx2.AsyncClient() as http:
            calls = HttpCalls(
                http, url, notify=seen.notify, answer=seen.answer, list_changed=seen.list_changed, max_result=max_result
            )
            calls.session_id, calls.protocol_version = "s1", "2025-11-25"
            yield app, calls, seen
        nursery.cancel_scope.cancel()


def call(tool: str) -> bytes:
    return json.dumps({"name": tool, "arguments": {}, "_meta": {"progressToken": 7}}).encode()


async def test_a_json_answer_is_the_result_and_the_request_carries_the_session() -> None:
    async with upstream_calls() as (app, calls, _seen):
        assert json.loads(await calls.request("tools/call", call("json"))) == RESULT
        headers, request = app.posts[0]
        assert headers["mcp-session-id"] == "s1" and headers["mcp-protocol-version"] == "2025-11-25"
        assert request["method"] == "tools/call" and str(request["id"]).startswith("mcpvisor-")


async def test_a_stream_passes_on_what_comes_before_its_answer(caplog: pytest.LogCaptureFixture) -> None:
    async with upstream_calls() as (_app, calls, seen):
        assert json.loads(await calls.request("tools/call", call("stream"))) == RESULT
        # Progress goes on; a list change means discovery; an unknown notification, an answer to
        # another request and an event that is not JSON are dropped.
        assert seen.notifications == [("notifications/progress", {"progressToken": 7, "progress": 1, "total": 2})]
        assert seen.list_changes == 1
    # What an upstream sends may hold a user's data: the skipped event is counted, never shown.
    assert "not JSON-RPC" in caplog.text and SECRET not in caplog.text


async def test_calls_answered_on_streams_go_on_one_kept_alive_connection() -> None:
    """A stream is read to its end after its answer: a connection closed half-read would make
    every call open one of its own."""
    async with upstream_calls() as (app, calls, _seen):
        for _ in range(3):
            assert json.loads(await calls.request("tools/call", call("stream"))) == RESULT
        assert len(set(app.peers)) == 1, app.peers


async def test_the_upstreams_question_is_put_to_the_client_and_its_answer_posted_back() -> None:
    async with upstream_calls() as (app, calls, seen):
        assert json.loads(await calls.request("tools/call", call("ask"))) == RESULT
        assert seen.asked == [
            ("elicitation/create", {"message": "sure?", "requestedSchema": {"type": "object", "properties": {}}})
        ]
        answers = [request for _headers, request in app.posts if "method" not in request]
        assert answers == [{"jsonrpc": "2.0", "id": "q1", "result": {"action": "accept", "content": {}}}]


async def test_an_error_answer_is_the_upstreams_error() -> None:
    async with upstream_calls() as (_app, calls, _seen):
        with pytest.raises(RawError) as error:
            await calls.request("tools/call", call("error"))
        assert (error.value.code, error.value.message) == (-32602, "bad arguments")
        with pytest.raises(RawError) as gone:
            await calls.request("tools/call", call("gone"))
        assert (gone.value.code, gone.value.message) == (types.INVALID_REQUEST, "Session terminated")


async def test_an_error_status_without_a_json_rpc_error_names_the_status() -> None:
    async with upstream_calls() as (_app, calls, _seen):
        with pytest.raises(RawError) as error:
            await calls.request("tools/call", call("proxy-error"))
        assert (error.value.code, error.value.message) == (
            types.INTERNAL_ERROR,
            "Server returned an error response (HTTP 502)",
        )


@pytest.mark.parametrize(
    ("tool", "reason"), [("junk", "its answer is not JSON-RPC"), ("stranger", "not the answer to this request")]
)
async def test_an_answer_that_is_not_one_is_said_so(tool: str, reason: str) -> None:
    """Malformed JSON, or an answer under another id: the call fails naming why, and the next call works."""
    async with upstream_calls() as (_app, calls, _seen):
        with pytest.raises(Malformed, match=reason):
            await calls.request("tools/call", call(tool))
        assert json.loads(await calls.request("tools/call", call("json"))) == RESULT


@pytest.mark.parametrize("tool", ["big", "big-stream"])
async def test_a_result_past_max_result_is_refused(tool: str) -> None:
    async with upstream_calls(max_result=1000) as (_app, calls, _seen):
        if tool == "big":
            with pytest.raises(TooLarge):
                await calls.request("tools/call", call("big"))
        else:
            calls.max_result = 10  # the stream's RESULT is past it
            with pytest.raises(TooLarge):
                await calls.request("tools/call", call("stream"))


async def test_a_stream_that_ends_without_an_answer_fails_the_call_and_tells_the_upstream() -> None:
    async with upstream_calls() as (app, calls, _seen):
        with pytest.raises(Unreachable, match="without an answer"):
            await calls.request("tools/call", call("cut"))
        with trio.fail_after(10):
            await app.cancelled.wait()


async def test_a_cancelled_call_is_cancelled_upstream_too() -> None:
    async with upstream_calls() as (app, calls, _seen):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(calls.request, "tools/call", call("hold"))
            with trio.fail_after(10):
                await app.holding.wait()
            nursery.cancel_scope.cancel()
        with trio.fail_after(10):
            await app.cancelled.wait()
        notice = next(request for _headers, request in app.posts if request.get("method") == "notifications/cancelled")
        held = next(request for _headers, request in app.posts if request.get("params", {}).get("name") == "hold")
        assert notice["params"] == {"requestId": held["id"]}


def unanswered(http: httpx2.AsyncClient) -> HttpCalls:
    """Calls on a session whose upstream's port (9, discard) has no server."""
    seen = Seen()
    calls = HttpCalls(
        http,
        "http://127.0.0.1:9/mcp",
        notify=seen.notify,
        answer=seen.answer,
        list_changed=seen.list_changed,
        max_result=10,
    )
    calls.protocol_version = "2025-11-25"
    return calls


async def test_an_upstream_that_cannot_be_reached_is_said_so() -> None:
    async with httpx2.AsyncClient() as http:
        with pytest.raises(Unreachable):
            await unanswered(http).request("tools/call", call("json"))


async def test_a_call_after_the_sessions_connection_closed_is_said_unreachable() -> None:
    """The session's client closes while the worker reconnects: a call that meets it fails with a
    reason, not httpx's RuntimeError about a closed client."""
    http = httpx2.AsyncClient()
    await http.aclose()
    with pytest.raises(Unreachable, match="closed"):
        await unanswered(http).request("tools/call", call("json"))
