"""The I/O around the MCP engine: one endpoint's HTTP requests read, handled and answered on trio.

Each request is given to the engine (engine.py); what it returns is acted on here: an answer
sent, a handler run (`handlers.served`: `dispatch` in the request's span) with its progress, log
lines and questions written on the request's own SSE stream, a session's GET stream held open, a
cancellation or a client's answer delivered to the call waiting for it. A client that goes away
cancels what it asked.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import Any, Final

import msgspec
import trio

from mcpvisor.frontend.door.calls import AskFailed
from mcpvisor.frontend.endpoints import rpc
from mcpvisor.frontend.endpoints.auth import Principal, principal_of
from mcpvisor.frontend.endpoints.engine import (
    PING,
    Accepted,
    Answered,
    Call,
    Cancelled,
    EndSession,
    Engine,
    Exchange,
    Headers,
    HttpRequest,
    OpenStream,
    Reply,
    ended_reply,
    event,
    stream_head,
)
from mcpvisor.frontend.endpoints.handlers import Context, Table, served
from mcpvisor.frontend.endpoints.http_server import DISCONNECT_KEY, Receive, Scope, Send
from mcpvisor.frontend.endpoints.notices import Notices
from mcpvisor.frontend.endpoints.rpc import RpcError
from mcpvisor.frontend.endpoints.sessions import Session

log = logging.getLogger(__name__)


KEEPALIVE: Final = 15.0  # seconds between SSE comments on a quiet stream (and before a 2026-07-28 answer turns to SSE)
WATCH_AFTER: Final = 0.1  # seconds a call runs before its client's connection is watched for going away
IDLE_CHECK: Final = 60.0  # seconds between looks for idle sessions


def owner_of(principal: Principal | None) -> str:
    """Who a session belongs to: the credential (tenant, token) that opened it."""
    if principal is None:
        return ""
    return f"{principal.tenant or ''}\x00{principal.token_id}\x00{principal.subject}"


async def send_reply(send: Send, reply: Reply) -> None:
    headers = [*reply.headers, (b"content-length", str(len(reply.body)).encode())]
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": reply.body})


async def read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks)


async def _until_disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class _Waiter:
    """A question put to a handshake-era client, until its answer comes on another POST."""

    __slots__ = ("answer", "done")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.answer: Answered | None = None


class _Answer:
    """One call's answer on the wire: JSON at the end, or an SSE stream once something streams."""

    def __init__(self, exchange: Exchange, send: Send) -> None:
        self.exchange = exchange
        self._send = send
        self._lock = trio.Lock()
        self.closed = False  # the client is gone, or the answer was written
        self.begun = self.last_output = trio.current_time()
        # What cancels the call when its client goes away, and the listener's way to watch for that
        # (set until the watch has begun).
        self.gone: trio.CancelScope | None = None
        self.watch: Callable[[trio.CancelScope], None] | None = None

    async def _start_stream(self) -> None:
        status, headers = self.exchange.head()
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def start(self) -> None:
        """Answer on an SSE stream, now: its head goes out before the handler runs."""
        async with self._lock:
            if not self.closed and not self.exchange.streaming:
                await self._start_stream()

    async def event(self, message: bytes) -> None:
        """A message before the answer: the answer becomes an SSE stream if it was not one yet."""
        await self._stream(event(message))

    async def ping(self) -> None:
        """A keep-alive comment, which also turns the answer into an SSE stream."""
        await self._stream(PING)

    async def _stream(self, body: bytes) -> None:
        async with self._lock:
            if self.closed:
                return
            if not self.exchange.streaming:
                await self._start_stream()
            self.last_output = trio.current_time()
            await self._send({"type": "http.response.body", "body": body, "more_body": True})

    async def finish(self, message: bytes, error_code: int | None = None) -> None:
        async with self._lock:
            if self.closed:
                return
            self.closed = True
            if self.exchange.streaming:
                body = self.exchange.answer_event(message)
                await self._send({"type": "http.response.body", "body": body, "more_body": False})
            else:
                await send_reply(self._send, self.exchange.json(message, error_code=error_code))


class _Outbox:
    """A handler's way to the client (handlers.Outbox), on this call's answer."""

    def __init__(self, endpoint: McpEndpoint, call: Call, answer: _Answer) -> None:
        self.endpoint = endpoint
        self.call = call
        self.answer = answer

    async def send(self, message: bytes) -> None:
        await self.answer.event(message)

    async def request(self, method: str, params: dict[str, Any]) -> bytes:
        session = self.call.session
        if session is None or self.answer.closed:
            raise AskFailed(rpc.INVALID_REQUEST, f"the client has no channel for {method}")
        return await self.endpoint.ask(session, self.answer, method, params)

    async def tell(self, method: str, params: dict[str, Any] | None) -> None:
        if self.call.session is not None:
            self.endpoint.notices.tell(self.call.session, method, params)


class McpEndpoint:
    """Serves one endpoint (a `Table`) of one stack over HTTP, in both eras."""

    def __init__(self, table: Table, engine: Engine, notices: Notices, *, tenant: str = "") -> None:
        self.table = table
        self.engine = engine
        self.notices = notices
        self.tenant = tenant
        self.sessions = engine.sessions
        self._running: dict[tuple[str, rpc.RequestId], trio.CancelScope] = {}
        self._asks: dict[tuple[str, rpc.RequestId], _Waiter] = {}
        self._ask_ids = itertools.count(1)
        self._answering: set[_Answer] = set()  # the answers being written, for the keep-alive

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """End idle sessions and tell clients of list changes, until cancelled."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.notices.serve)
            nursery.start_soon(self._keep_alive)
            task_status.started()
            while True:
                await trio.sleep(IDLE_CHECK)
                for session in self.sessions.idle():
                    log.info("session %s idle for %gs: ended", session.id, self.sessions.idle_timeout)
                    await self.end(session)

    async def end(self, session: Session) -> None:
        """End a session: its stream closes, its calls and questions are cancelled, its subscriptions end."""
        self.sessions.end(session)
        self.notices.close_stream(session)
        for (session_id, _), scope in list(self._running.items()):
            if session_id == session.id:
                scope.cancel()
        for (session_id, _), waiter in list(self._asks.items()):
            if session_id == session.id:
                waiter.done.set()
        with trio.CancelScope(shield=True):
            await self.notices.forget(session)
            for callback in self.table.on_session_end:
                await callback(session)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await read_body(receive) if scope["method"] == "POST" else b""
        request = HttpRequest(scope["method"], Headers(scope["headers"]), body, owner_of(principal_of(scope)))
        inbound = self.engine.receive(request)
        match inbound:
            case Reply():
                await send_reply(send, inbound)
            case Call():
                await self._serve_call(inbound, scope, receive, send)
            case Accepted():
                await send_reply(send, inbound.reply)
                self._apply(inbound.effect)
            case OpenStream():
                await self._serve_stream(inbound.session, receive, send)
            case EndSession():
                await self.end(inbound.session)
                await send_reply(send, ended_reply(inbound.session))

    def _apply(self, effect: Cancelled | Answered | None) -> None:
        match effect:
            case Cancelled():
                scope = self._running.get((effect.session.id, effect.request_id))
                if scope is not None:
                    scope.cancel()
            case Answered():
                waiter = self._asks.get((effect.session.id, effect.request_id))
                if waiter is not None:
                    waiter.answer = effect
                    waiter.done.set()

    async def ask(self, session: Session, answer: _Answer, method: str, params: dict[str, Any]) -> bytes:
        """Put a request to a handshake-era client on a call's stream; its answer comes on a POST."""
        request_id = next(self._ask_ids)
        waiter = self._asks[session.id, request_id] = _Waiter()
        try:
            await answer.event(rpc.request_message(request_id, method, msgspec.json.encode(params)))
            await waiter.done.wait()
        finally:
            del self._asks[session.id, request_id]
        answered = waiter.answer
        if answered is None:
            raise AskFailed(rpc.CONNECTION_CLOSED, f"the client's session ended before it answered {method}")
        if answered.error is not None:
            raise AskFailed(answered.error.code, answered.error.message)
        return bytes(answered.result) if answered.result is not None else b"{}"

    async def _serve_call(self, call: Call, scope: Scope, receive: Receive, send: Send) -> None:
        exchange = Exchange(call)
        answer = _Answer(exchange, send)
        context = Context(call, self.table, _Outbox(self, call, answer), tenant=self.tenant, carried={})
        session = call.session
        if session is not None:
            self.sessions.begin(session)
        try:
            if call.stream:
                await answer.start()
            watch = scope.get("extensions", {}).get(DISCONNECT_KEY)
            if watch is not None:
                # The listener cancels the call if its client goes away: watched from the keep-alive
                # round on (most calls are answered before it), so a quick call costs no watch.
                with trio.CancelScope() as answer.gone:
                    answer.watch = watch
                    self._answering.add(answer)
                    await self._run(context, answer)
                if answer.gone.cancelled_caught:
                    answer.closed = True
            else:
                self._answering.add(answer)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._watch_client, receive, answer, nursery.cancel_scope)
                    await self._run(context, answer)
                    nursery.cancel_scope.cancel()
        finally:
            self._answering.discard(answer)
            if session is not None:
                self.sessions.finish(session)

    async def _run(self, context: Context, answer: _Answer) -> None:
        call = context.call
        if call.session is None:
            try:
                message, code = rpc.result_message(call.id, await served(context)), None
            except RpcError as error:
                message, code = rpc.error_message(call.id, error), error.code
            await answer.finish(message, code)
            return
        # A handshake-era client may cancel it with notifications/cancelled on another POST.
        key = (call.session.id, call.id)
        with trio.CancelScope() as cancel:
            self._running[key] = cancel
            try:
                message, code = rpc.result_message(call.id, await served(context)), None
            except RpcError as error:
                message, code = rpc.error_message(call.id, error), error.code
            finally:
                if self._running.get(key) is cancel:
                    del self._running[key]
        if cancel.cancelled_caught:
            # The client cancelled it (handshake era): the stream ends with the answer for that. It
            # is a stream even if nothing was streamed yet, as the SDK's server answers: a client
            # that gave up may be closing meanwhile, and clients drop a late event, not a late body.
            error = RpcError(rpc.REQUEST_CANCELLED, "Request cancelled")
            message, code = rpc.error_message(call.id, error), error.code
            await answer.start()
        if call.opens_session and code is not None and call.session is not None:
            await self.end(call.session)
        await answer.finish(message, code)

    async def _watch_client(self, receive: Receive, answer: _Answer, scope: trio.CancelScope) -> None:
        """A client that leaves before its answer gives up on it: its handler is cancelled."""
        await _until_disconnected(receive)
        answer.closed = True
        scope.cancel()

    async def _keep_alive(self) -> None:
        """Look after the answers still being written, a few times a second: watch for their client
        going away once they take a while, and comment on those quiet for the keep-alive interval,
        so a proxy in front does not close them for idleness (a 2026-07-28 answer turns into a
        stream then)."""
        while True:
            await trio.sleep(WATCH_AFTER)
            now = trio.current_time()
            for answer in list(self._answering):
                if answer.watch is not None and answer.gone is not None and now - answer.begun >= WATCH_AFTER:
                    answer.watch(answer.gone)
                    answer.watch = None
                if answer.last_output <= now - KEEPALIVE and not answer.closed:
                    await answer.ping()

    async def _serve_stream(self, session: Session, receive: Receive, send: Send) -> None:
        """A session's GET stream: what the server says unasked, until the client closes it."""
        notices = self.notices.open_stream(session)
        self.sessions.begin(session)
        try:
            status, headers = stream_head(session)
            await send({"type": "http.response.start", "status": status, "headers": headers})
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_when_gone, receive, nursery.cancel_scope)
                while True:
                    message: bytes | None = None
                    with trio.move_on_after(KEEPALIVE):
                        try:
                            message = await notices.receive()
                        except trio.EndOfChannel:
                            break
                    body = PING if message is None else event(message)
                    await send({"type": "http.response.body", "body": body, "more_body": True})
                nursery.cancel_scope.cancel()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self.notices.close_stream(session)
            self.sessions.finish(session)


async def _cancel_when_gone(receive: Receive, scope: trio.CancelScope) -> None:
    await _until_disconnected(receive)
    scope.cancel()
