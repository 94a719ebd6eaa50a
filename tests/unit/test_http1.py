"""Hypercorn with the frontend's one-write responses: answers stay whole, streams still start at once."""

from __future__ import annotations

from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from mcpvisor.frontend.endpoints.http1 import coalesce_response_writes

BODY = b'{"jsonrpc":"2.0","id":1,"result":{}}'


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await scope["state"]["release"].wait()
        await send({"type": "http.response.body", "body": b"data: late\n\n"})
        return
    status, body = (202, b"") if scope["path"] == "/empty" else (200, BODY)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _exchange(port: int, path: str, until: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n".encode())
        data = b""
        with trio.fail_after(10):
            while until not in data:
                data += await stream.receive_some(65536)
        return data


async def test_fixed_length_answers_and_streams_keep_their_shape() -> None:
    coalesce_response_writes()
    coalesce_response_writes()  # a second call changes nothing
    release = trio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        scope["state"] = {"release": release}
        await _app(scope, receive, send)

    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(serve, app, config)
        port = int(binds[0].rsplit(":", 1)[1])
        answer = await _exchange(port, "/call", BODY)
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"\r\n\r\n" + BODY)
        empty = await _exchange(port, "/empty", b"\r\n\r\n")
        assert empty.startswith(b"HTTP/1.1 202 ") and b"content-length: 0" in empty
        # A stream's head is not held back for its first event, which only comes after the client saw the head.
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(b"GET /stream HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
            head = b""
            with trio.fail_after(10):
                while b"\r\n\r\n" not in head:
                    head += await stream.receive_some(65536)
            assert head.startswith(b"HTTP/1.1 200 ") and b"late" not in head
            release.set()
            rest = b""
            with trio.fail_after(10):
                while b"data: late" not in rest:
                    rest += await stream.receive_some(65536)
        nursery.cancel_scope.cancel()
