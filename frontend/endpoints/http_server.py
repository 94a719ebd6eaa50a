"""The frontend's HTTP/1.1 listener: plain MCP POSTs read and answered here, the rest by hypercorn.

Most of what clients send is a short POST to an MCP endpoint with a `Content-Length` body, and
most answers are one JSON document. hypercorn serves each through h11's state machine, a task
per request, a keep-alive timer task stopped and restarted around it and a send lock: about
three quarters of the frontend's CPU for a listing page answered from cached bytes. Here such a
request is read by llhttp (http_reader.py), given to the same ASGI app with the whole body, and
its answer written with one `send`.

A connection starts here and stays here while its requests are plain; the first one that is not
(another method, another path, chunked or `Expect` bodies, upgrades, a head or body past the
limits) hands the connection, with every byte not yet served, to hypercorn, which serves the rest
of it exactly as it serves connections it accepted itself, its errors included; llhttp still reads
every byte before hypercorn does. What llhttp refuses is answered 400 here and ends the
connection. Answers stream as hypercorn streams them: without a `content-length`, chunked, each
part written as the app sends it. A `receive` after the body waits for the client to go away
(`http.disconnect`), which the SDK's streamed answers listen for.
"""

from __future__ import annotations

import contextlib
import email.utils
import functools
import http
import logging
import re
import time
from collections.abc import Awaitable, Callable
from math import inf
from typing import Any, Final

import trio
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.config import Config
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import parse_socket_addr, repr_socket_addr

from mcpvisor.frontend.endpoints.http_reader import Plain, RequestReader

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_RECV: Final = 2**16
MAX_HEAD: Final = 16 * 1024  # h11's limit on a request's head: past it, hypercorn refuses it
LINGER: Final = 2.0  # seconds a closing connection still reads (and drops) what the client sends
_ASGI: Final = {"spec_version": "2.1", "version": "3.0"}
# A dict in the scope of every request read here, the same for all requests of one connection: what
# holds for the whole connection (its peer's uid) is found out once (frontend/endpoints/boundary.py).
CONNECTION_KEY: Final = "mcpvisor.connection"
# In the `extensions` of every request read here: `watch(cancel_scope)` cancels the scope if the
# client goes away before the answer is written (an app need not call `receive` in a task of its own).
DISCONNECT_KEY: Final = "mcpvisor.cancel_on_disconnect"
_NO_BODY_STATUS: Final = frozenset({204, 304})
_UNSAFE: Final = re.compile(rb"[\x00\r\n]")


# What the next request is when it is not one to serve here.
_HAND_OVER: Final = "hand over"  # hypercorn serves it and the rest of the connection
_REFUSED: Final = "refused"  # llhttp refused it: answered 400, and the connection ends


class _Date:
    """The `date` header's value, formatted once a second."""

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def __call__(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._value = email.utils.formatdate(now, usegmt=True).encode()
        return self._value


_date = _Date()


async def linger_close(stream: trio.SocketStream) -> None:
    """End a connection without resetting it: FIN, then what the client still sends is read and
    dropped for a moment, then close.

    Closing a socket that holds unread bytes makes the kernel answer with a reset, which can
    destroy the last answer (a GOAWAY, a 400, a `Connection: close` reply) before the client
    read it: the client then sees a reset where the protocol promised an answer.
    """
    errors = (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError, OSError)
    with trio.CancelScope(shield=True), trio.move_on_after(LINGER), contextlib.suppress(*errors):
        await stream.send_eof()
        while await stream.receive_some(MAX_RECV):
            pass
    with contextlib.suppress(OSError):
        await stream.aclose()


class _Replayed(trio.abc.HalfCloseableStream):
    """A connection whose first bytes were already read here: they come first, then the socket's,
    each checked by llhttp before hypercorn reads it.

    hypercorn's close lingers (`linger_close`), after waking a read of its own in progress.
    """

    def __init__(self, stream: trio.SocketStream, reader: RequestReader) -> None:
        self.stream = stream
        self.socket = stream.socket  # hypercorn reads the addresses from it
        self._reader = reader
        self._pending = reader.release()
        self._closed = False
        self._reading: trio.CancelScope | None = None

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._closed:
            raise trio.ClosedResourceError
        if self._pending:
            size = len(self._pending) if max_bytes is None else max_bytes
            data, self._pending = self._pending[:size], self._pending[size:]
            await trio.lowlevel.checkpoint()
            return data
        with trio.CancelScope() as self._reading:
            data = await self.stream.receive_some(max_bytes)
        self._reading = None
        if self._closed:
            raise trio.ClosedResourceError
        if data and not self._reader.feed(data):
            # llhttp refused these bytes: hypercorn never sees them, and the connection ends for it.
            log.debug("ending a connection: %s", self._reader.refused)
            return b""
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed:
            raise trio.ClosedResourceError
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        if not self._closed:
            await self.stream.send_eof()

    @property
    def closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        if self._reading is not None:
            self._reading.cancel()  # a read of hypercorn's other task: it ends, and only this one reads
        await linger_close(self.stream)


class _Request:
    """One request read here: its scope, its body, and how its answer is written back."""

    __slots__ = (
        "body",
        "chunked",
        "close",
        "connection",
        "delivered",
        "expected",
        "finished",
        "gone",
        "head_sent",
        "headers",
        "status",
        "written",
    )

    def __init__(self, connection: _Connection, body: bytes, close: bool) -> None:
        self.connection = connection
        self.body = body
        self.close = close  # the client asked for `Connection: close`, or the answer must end it
        self.delivered = False
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] | None = None
        self.head_sent = False
        self.chunked = False
        self.expected: int | None = None  # the answer's content-length
        self.written = 0
        self.finished = False
        self.gone = False  # the client went away

    async def receive(self) -> dict[str, Any]:
        if not self.delivered:
            self.delivered = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        if not self.gone:
            await self.connection.wait_gone()
        self.gone = True
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self.headers is not None:
                raise RuntimeError("the response has already started")
            self.status = int(message["status"])
            self.headers = [(bytes(name).lower(), bytes(value)) for name, value in message.get("headers", ())]
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unexpected ASGI message {kind!r}")
        if self.headers is None:
            raise RuntimeError("a response body was sent before the response started")
        if self.finished or self.gone:
            return  # as hypercorn does: once the client is gone, what the app sends is dropped
        body = bytes(message.get("body", b""))
        more = bool(message.get("more_body", False))
        data = b"" if self.head_sent else self._head()
        self.written += len(body)
        if self.chunked:
            if body:
                data += b"%x\r\n%b\r\n" % (len(body), body)
            if not more:
                data += b"0\r\n\r\n"
        elif self.status not in _NO_BODY_STATUS:
            data += body
        if self.expected is not None and self.written > self.expected:
            raise RuntimeError("the response body is longer than its content-length")
        self.finished = not more
        if data:
            await self._write(data)

    def _head(self) -> bytes:
        assert self.headers is not None
        lines = [b"HTTP/1.1 %d %b\r\n" % (self.status, _reason(self.status))]
        has_connection = False
        for name, value in self.headers:
            if _UNSAFE.search(name) or _UNSAFE.search(value) or not name:
                raise RuntimeError("a response header holds a line break or a NUL")
            if name == b"content-length":
                if not value.isdigit():
                    raise RuntimeError("the response's content-length is not a number")
                self.expected = int(value)
            elif name == b"connection":
                has_connection = True
                self.close = self.close or b"close" in value.lower()
            elif name == b"transfer-encoding":
                raise RuntimeError("the app set transfer-encoding itself")
            lines.append(b"%b: %b\r\n" % (name, value))
        if self.expected is None and self.status not in _NO_BODY_STATUS:
            self.chunked = True
            lines.append(b"transfer-encoding: chunked\r\n")
        lines.append(b"date: %b\r\n" % _date())
        if self.close and not has_connection:
            lines.append(b"connection: close\r\n")
        lines.append(b"\r\n")
        self.head_sent = True  # only once it is whole: a bad header is answered with a 500 instead
        return b"".join(lines)

    async def _write(self, data: bytes) -> None:
        try:
            await self.connection.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.gone = True
            self.close = True

    async def fail(self) -> None:
        """After the app failed or returned before its answer's end: a 500 if nothing was written
        yet, and the connection ends (an answer cut short cannot be framed)."""
        self.close = True
        if not self.head_sent and not self.gone:
            self.headers, self.status = [(b"content-length", b"0")], 500
            await self.send({"type": "http.response.body", "body": b""})


class _Connection:
    """One client connection, served here until a request must go to hypercorn."""

    def __init__(self, server: Http1Server, stream: trio.SocketStream) -> None:
        self.server = server
        self.stream = stream
        self.reader = RequestReader(server.max_body, MAX_HEAD)
        self._watch: trio.CancelScope | None = None
        self._watch_done: trio.Event | None = None
        self._gone = trio.Event()
        self._cancel_when_gone: list[trio.CancelScope] = []
        self._nursery: trio.Nursery | None = None

    async def run(self) -> None:
        socket = self.stream.socket
        try:
            client = parse_socket_addr(socket.family, socket.getpeername())
            local = parse_socket_addr(socket.family, socket.getsockname())
        except OSError:
            await self.stream.aclose()
            return
        handed_over = False
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    handed_over = await self._serve(client, local)  # else the client went away
                nursery.cancel_scope.cancel()
            if handed_over:
                await self.server.fallback(_Replayed(self.stream, self.reader))
        finally:
            if not handed_over:
                await linger_close(self.stream)

    async def _serve(self, client: Any, local: Any) -> bool:
        """Serve plain requests until the connection ends (False) or must be handed over (True)."""
        server = self.server
        served = 0
        facts: dict[str, Any] = {}
        while True:
            # The next request must arrive whole within the keep-alive timeout: an idle connection
            # ends, and so does one that sends its head or body too slowly to hold a slot forever.
            read: Plain | str | None = None
            with trio.move_on_after(server.keep_alive_timeout):
                read = await self._read_request()
            if read is None:
                return False
            if read is _HAND_OVER:
                return True
            if read is _REFUSED:
                await self._refuse()
                return False
            assert isinstance(read, Plain)
            path, _, query = read.target.partition(b"?")
            scope: Scope = {
                "type": "http",
                "http_version": "1.1",
                "asgi": _ASGI,
                "method": "POST",
                "scheme": "http",
                "path": path.decode("ascii"),
                "raw_path": path,
                "query_string": query,
                "root_path": "",
                "headers": read.headers,
                "client": client,
                "server": local,
                "state": {},
                "extensions": {DISCONNECT_KEY: self.cancel_on_disconnect},
                CONNECTION_KEY: facts,
            }
            served += 1
            # As hypercorn does: a connection ends after so many requests, the last answer says so.
            request = _Request(self, read.body, read.close or served >= server.max_requests)
            try:
                await server.app(scope, request.receive, request.send)
            except Exception:
                log.exception("error while answering POST %s", scope["path"])
            if not request.finished:
                await request.fail()
            if request.expected is not None and request.written != request.expected:
                request.close = True
            await self._stop_watching()
            if request.close or request.gone:
                return False

    async def _read_request(self) -> Plain | str | None:
        """The next plain request, _HAND_OVER or _REFUSED for one not served here, None at the connection's end."""
        reader = self.reader
        while True:
            if reader.ready:
                return reader.take()
            if reader.refused is not None:
                return _REFUSED
            if reader.hand_over or reader.head_too_long():
                return _HAND_OVER
            if not await self._fill():
                return None  # the client left, perhaps in the middle of a request

    async def _fill(self) -> bool:
        """Read more of the connection and give it to llhttp; False at its end."""
        data = await self.stream.receive_some(MAX_RECV)
        if not data:
            return False
        self.reader.feed(data)
        return True

    async def _refuse(self) -> None:
        """Answer what llhttp refused with a 400 saying why, and end the connection."""
        reason = (self.reader.refused or "malformed request").encode("ascii", "replace")
        body = b"bad request: %b\n" % _UNSAFE.sub(b" ", reason)
        head = b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n" % len(body)
        await self.stream.send_all(head + b"date: %b\r\nconnection: close\r\n\r\n%b" % (_date(), body))
        # Closing with unread bytes would reset the connection and could drop the answer.
        await self.stream.send_eof()
        with trio.move_on_after(1):
            while await self.stream.receive_some(MAX_RECV):
                pass

    async def wait_gone(self) -> None:
        """Until the client closes the connection (read from it meanwhile: pipelined requests are kept)."""
        self._watch_connection()
        await self._gone.wait()

    def cancel_on_disconnect(self, scope: trio.CancelScope) -> None:
        """Cancel `scope` if the client closes the connection while the current request is served."""
        if self._gone.is_set():
            scope.cancel()
            return
        self._cancel_when_gone.append(scope)
        self._watch_connection()

    def _watch_connection(self) -> None:
        if self._watch is None and not self._gone.is_set():
            assert self._nursery is not None
            self._watch = trio.CancelScope()
            self._watch_done = trio.Event()
            self._nursery.start_soon(self._watching, self._watch, self._watch_done)

    def _went(self) -> None:
        self._gone.set()
        for scope in self._cancel_when_gone:
            scope.cancel()
        self._cancel_when_gone.clear()

    async def _watching(self, scope: trio.CancelScope, done: trio.Event) -> None:
        try:
            with scope:
                while len(self.reader.buffer) <= MAX_HEAD + self.server.max_body and self.reader.refused is None:
                    if not await self._fill():
                        break
                else:
                    await trio.sleep_forever()  # enough is buffered; the request ends the wait
                self._went()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._went()
        finally:
            done.set()

    async def _stop_watching(self) -> None:
        self._cancel_when_gone.clear()
        if self._watch is not None and self._watch_done is not None:
            self._watch.cancel()
            await self._watch_done.wait()
            self._watch = self._watch_done = None


@functools.lru_cache(maxsize=64)
def _reason(status: int) -> bytes:
    try:
        return http.HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


class Http1Server:
    """Serves `app` on `config`'s binds: plain requests here, every other connection by hypercorn."""

    def __init__(
        self,
        app: ASGIApp,
        config: Config,
        *,
        max_body: int,
        on_connection: Callable[[], None] | None = None,
        on_handover: Callable[[], None] | None = None,
    ) -> None:
        self.app = app
        self.on_connection = on_connection  # each connection accepted (for metrics)
        self.on_handover = on_handover  # each one handed to hypercorn
        self.config = config
        self.max_body = max_body
        self.keep_alive_timeout = config.keep_alive_timeout or inf
        self.max_requests = config.keep_alive_max_requests
        self._context = WorkerContext(None)
        self._wrapped = ASGIWrapper(app)  # type: ignore[arg-type]
        self._state = ConnectionState({})
        self._accepting = trio.CancelScope()

    async def fallback(self, stream: trio.abc.Stream) -> None:
        """hypercorn's own HTTP/1.1 (and h2c) connection, from the bytes `stream` still holds."""
        if self.on_handover is not None:
            self.on_handover()
        try:
            await TCPServer(self._wrapped, self.config, self._context, self._state, stream)  # type: ignore[arg-type]
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()  # (once: a second close of a _Replayed is a no-op)

    async def serve(self, *, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on the config's binds and serve until cancelled; started() with the bound URLs."""
        sockets = self.config.create_sockets()
        listeners = []
        binds = []
        for sock in sockets.insecure_sockets:
            sock.listen(self.config.backlog)
            listeners.append(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))
            binds.append(f"http://{repr_socket_addr(sock.family, sock.getsockname())}")
        if sockets.secure_sockets or sockets.quic_sockets:
            raise ValueError("the frontend serves plain HTTP; TLS is for the proxy in front of it")
        try:
            async with trio.open_nursery() as connections:
                await connections.start(self._accept, listeners, connections)
                task_status.started(binds)
        finally:
            await self._context.terminated.set()

    async def _accept(
        self,
        listeners: list[trio.SocketListener],
        connections: trio.Nursery,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        with self._accepting:
            await trio.serve_listeners(
                self._connection, listeners, handler_nursery=connections, task_status=task_status
            )

    def stop_accepting(self) -> None:
        """Close the listening sockets; the connections open go on being served."""
        self._accepting.cancel()

    async def _connection(self, stream: trio.SocketStream) -> None:
        if self.on_connection is not None:
            self.on_connection()
        try:
            await _Connection(self, stream).run()
        except Exception:
            # One connection's failure must not end the listener (trio.serve_listeners would).
            log.exception("a client connection failed")
