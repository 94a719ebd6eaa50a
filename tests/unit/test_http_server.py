"""The frontend's HTTP/1.1 listener against raw sockets: plain MCP POSTs answered on its own path,
every other request (and the rest of its connection) by hypercorn, what llhttp refuses answered
400 and never served, and nothing a client sends stops the listener. Answers are parsed with h11,
as a strict client would."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h11
import hpack
import pytest
import trio
from hypercorn.config import Config

from mcpvisor.frontend.endpoints.http_server import MAX_HEAD, Http1Server

MAX_BODY = 4096


class Recorder:
    """An ASGI app answering with what it saw, and the ways it can answer (by path)."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.disconnected = trio.Event()
        self.streaming = trio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.seen.append({"method": scope["method"], "path": scope["path"], "body": body, "scope": scope})
        if scope["path"] == "/mcp/fail":
            raise RuntimeError("the app failed")
        if scope["path"] == "/mcp/bad-header":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"x-bad", b"a\r\nset-cookie: x")]})
            await send({"type": "http.response.body", "body": b"{}"})
            return
        if scope["path"] == "/mcp/stream":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            for part in (b"one ", b"", b"two ", b"three"):
                await send({"type": "http.response.body", "body": part, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        if scope["path"] == "/mcp/hold":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"first", "more_body": True})
            self.streaming.set()
            assert (await receive())["type"] == "http.disconnect"
            self.disconnected.set()
            return
        answer = json.dumps({"method": scope["method"], "path": scope["path"], "size": len(body)}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})


class Listener(Http1Server):
    """The listener, counting the connections it hands over to hypercorn."""

    handed_over = 0

    async def fallback(self, stream: trio.abc.Stream) -> None:
        self.handed_over += 1
        await super().fallback(stream)


@asynccontextmanager
async def listening(
    app: Recorder, max_requests: int = 1000, keep_alive: float = 75
) -> AsyncIterator[tuple[Listener, int]]:
    config = Config()
    config.keep_alive_max_requests = max_requests
    config.keep_alive_timeout = keep_alive
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.include_server_header = False
    server = Listener(app, config, max_body=MAX_BODY)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(server.serve)
        yield server, int(binds[0].rsplit(":", 1)[1])
        nursery.cancel_scope.cancel()


def post(path: str, body: bytes = b"{}", *extra: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class Client:
    """One connection, its answers read with h11."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.parser = h11.Connection(our_role=h11.CLIENT)
        self.unanswered = 0

    async def send(self, data: bytes, requests: int = 1) -> None:
        self.unanswered += requests
        await self.stream.send_all(data)

    async def answer(self) -> tuple[h11.Response, bytes]:
        # h11 parses an answer once told its request was sent, one request at a time.
        assert self.unanswered > 0 and self.parser.our_state is h11.IDLE
        self.unanswered -= 1
        self.parser.send(h11.Request(method="POST", target="/", headers=[("host", "x"), ("content-length", "0")]))
        self.parser.send(h11.EndOfMessage())
        response: h11.Response | None = None
        body = b""
        with trio.fail_after(10):
            while True:
                event = self.parser.next_event()
                if event is h11.NEED_DATA:
                    self.parser.receive_data(await self.stream.receive_some(65536))
                elif isinstance(event, h11.Response):
                    response = event
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    assert response is not None
                    if self.parser.our_state is h11.DONE and self.parser.their_state is h11.DONE:
                        self.parser.start_next_cycle()
                    return response, body
                elif isinstance(event, h11.ConnectionClosed):
                    raise EOFError("the server closed the connection")

    async def closed(self) -> bool:
        with trio.fail_after(10):
            return await self.stream.receive_some(65536) == b""


@asynccontextmanager
async def connect(port: int) -> AsyncIterator[Client]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        yield Client(stream)


def header(response: h11.Response, name: bytes) -> bytes | None:
    return next((value for key, value in response.headers if key == name), None)


async def test_plain_posts_are_answered_here_on_one_kept_alive_connection() -> None:
    app = Recorder()
    async with listening(app) as (server, port), connect(port) as client:
        for size in (2, 300):
            await client.send(post("/mcp/direct", b"x" * size))
            response, body = await client.answer()
            assert response.status_code == 200 and header(response, b"date") is not None
            assert json.loads(body) == {"method": "POST", "path": "/mcp/direct", "size": size}
        # Two requests in one write come back in order.
        await client.send(post("/mcp/a", b"1") + post("/mcp/b?x=1", b"22"), requests=2)
        assert json.loads((await client.answer())[1])["path"] == "/mcp/a"
        assert json.loads((await client.answer())[1])["path"] == "/mcp/b"
        assert app.seen[-1]["scope"]["query_string"] == b"x=1"
        assert app.seen[-1]["scope"]["client"][0] == "127.0.0.1"
    assert server.handed_over == 0
    assert [seen["body"] for seen in app.seen] == [b"x" * 2, b"x" * 300, b"1", b"22"]


async def test_a_request_not_plain_hands_the_rest_of_the_connection_to_hypercorn() -> None:
    app = Recorder()
    async with listening(app) as (server, port), connect(port) as client:
        await client.send(post("/mcp/direct", b"{}"))
        assert (await client.answer())[0].status_code == 200
        chunked = (
            b"POST /mcp/direct HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
        )
        await client.send(chunked + post("/mcp/after", b"xyz"), requests=2)
        assert json.loads((await client.answer())[1]) == {"method": "POST", "path": "/mcp/direct", "size": 5}
        assert json.loads((await client.answer())[1])["path"] == "/mcp/after"
        await client.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert json.loads((await client.answer())[1]) == {"method": "GET", "path": "/healthz", "size": 0}
    assert server.handed_over == 1
    assert [seen["body"] for seen in app.seen] == [b"{}", b"abcde", b"xyz", b""]


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /mcp HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /other HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
        b"POST /mcp%2Fdirect HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
        b"POST /mcp HTTP/1.0\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
        b"POST /mcp HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n{}",
        b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY + 1) + b"x" * (MAX_BODY + 1),
        b"POST /mcp HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
        b"POST /mcp HTTP/1.1\r\nHost: x\r\nX: " + b"a" * MAX_HEAD + b"\r\nContent-Length: 2\r\n\r\n{}",
    ],
    ids=["get", "other-path", "percent", "http-1.0", "expect", "over-max-body", "no-host", "head-too-long"],
)
async def test_requests_only_hypercorn_serves_are_handed_over_whole(request_bytes: bytes) -> None:
    app = Recorder()
    async with listening(app) as (server, port), connect(port) as client:
        await client.send(request_bytes)
        response, _ = await client.answer()
    assert server.handed_over == 1
    # hypercorn answers them as it would have without this listener: the app, or its own refusal.
    assert response.status_code in (200, 400) and len(app.seen) == (1 if response.status_code == 200 else 0)


REFUSED = {
    "space-before-colon": b"POST /mcp HTTP/1.1\r\nHost : x\r\nContent-Length: 2\r\n\r\n{}",
    "negative-length": b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: -2\r\n\r\n{}",
    "nul": b"POST /mcp HTTP/1.1\r\nHost: x\r\nBad: a\x00b\r\nContent-Length: 2\r\n\r\n{}",
    "folded": b"POST /mcp HTTP/1.1\r\nHost: x\r\n Folded: yes\r\nContent-Length: 2\r\n\r\n{}",
    "folded-value": b"POST /mcp HTTP/1.1\r\nHost: x\r\nX: a\r\n b\r\nContent-Length: 2\r\n\r\n{}",
    "bare-lf": b"POST /mcp HTTP/1.1\nHost: x\nContent-Length: 2\n\n{}",
    "bare-lf-one-line": b"POST /mcp HTTP/1.1\r\nHost: x\nContent-Length: 2\r\n\r\n{}",
    # A value that would make a backtracking pattern take minutes.
    "spaces": b"POST /mcp HTTP/1.1\r\nHost: x\r\nX: a" + b" " * 15000 + b"\x01\r\nContent-Length: 2\r\n\r\n{}",
    # The classic smuggling shapes: each hides a second request where another parser may see one.
    "cl-te": b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nG",
    "te-cl": (
        b"POST /mcp HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"
        b"8\r\nSMUGGLED\r\n0\r\n\r\n"
    ),
    "two-lengths": b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
    "two-lengths-differ": b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 2\r\n\r\n{}",
    "length-list": b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 2, 2\r\n\r\n{}",
    "te-space-colon": b"POST /mcp HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
    "te-not-last": b"POST /mcp HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
    "te-unknown": b"POST /mcp HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
    "chunk-bare-lf": b"POST /mcp HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\n{}\n0\n\n",
}


@pytest.mark.parametrize("request_bytes", list(REFUSED.values()), ids=list(REFUSED))
async def test_what_llhttp_refuses_is_answered_400_here_reaches_no_app_and_the_listener_lives(
    request_bytes: bytes,
) -> None:
    app = Recorder()
    async with listening(app) as (server, port):
        async with connect(port) as client:
            await client.stream.send_all(request_bytes + post("/mcp/smuggled"))
            with trio.fail_after(10):
                answer = b""
                while data := await client.stream.receive_some(65536):
                    answer += data
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 ") and b"connection: close" in head
        assert body.startswith(b"bad request: ") and answer.count(b"HTTP/1.1") == 1
        assert app.seen == [] and server.handed_over == 0
        async with connect(port) as client:
            await client.send(post("/mcp", b"{}"))
            assert (await client.answer())[0].status_code == 200


async def test_requests_before_a_refused_one_are_answered_and_none_after() -> None:
    app = Recorder()
    async with listening(app) as (_, port), connect(port) as client:
        await client.stream.send_all(post("/mcp/first") + REFUSED["cl-te"] + post("/mcp/smuggled"))
        with trio.fail_after(10):
            answer = b""
            while data := await client.stream.receive_some(65536):
                answer += data
    first, refusal = answer.split(b"HTTP/1.1 400 ")
    assert first.startswith(b"HTTP/1.1 200 ") and b'"/mcp/first"' in first and b"bad request: " in refusal
    assert [seen["path"] for seen in app.seen] == ["/mcp/first"]


async def test_after_the_hand_over_llhttp_still_reads_every_byte_before_hypercorn() -> None:
    # h11 alone would read the folded header; here the connection ends before hypercorn sees it.
    app = Recorder()
    async with listening(app) as (server, port), connect(port) as client:
        await client.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await client.answer())[0].status_code == 200
        await client.stream.send_all(REFUSED["folded-value"] + post("/mcp/smuggled"))
        assert await client.closed()
    assert [seen["path"] for seen in app.seen] == ["/healthz"] and server.handed_over == 1


async def test_a_streamed_answer_is_chunked_and_the_connection_kept() -> None:
    app = Recorder()
    async with listening(app) as (server, port), connect(port) as client:
        await client.send(post("/mcp/stream"))
        response, body = await client.answer()
        assert body == b"one two three" and header(response, b"transfer-encoding") == b"chunked"
        await client.send(post("/mcp/after"))
        assert (await client.answer())[0].status_code == 200
    assert server.handed_over == 0


async def test_a_client_leaving_mid_stream_is_told_to_the_app() -> None:
    app = Recorder()
    async with listening(app) as (server, port):
        async with connect(port) as client:
            await client.send(post("/mcp/hold"))
            with trio.fail_after(10):
                await app.streaming.wait()
        with trio.fail_after(10):
            await app.disconnected.wait()
        # The listener goes on serving.
        async with connect(port) as client:
            await client.send(post("/mcp/next"))
            assert (await client.answer())[0].status_code == 200
    assert server.handed_over == 0


@pytest.mark.parametrize("path", ["/mcp/fail", "/mcp/bad-header"])
async def test_a_failing_app_gets_a_500_and_the_connection_ends(path: str) -> None:
    app = Recorder()
    async with listening(app) as (_, port):
        async with connect(port) as client:
            await client.send(post(path))
            response, body = await client.answer()
            assert response.status_code == 500 and body == b""
            assert header(response, b"connection") == b"close"
            assert await client.closed()
        async with connect(port) as client:
            await client.send(post("/mcp/next"))
            assert (await client.answer())[0].status_code == 200


async def test_connection_close_is_honoured() -> None:
    app = Recorder()
    async with listening(app) as (_, port), connect(port) as client:
        await client.send(post("/mcp/direct", b"{}", "Connection: close"))
        response, _ = await client.answer()
        assert response.status_code == 200 and header(response, b"connection") == b"close"
        assert await client.closed()


async def test_a_connection_ends_after_the_configured_number_of_requests() -> None:
    app = Recorder()
    async with listening(app, max_requests=3) as (_, port), connect(port) as client:
        for _ in range(2):
            await client.send(post("/mcp/direct"))
            assert header((await client.answer())[0], b"connection") is None
        await client.send(post("/mcp/direct"))
        assert header((await client.answer())[0], b"connection") == b"close"
        assert await client.closed()


@pytest.mark.parametrize(
    "partial",
    [b"", b"POST /mcp HTTP/1.1\r\nHost: x\r\n", b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\n{"],
)
async def test_a_connection_idle_or_too_slow_past_the_keep_alive_timeout_is_closed(partial: bytes) -> None:
    app = Recorder()
    async with listening(app, keep_alive=0.3) as (server, port), connect(port) as client:
        await client.send(post("/mcp/direct"))
        assert (await client.answer())[0].status_code == 200
        await client.stream.send_all(partial)
        assert await client.closed()
    assert len(app.seen) == 1 and server.handed_over == 0


async def test_a_client_leaving_mid_body_reaches_no_app() -> None:
    app = Recorder()
    async with listening(app) as (server, port):
        async with connect(port) as client:
            await client.stream.send_all(b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        async with connect(port) as client:
            await client.send(post("/mcp/next"))
            assert (await client.answer())[0].status_code == 200
    assert [seen["path"] for seen in app.seen] == ["/mcp/next"] and server.handed_over == 0


@pytest.mark.parametrize("before", [False, True], ids=["first", "after-a-request"])
async def test_a_flood_of_empty_lines_is_refused_and_the_listener_serves_others(before: bool) -> None:
    app = Recorder()
    async with listening(app) as (server, port):
        async with connect(port) as client:
            if before:
                await client.send(post("/mcp/first"))
                assert (await client.answer())[0].status_code == 200
            # llhttp skips empty lines before a request: held here, they would be kept until the
            # keep-alive timeout, however many the client sends.
            flood = b"\r\n" * (MAX_HEAD // 2 + 1)
            answer = b""
            # The connection ends (hypercorn answers 400, unless a reset overtakes that answer).
            with trio.fail_after(10), contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                for _ in range(64):
                    await client.stream.send_all(flood)
                while data := await client.stream.receive_some(65536):
                    answer += data
            statuses = [line.split(b" ")[1] for line in answer.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")]
            assert statuses in ([], [b"400"])
        async with connect(port) as client:
            await client.send(post("/mcp/next"))
            assert (await client.answer())[0].status_code == 200
    assert [seen["path"] for seen in app.seen] == (["/mcp/first"] if before else []) + ["/mcp/next"]
    assert server.handed_over == 1


async def _h2c(port: int) -> tuple[trio.SocketStream, h2.connection.H2Connection]:
    """A connection upgraded to HTTP/2 (h2c) by its first request, as a client that speaks it."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    settings = conn.initiate_upgrade_connection().decode()
    await stream.send_all(
        "GET /mcp/upgrade HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade, HTTP2-Settings\r\n"
        f"Upgrade: h2c\r\nHTTP2-Settings: {settings}\r\n\r\n".encode()
    )
    head = b""
    with trio.fail_after(10):
        while b"\r\n\r\n" not in head:
            head += await stream.receive_some(65536)
    assert head.startswith(b"HTTP/1.1 101"), head
    conn.receive_data(head.split(b"\r\n\r\n", 1)[1])
    return stream, conn


async def test_an_oversized_http2_header_block_gets_goaway_and_the_connection_is_not_reset() -> None:
    """The client goes on sending after its header block was refused: it still reads the GOAWAY,
    then the end of the connection, never a reset that would destroy it."""
    async with listening(Recorder()) as (_server, port):
        for _ in range(3):
            stream, conn = await _h2c(port)
            headers = [(":method", "POST"), (":path", "/mcp"), (":scheme", "http"), (":authority", "127.0.0.1")]
            conn.send_headers(3, [*headers, ("x-big", "a" * 100_000)])
            frames: set[str] = set()
            async with stream:
                with trio.fail_after(30):
                    await stream.send_all(conn.data_to_send())
                    await trio.sleep(0.3)  # refused by now: what follows is unread when it closes
                    for _ in range(64):
                        await stream.send_all(b"\x00" * 16384)
                    while data := await stream.receive_some(65536):
                        with contextlib.suppress(h2.exceptions.ProtocolError):
                            for event in conn.receive_data(data):
                                frames.add(type(event).__name__)
            assert frames & {"ConnectionTerminated", "StreamReset"}, frames


async def test_an_http2_client_with_prior_knowledge_is_served_and_its_oversized_header_block_gets_goaway() -> None:
    """h2c without an upgrade begins with HTTP/2's preface, which llhttp does not parse: hypercorn
    serves it, a request as usual and an oversized header block with a GOAWAY, never a 400 in
    HTTP/1.1 or a reset."""
    headers = [(":method", "POST"), (":path", "/mcp/h2"), (":scheme", "http"), (":authority", "127.0.0.1")]
    async with listening(Recorder()) as (server, port):
        for size, expected in ((100, "StreamEnded"), (100_000, "ConnectionTerminated")):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
            conn.initiate_connection()
            conn.send_headers(1, [*headers, ("x-big", "a" * size)], end_stream=True)
            events: list[Any] = []
            async with stream:
                with trio.fail_after(30):
                    await stream.send_all(conn.data_to_send())
                    while expected not in {type(event).__name__ for event in events}:
                        data = await stream.receive_some(65536)
                        assert data, events
                        events += conn.receive_data(data)
            if expected == "StreamEnded":
                body = b"".join(event.data for event in events if isinstance(event, h2.events.DataReceived))
                assert json.loads(body) == {"method": "POST", "path": "/mcp/h2", "size": 0}
        assert server.handed_over == 2


def _frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream_id.to_bytes(4, "big") + payload


@pytest.mark.parametrize("framing", ["one frame", "continuation frames"])
async def test_a_megabyte_http2_header_block_gets_goaway_and_the_connection_ends(framing: str) -> None:
    """A 1 MB header block from a client with prior knowledge: one HEADERS frame past the 16 kB
    frame size (refused when its frame header is read, FRAME_SIZE_ERROR), or a HEADERS frame and
    CONTINUATION frames of 16 kB (refused past the header list size). Either way a GOAWAY, then
    the end of the connection, without a reset. (Encoded without Huffman coding: hpack's Python
    encoder takes about a minute over a megabyte, which is the client's time, not the server's.)"""
    headers = [(":method", "POST"), (":path", "/mcp/h2"), (":scheme", "http"), (":authority", "x")]
    block = hpack.Encoder().encode([*headers, ("x-big", "a" * 1_000_000)], huffman=False)
    if framing == "one frame":
        frames = _frame(0x1, 0x5, 1, block)  # HEADERS, END_STREAM | END_HEADERS
        code = h2.errors.ErrorCodes.FRAME_SIZE_ERROR
    else:
        parts = [block[i : i + 16384] for i in range(0, len(block), 16384)]
        frames = _frame(0x1, 0x1, 1, parts[0])  # HEADERS, END_STREAM
        for index, part in enumerate(parts[1:], 1):
            frames += _frame(0x9, 0x4 if index == len(parts) - 1 else 0, 1, part)  # CONTINUATION
        code = h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    empty_settings = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    async with listening(Recorder()) as (server, port):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        conn.initiate_connection()
        conn.data_to_send()  # what h2 would send: the preface is written by hand below
        received = b""
        async with stream:
            with trio.fail_after(30):
                await stream.send_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + empty_settings + frames)
                while data := await stream.receive_some(65536):
                    received += data
        events = conn.receive_data(received)
        ended = [event for event in events if isinstance(event, h2.events.ConnectionTerminated)]
        assert ended and ended[0].error_code == code, events
        assert server.handed_over == 1
