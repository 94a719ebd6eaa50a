"""The frontend's listener behind a real HAProxy: the two agree on where every request ends.

Each classic request-smuggling shape is sent raw to HAProxy, which stamps every request it
forwards with an X-Request-ID and logs it. Given the shipped HAProxy config in front of the
listener, when a shape arrives, then every request the app receives carries a stamp of its own
that HAProxy logged (a request hidden in another's body would carry none), HAProxy logs no
request that the app did not receive, the listener never refuses what HAProxy forwarded, and the
next client gets its own answer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from tests.support.haproxy import HAProxy, open_haproxy
from tests.unit.test_http_server import Recorder, listening

SMUGGLED = b"POST /mcp/smuggled HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"

SHAPES = {
    "cl-te": (
        b"POST /mcp/a HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n%b"
        % (5 + len(SMUGGLED), SMUGGLED)
    ),
    "te-cl": (
        b"POST /mcp/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n"
        b"%x\r\n%b\r\n0\r\n\r\n" % (len(SMUGGLED), SMUGGLED)
    ),
    "te-cl-obfuscated": (
        b"POST /mcp/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\nContent-Length: 4\r\n\r\n"
        b"%x\r\n%b\r\n0\r\n\r\n" % (len(SMUGGLED), SMUGGLED)
    ),
    "te-space-before-colon": (
        b"POST /mcp/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\nContent-Length: 4\r\n\r\n"
        b"%x\r\n%b\r\n0\r\n\r\n" % (len(SMUGGLED), SMUGGLED)
    ),
    "te-tab": (
        b"POST /mcp/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\tchunked\r\nContent-Length: 4\r\n\r\n"
        b"%x\r\n%b\r\n0\r\n\r\n" % (len(SMUGGLED), SMUGGLED)
    ),
    "te-list": (
        b"POST /mcp/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity, chunked\r\nContent-Length: 4\r\n\r\n"
        b"%x\r\n%b\r\n0\r\n\r\n" % (len(SMUGGLED), SMUGGLED)
    ),
    "te-folded": (
        b"POST /mcp/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\r\n chunked\r\nContent-Length: 4\r\n\r\n"
        b"%x\r\n%b\r\n0\r\n\r\n" % (len(SMUGGLED), SMUGGLED)
    ),
    "two-lengths": b"POST /mcp/a HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: %d\r\n\r\n%b"
    % (len(SMUGGLED), SMUGGLED),
    "same-two-lengths": b"POST /mcp/a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}"
    + SMUGGLED,
    "length-list": b"POST /mcp/a HTTP/1.1\r\nHost: x\r\nContent-Length: 2, 2\r\n\r\n{}" + SMUGGLED,
    "length-plus": b"POST /mcp/a HTTP/1.1\r\nHost: x\r\nContent-Length: +2\r\n\r\n{}" + SMUGGLED,
    "obs-fold": b"POST /mcp/a HTTP/1.1\r\nHost: x\r\nX-Long: a\r\n b\r\nContent-Length: 2\r\n\r\n{}" + SMUGGLED,
    "bare-lf-head": b"POST /mcp/a HTTP/1.1\nHost: x\nContent-Length: 2\n\n{}" + SMUGGLED,
    "bare-lf-one-header": b"POST /mcp/a HTTP/1.1\r\nHost: x\nContent-Length: 2\r\n\r\n{}" + SMUGGLED,
    "bare-cr": b"POST /mcp/a HTTP/1.1\r\nHost: x\r\nX: a\rContent-Length: 40\r\nContent-Length: 2\r\n\r\n{}" + SMUGGLED,
    "chunk-size-bare-lf": (
        b"POST /mcp/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\n{}\r\n0\r\n\r\n" + SMUGGLED
    ),
    "chunk-extension-lf": (
        b"POST /mcp/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2;a\nb\r\n{}\r\n0\r\n\r\n" + SMUGGLED
    ),
    "chunk-size-overflow": (
        b"POST /mcp/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"10000000000000002\r\n{}\r\n0\r\n\r\n" + SMUGGLED
    ),
    "get-with-length": b"GET /mcp/a HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%b" % (len(SMUGGLED), SMUGGLED),
    "http-1.0-keep-alive": b"POST /mcp/a HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n{}" + SMUGGLED,
    "pipelined-plain": b"POST /mcp/a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}" + SMUGGLED,
}


async def _exchange(port: int, data: bytes) -> bytes:
    """Send `data` on one connection and read what comes back until the proxy ends it or goes quiet."""
    answer = b""
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(data)
        while True:
            with trio.move_on_after(0.5 if answer else 10):
                chunk = await stream.receive_some(65536)
                if not chunk:
                    break
                answer += chunk
                continue
            break  # quiet: the connection is kept alive for more
    return answer


async def _victim(port: int) -> None:
    """The next client, on a connection of its own: its answer must be for its own request."""
    answer = await _exchange(
        port, b"POST /mcp/victim HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
    )
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), answer
    assert json.loads(body)["path"] == "/mcp/victim"


def _received(app: Recorder) -> list[dict[str, bytes]]:
    """What the app received, health checks left out."""
    return [
        {name.decode(): value for name, value in seen["scope"]["headers"]} | {"path": seen["path"].encode()}
        for seen in app.seen
        if seen["path"] != "/healthz"
    ]


async def _agree(proxy: HAProxy, app: Recorder) -> None:
    """Every request the app saw was one HAProxy logged with its own id, and the other way round."""
    with trio.move_on_after(5):
        while True:  # HAProxy logs a request once it is answered: wait for the last line
            forwarded = {line.request_id for line in proxy.log() if line.server != "<NOSRV>"}
            stamps = [request.get("x-request-id", b"").decode() for request in _received(app)]
            if set(stamps) <= forwarded and len(forwarded) == len(stamps):
                break
            await trio.sleep(0.05)
    received = _received(app)
    stamps = [request.get("x-request-id") for request in received]
    assert None not in stamps, f"a request reached the app without passing HAProxy: {received}"
    assert len(set(stamps)) == len(stamps), "two requests reached the app under one HAProxy request"
    forwarded = {line.request_id for line in proxy.log() if line.server != "<NOSRV>"}
    assert {stamp.decode() for stamp in stamps if stamp} == forwarded


@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
async def test_haproxy_and_the_listener_agree_on_every_request_boundary(tmp_path: Path, shape: bytes) -> None:
    app = Recorder()
    async with listening(app) as (_, port), open_haproxy(tmp_path, {"replica1": port}) as proxy:
        answer = await _exchange(proxy.port, shape)
        # The listener never refuses what HAProxy forwarded: either HAProxy refused the shape
        # itself or both read it the same way.
        assert b"bad request: " not in answer, answer
        await _victim(proxy.port)
        await _agree(proxy, app)
        # The shape and what follows it: answered by the app, or refused by HAProxy itself.
        statuses = [line.split(b" ")[1] for line in answer.split(b"\r\n") if line.startswith(b"HTTP/1.")]
        assert statuses and all(status == b"200" or status[:1] in b"45" for status in statuses), answer
