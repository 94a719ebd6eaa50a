"""Where each request on a connection ends, as llhttp (Node.js's HTTP parser, through httptools) reads it.

Every byte a client sends goes through one strict llhttp parser before anything acts on it, on
the listener's own path and after the connection is handed to hypercorn alike. A proxy in front
(HAProxy, nginx, an ingress) and mcpvisor must agree on where every request ends, or a request
hidden in another's body reaches the app unseen by the proxy (request smuggling). llhttp without
leniencies refuses the shapes that make parsers disagree: Content-Length with Transfer-Encoding,
two Content-Lengths, obsolete line folding, bare LF line ends, white space before a colon, a
Transfer-Encoding that does not end in `chunked`, control characters in a value. What it refuses
never reaches the app or hypercorn: the connection ends after the requests before it.

Requests this listener serves itself ("plain": a POST to an MCP path, HTTP/1.1, a Host, a
Content-Length within the body limit, nothing asking for more) are collected with their body;
the first one that is not plain marks where hypercorn takes over the connection.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Final

import httptools

# A plain request's target; anything else (percent-encoding included) is hypercorn's to serve.
_TARGET: Final = re.compile(rb"/mcp[!$&'()*+,\-./0-9:;=?@A-Z_a-z~]*")
# Request headers that ask for something only hypercorn does (or refuses properly).
_HANDED_OVER: Final = frozenset({b"transfer-encoding", b"expect", b"upgrade", b"http2-settings"})
_HEAD_END: Final = b"\r\n\r\n"
# How an HTTP/2 client with prior knowledge (h2c) begins: llhttp stops there, and hypercorn serves
# HTTP/2, refusals of an oversized header block included (GOAWAY or RST_STREAM, not a 400 in HTTP/1.1).
_H2_PREFACE: Final = b"PRI * HTTP/2.0\r\n"


class Plain:
    """A whole plain request: target, headers (names lower-cased), body, and whether the
    connection ends after its answer; `size` is how many bytes of the connection it took."""

    __slots__ = ("body", "close", "headers", "length", "size", "target")

    def __init__(self, target: bytes, headers: list[tuple[bytes, bytes]], length: int, close: bool) -> None:
        self.target = target
        self.headers = headers
        self.length = length
        self.close = close
        self.body = b""
        self.size = 0


class RequestReader:
    """Feeds llhttp a connection's bytes; collects the plain requests and where hypercorn's part begins."""

    def __init__(self, max_body: int, max_head: int) -> None:
        self._parser = httptools.HttpRequestParser(self)
        self.max_body = max_body
        self.max_head = max_head
        # Bytes accepted and not yet taken as a plain request; once `hand_over` is set, from the
        # first byte of the first request that is not plain.
        self.buffer = bytearray()
        self.ready: deque[Plain] = deque()
        self.hand_over = False  # a request that is not plain was read: it and the rest are hypercorn's
        self.refused: str | None = None  # why llhttp refused what followed the requests read
        self.upgraded = False  # the bytes after an upgrade request are another protocol's
        self._keep = True  # until hypercorn has taken the buffer
        self._offset = 0  # where in `buffer` the request being read begins
        self._in_head = False
        self._target = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_size = 0  # about the head's length: its target, names and values, and their separators
        self._current: Plain | None = None

    def feed(self, data: bytes) -> bool:
        """Read `data` (what the connection received next); False once llhttp refused something."""
        if self.refused is not None:
            return False
        if self._keep:
            self.buffer += data  # before parsing: a request completed now is sliced from it
        if self.upgraded:
            return True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # As a proxy does once it sees one: what follows is the upgraded protocol's (h2c).
            self.upgraded = True
        except httptools.HttpParserError as exc:
            if self._h2_preface():
                self.hand_over = self.upgraded = True  # what follows is HTTP/2 frames, hypercorn's
                self._in_head = False
                return True
            self.refused = str(exc) or "malformed request"
            return False
        return True

    def _h2_preface(self) -> bool:
        """Whether the request llhttp stopped at is HTTP/2's connection preface."""
        start = self._offset
        buffer = self.buffer
        while start < len(buffer) and buffer[start] in b"\r\n":
            start += 1  # llhttp skips empty lines before a request; so does hypercorn
        return buffer.startswith(_H2_PREFACE, start)

    def head_too_long(self) -> bool:
        """Whether the bytes held outside a request's body have grown past the head limit (hypercorn
        refuses them). Counted from the end of the last request, not from the first byte llhttp
        took as a request's: it skips empty lines before a request unseen, as many as are sent."""
        return not self.hand_over and self._current is None and len(self.buffer) - self._offset > self.max_head

    def pending_head(self) -> bool:
        """Whether part of a request has been received and not all of its head."""
        return self._in_head

    def take(self) -> Plain:
        """The next whole plain request, its bytes dropped from the buffer."""
        request = self.ready.popleft()
        del self.buffer[: request.size]
        self._offset -= request.size
        return request

    def release(self) -> bytes:
        """The bytes hypercorn starts from; later ones are only checked here, then passed on."""
        data = bytes(self.buffer)
        self.buffer = bytearray()
        self._keep = False
        return data

    # llhttp's callbacks, in the order it calls them for each request.

    def on_message_begin(self) -> None:
        self._in_head = True
        self._target = b""
        self._headers = []
        self._head_size = 0
        self._current = None

    def on_url(self, url: bytes) -> None:
        self._target += url
        self._head_size += len(url) + 16

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value.strip(b" \t")))
        self._head_size += len(name) + len(value) + 4

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self.hand_over:
            return
        parser = self._parser
        length = -1
        has_host = False
        for name, value in self._headers:
            if name == b"content-length":
                length = int(value)  # llhttp admits one, digits only
            elif name == b"host":
                has_host = True
            elif name in _HANDED_OVER:
                length = -1
                break
        if (
            length < 0
            or self._head_size > self.max_head
            or length > self.max_body
            or not has_host
            or parser.get_method() != b"POST"
            or parser.get_http_version() != "1.1"
            or parser.should_upgrade()
            or _TARGET.fullmatch(self._target) is None
        ):
            self.hand_over = True
            return
        self._current = Plain(self._target, self._headers, length, not parser.should_keep_alive())

    def on_message_complete(self) -> None:
        request = self._current
        if request is None:
            return
        self._current = None
        buffer = self.buffer
        start = self._offset
        # llhttp skips empty lines before a request; past them, the head llhttp has just accepted
        # holds no bare CR or LF, so the first blank line ends it.
        while buffer[start] in b"\r\n":
            start += 1
        end = buffer.find(_HEAD_END, start) + len(_HEAD_END)
        request.body = bytes(buffer[end : end + request.length])
        request.size = end + request.length - self._offset
        self._offset += request.size
        self.ready.append(request)
