"""The worker process: one upstream, reached by the frontend over a DEALER socket."""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp_types as types
import msgspec
import trio
import zmq

from mcpvisor.runtime import telemetry
from mcpvisor.runtime.replies import PendingReplies
from mcpvisor.store.oauth_store import ACCOUNT_EVENT, CALLBACK_METHOD, LOGIN_METHOD, LOGIN_METHODS, LOGOUT_METHOD
from mcpvisor.wire import codec
from mcpvisor.wire.errors import ErrorCode, WireError
from mcpvisor.wire.inbox import serve_messages
from mcpvisor.wire.messages import (
    Answer,
    Ask,
    Cancel,
    Command,
    ControlMessage,
    Failure,
    Heartbeat,
    Notify,
    Reply,
    Report,
    Request,
    Response,
    Snapshot,
    SnapshotRequest,
)
from mcpvisor.wire.states import UpstreamState
from mcpvisor.wire.worker_spec import WorkerSpec
from mcpvisor.wire.zsocket import ZSocket
from mcpvisor.workers import call_spans
from mcpvisor.workers.oauth import LoginError
from mcpvisor.workers.oauth_login import CallbackParams, LoginDesk
from mcpvisor.workers.upstream import ClientHooks, StartupFailed, Upstream

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL = 1.0


class Worker:
    """Executes the requests the frontend routes to this worker's upstream."""

    def __init__(self, spec: WorkerSpec, sock: ZSocket, control: ZSocket | None = None) -> None:
        self.spec = spec
        self.sock = sock
        self.control = control
        self.upstream = Upstream(
            spec.id,
            spec.server,
            Path(spec.log_dir),
            self._catalog_changed,
            WorkerHooks(self),
            sandbox=spec.sandbox,
            state_url=spec.state_url,
        )
        self._inflight: dict[int, _Call] = {}
        self._asks: PendingReplies[int, tuple[Answer, bytes | None]] = PendingReplies()
        self._ask_ids = itertools.count(1)
        self._draining = False
        self._drained = trio.Event()
        self._changed = trio.Event()
        self._nursery: trio.Nursery | None = None
        # Wakes _serve_deadlines no later than the soonest deadline of a call without a task.
        self._deadlines = trio.CancelScope()
        self._max_inflight = spec.server.policy.max_inflight
        self._call_timeout = spec.server.call_timeout(spec.call_timeout)
        auth = self.upstream.auth
        self.logins = None
        if auth is not None:
            self.logins = LoginDesk(spec.id, auth, self._logged_in, self.upstream.login_failed)

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    def current_call(self) -> int:
        """The call a server-initiated message most likely belongs to: the newest in flight.

        Over stdio nothing ties an upstream's request or log line to the call that caused it; with
        one call in flight (the common case) this is exact.
        """
        return next(reversed(self._inflight), 0)

    async def drain(self) -> None:
        """Refuse new calls and wait for the ones in flight to finish."""
        self._draining = True
        if self._inflight:
            await self._drained.wait()

    def _catalog_changed(self) -> None:
        self._changed.set()

    def _snapshot(self) -> list[bytes]:
        up = self.upstream
        msg = Snapshot(
            pid=os.getpid(),
            catalog_seq=up.catalog_seq,
            state=up.state,
            error=up.error,
            server_name=up.server_name,
            initialize=up.initialize_result,
            login=up.awaiting_login,
        )
        return codec.calls.encode(msg, up.catalog)

    async def serve(self) -> None:
        """Run until cancelled; raises StartupFailed when the upstream cannot be started."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._serve_deadlines)
            nursery.start_soon(self._serve_upstream, nursery)
            nursery.start_soon(self.upstream.serve_rediscovery)
            nursery.start_soon(self._serve_announcements)
            if self.control is not None:
                nursery.start_soon(self._serve_control, self.control, nursery)
            await self._serve_requests(nursery)

    async def _serve_upstream(self, nursery: trio.Nursery) -> None:
        try:
            await self.upstream.serve()
        except StartupFailed as exc:
            log.error("upstream could not be started: %s", exc)
            self._report(fatal=str(exc))
            await trio.sleep(0.05)  # let the report leave before the process does
            raise

    def _report(self, fatal: str = "") -> None:
        """Tell the supervisor we are alive and how the upstream is; dropped if it cannot go now."""
        if self.control is None:
            return
        up = self.upstream
        tools = up.tool_count if up.state is UpstreamState.READY else 0
        report = Report(
            name=f"worker:{self.spec.id}",
            pid=os.getpid(),
            upstream_state=up.state,
            tools=tools,
            error=up.error,
            fatal=fatal,
            discoveries=up.discoveries,
            connect_seconds=up.connect_seconds,
            waiting=up.waiting_for_secret and up.state is UpstreamState.ERROR,
            spans_dropped=telemetry.active.spans_dropped if telemetry.active is not None else 0,
        )
        self.control.send_multipart_nowait(codec.control.encode(report))

    async def _serve_announcements(self) -> None:
        """Push the catalog when it changes; heartbeat so a restarted frontend can ask for it."""
        while True:
            self._report()
            with trio.move_on_after(HEARTBEAT_INTERVAL):
                await self._changed.wait()
            if self._changed.is_set():
                self._changed = trio.Event()
                await self.sock.send_multipart(self._snapshot())
            else:
                up = self.upstream
                beat = Heartbeat(pid=os.getpid(), catalog_seq=up.catalog_seq, state=up.state)
                # A heartbeat is worth nothing late: drop it rather than queue behind a full pipe.
                self.sock.send_multipart_nowait(codec.calls.encode(beat))

    async def _serve_requests(self, nursery: trio.Nursery) -> None:
        while True:
            for frames in await self.sock.receive_batch():
                try:
                    msg, payload = codec.calls.decode(frames)
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    log.error("dropping an undecodable message from the frontend: %s", exc)
                    continue
                match msg:
                    case Request(method=method) if method in LOGIN_METHODS:
                        nursery.start_soon(self._account_request, msg, payload, nursery)
                    case Request():
                        if self._draining:
                            await self._fail(
                                msg.id, ErrorCode.SERVER_UNAVAILABLE, f"server '{self.spec.id}' is stopping"
                            )
                            continue
                        if len(self._inflight) >= self._max_inflight:
                            await self._fail(msg.id, ErrorCode.BUSY, self._busy_message())
                            continue
                        payload, span = call_spans.begin(self.upstream, msg, payload)
                        if not self._start_direct(msg, payload, span):
                            call = self._inflight[msg.id] = _Call(self._timeout_for(msg), msg.activity_id, span=span)
                            nursery.start_soon(self._run_request, msg, payload, call)
                    case Cancel():
                        if (call := self._inflight.get(msg.id)) is not None:
                            call.cancelled = True
                            call_spans.end(call, None)
                            if call.scope is not None:
                                call.scope.cancel()
                            else:
                                self._end_direct(msg.id, call)
                                log.debug("request %d cancelled by the frontend [request id %s]", msg.id, call.activity)
                    case SnapshotRequest():
                        await self.sock.send_multipart(self._snapshot())
                    case Answer():
                        self._asks.deliver(msg.id, (msg, payload))
                    case _:
                        log.error("unexpected message from the frontend: %s", type(msg).__name__)

    # -- OAuth: the supervisor's login commands, the frontend's redirects ----------------------------

    async def _serve_control(self, control: ZSocket, nursery: trio.Nursery) -> None:
        """Commands the supervisor sends this worker on an operator's behalf (`ctl login`, `ctl logout`)."""

        async def handle(_envelope: list[bytes], msg: ControlMessage, _payload: bytes | None) -> None:
            if isinstance(msg, Command):
                nursery.start_soon(self._run_command, control, msg, nursery)

        await serve_messages(control, codec.control, handle, what="control command")

    async def _run_command(self, control: ZSocket, cmd: Command, nursery: trio.Nursery) -> None:
        try:
            result = await self._command(cmd, nursery)
            reply = Reply(id=cmd.id, ok=True, result=result)
        except LoginError as exc:
            reply = Reply(id=cmd.id, ok=False, error=f"{self.spec.id}: {exc}", exit_code=1)
        await control.send_multipart(codec.control.encode(reply))

    async def _command(self, cmd: Command, nursery: trio.Nursery) -> dict[str, Any]:
        logins = self.logins
        if logins is None:
            raise LoginError("this server is not a remote server that mcpvisor logs in to")
        if cmd.name == "oauth_login":
            redirect_uri = cmd.data.get("redirect_uri") if isinstance(cmd.data, dict) else None
            if not isinstance(redirect_uri, str):
                raise LoginError("oauth_login needs a redirect_uri")
            return await logins.start(redirect_uri, nursery)
        if cmd.name == "oauth_logout":
            return await self._log_out(by="operator")
        raise LoginError(f"unknown worker command {cmd.name[:40]!r}")

    async def _log_out(self, *, by: str) -> dict[str, Any]:
        auth = self.upstream.auth
        connected = auth is not None and auth.has_tokens
        if self.logins is not None:
            self.logins.cancel()
        await self.upstream.logged_out()
        self._account_event("logout", by, connected=connected)
        return {"name": self.spec.id, "connected": connected}

    def _logged_in(self) -> None:
        self.upstream.logged_in()
        self._account_event("login", "operator" if not self.logins or not self.logins.binding else "tenant")

    def _account_event(self, event: str, by: str, **extra: Any) -> None:
        """Tell the frontend an account was connected or disconnected, for the activity log (never a token)."""
        params = _json_encode({"event": event, "by": by, **extra})
        self._send_soon(codec.calls.encode(Notify(method=ACCOUNT_EVENT), params))

    async def _account_request(self, msg: Request, payload: bytes | None, nursery: trio.Nursery) -> None:
        """The frontend's login requests: a redirect, a tenant's own login or logout."""
        if msg.method == CALLBACK_METHOD:
            try:
                params = _callback.decode(payload or b"{}")
            except (msgspec.DecodeError, msgspec.ValidationError):
                await self._fail(msg.id, ErrorCode.BAD_REQUEST, "the redirect's parameters are malformed")
                return
            answer = {"mine": False} if self.logins is None else await self.logins.callback(params)
        elif self.logins is None or not self.upstream.self_login:
            # Only a tenant's own account is its to connect or disconnect; a shared one is the operator's.
            await self._fail(msg.id, ErrorCode.FORBIDDEN, f"server '{self.upstream.server_label}': ask the operator")
            return
        elif msg.method == LOGIN_METHOD:
            try:
                request = _login_request.decode(payload or b"{}")
                answer = await self.logins.start(
                    request.redirect_uri, nursery, binding=request.binding, link_ttl=request.link_ttl
                )
            except (msgspec.DecodeError, msgspec.ValidationError):
                await self._fail(msg.id, ErrorCode.BAD_REQUEST, "malformed login request")
                return
            except LoginError as exc:
                await self._fail(msg.id, ErrorCode.SERVER_UNAVAILABLE, f"the login cannot start: {exc}")
                return
        else:
            assert msg.method == LOGOUT_METHOD
            answer = await self._log_out(by="tenant")
        await self.sock.send_multipart(codec.calls.encode(Response(id=msg.id), _json_encode(answer)))

    def _busy_message(self) -> str:
        return (
            f"server '{self.spec.id}' already has {self._max_inflight} calls in flight;"
            " retry shortly or raise policy.max_inflight"
        )

    async def _fail(self, request_id: int, code: ErrorCode, message: str, mcp_code: int | None = None) -> None:
        failure = Failure(id=request_id, code=code, message=message, mcp_code=mcp_code)
        await self.sock.send_multipart(codec.calls.encode(failure))

    def _timeout_message(self, timeout: float) -> str:
        return f"no answer from server '{self.spec.id}' within {timeout:g}s"

    def _timeout_for(self, msg: Request) -> float:
        return self.spec.server.call_timeout(self.spec.call_timeout, msg.timeout)

    # -- calls without a task: pass-through requests on a stdio upstream ---------------------------

    def _start_direct(self, msg: Request, payload: bytes | None, span: call_spans.CallSpan | None = None) -> bool:
        """Start a pass-through call on a stdio upstream with no task of its own; False if it cannot be.

        Such a call is a line written now and an entry in _inflight: the reader of the upstream's
        stdout sends its answer, a Cancel or _serve_deadlines ends it. This spares a task, its
        cancel scope and the scheduler turns that waking it costs; a call that cannot be written
        at once (a long line, a full pipe) or is not a pass-through goes by _run_request instead.
        """
        request_id = msg.id
        call = _Call(self._timeout_for(msg), msg.activity_id, direct=True, span=span)

        def finish(outcome: bytes | WireError) -> None:
            if self._inflight.get(request_id) is not call:
                return
            self._end(request_id)
            call_spans.end(call, outcome)
            if isinstance(outcome, WireError):
                message = Failure(id=request_id, code=outcome.code, message=outcome.message, mcp_code=outcome.mcp_code)
                self._send_soon(codec.calls.encode(message))
            else:
                self._send_soon(codec.calls.encode(Response(id=request_id), outcome))

        abandon = self.upstream.start_raw(msg.method, payload, finish)
        if abandon is None:
            return False
        self._inflight[request_id] = call  # nothing ran since the write: finish cannot have come yet
        call.abandon = abandon
        call.deadline = trio.current_time() + call.timeout
        if call.deadline < self._deadlines.deadline:
            self._deadlines.deadline = call.deadline
        if msg.activity_id:
            log.debug("request %d (%s) started [request id %s]", msg.id, msg.method, msg.activity_id)
        return True

    def _end(self, request_id: int) -> None:
        self._inflight.pop(request_id, None)
        if self._draining and not self._inflight:
            self._drained.set()

    def _end_direct(self, request_id: int, call: _Call) -> None:
        """End a call without a task before its answer: the upstream is told, any answer dropped."""
        self._end(request_id)
        if call.abandon is not None:
            call.abandon()

    def _send_soon(self, frames: list[bytes]) -> None:
        """Send now, or from a task of its own when the frontend's pipe is full; never raises."""
        try:
            if self.sock.send_multipart_nowait(frames):
                return
        except (trio.ClosedResourceError, zmq.ZMQError):
            return  # the worker is closing: nobody is left to tell
        if self._nursery is not None:
            with contextlib.suppress(RuntimeError):  # the nursery is closing, as above
                self._nursery.start_soon(self._send_later, frames)

    async def _send_later(self, frames: list[bytes]) -> None:
        with contextlib.suppress(trio.ClosedResourceError):
            await self.sock.send_multipart(frames)

    async def _serve_deadlines(self) -> None:
        """Time out the calls without a task once they reach their deadline, which progress renews."""
        while True:
            with self._deadlines:
                await trio.sleep_forever()
            self._deadlines = trio.CancelScope()
            now = trio.current_time()
            soonest = math.inf
            for request_id, call in list(self._inflight.items()):
                if call.abandon is None:
                    continue
                if call.deadline > now:
                    soonest = min(soonest, call.deadline)
                    continue
                self._end_direct(request_id, call)
                message = self._timeout_message(call.timeout)
                call_spans.end(call, WireError(ErrorCode.TIMEOUT, message))
                self._send_soon(codec.calls.encode(Failure(id=request_id, code=ErrorCode.TIMEOUT, message=message)))
            self._deadlines.deadline = soonest

    # -- calls with a task -----------------------------------------------------------------------

    async def _run_request(self, msg: Request, payload: bytes | None, call: _Call) -> None:
        timeout = call.timeout
        if msg.activity_id:
            log.debug("request %d (%s) started [request id %s]", msg.id, msg.method, msg.activity_id)
        try:
            # One scope serves both ends of a call: the frontend's Cancel and the deadline (which
            # progress pushes out); call.cancelled tells them apart.
            scope = call.scope
            assert scope is not None
            scope.deadline = trio.current_time() + timeout
            with scope:
                result = await self.upstream.request(msg.method, payload, timeout, msg.id)
                call_spans.end(call, result)
                frames = codec.calls.encode(Response(id=msg.id), result)
                # The answer is the call's last act: no need to pass through the scheduler to send
                # it, unless the frontend's pipe is full.
                if not self.sock.send_multipart_nowait(frames):
                    await self.sock.send_multipart(frames)
                return
            if scope.cancelled_caught:
                if call.cancelled:
                    log.debug("request %d cancelled by the frontend [request id %s]", msg.id, msg.activity_id)
                else:
                    raise WireError(ErrorCode.TIMEOUT, self._timeout_message(timeout))
        except WireError as exc:
            call_spans.end(call, exc)
            await self._fail(msg.id, exc.code, exc.message, exc.mcp_code)
        except Exception:  # one broken request must not take the worker down; the log has the detail
            log.exception(
                "request %d (%s) failed inside the worker [request id %s]", msg.id, msg.method, msg.activity_id
            )
            call_spans.end(call, WireError(ErrorCode.INTERNAL, "internal error in the worker"))
            await self._fail(msg.id, ErrorCode.INTERNAL, f"internal error in the worker for '{self.spec.id}'")
        finally:
            call_spans.end(call, None)  # the worker itself is stopping, or the frontend gave up on it
            self._end(msg.id)


class _Call:
    """A call in flight and the timeout its deadline is renewed by.

    A call with a task has the scope that bounds it; one without (see Worker._start_direct) has
    its deadline and the function that abandons it upstream.
    """

    __slots__ = ("abandon", "activity", "cancelled", "deadline", "scope", "span", "timeout")

    def __init__(
        self, timeout: float, activity: str, *, direct: bool = False, span: call_spans.CallSpan | None = None
    ) -> None:
        self.scope = None if direct else trio.CancelScope()
        self.timeout = timeout
        self.activity = activity
        self.cancelled = False  # by the frontend's Cancel, not by the deadline
        self.deadline = math.inf
        self.abandon: Callable[[], None] | None = None
        self.span = span  # the call's span while telemetry is on (see call_spans)


class WorkerHooks(ClientHooks):
    """Pass the upstream's notifications and client requests on to the frontend."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    async def notification(self, method: str, params: bytes) -> None:
        worker = self.worker
        request_id = 0
        if method == ACCOUNT_EVENT:
            return  # mcpvisor's own event: an upstream cannot write the activity log's logins
        if method == "notifications/progress":
            try:
                token = _progress.decode(params).progressToken
            except (msgspec.DecodeError, msgspec.ValidationError):
                token = None
            if isinstance(token, int) and (call := worker._inflight.get(token)) is not None:
                request_id = token
                # Progress is life: it pushes the call's deadline out again.
                if call.scope is not None:
                    call.scope.deadline = trio.current_time() + call.timeout
                else:
                    call.deadline = trio.current_time() + call.timeout  # _serve_deadlines reads it
        elif method == "notifications/message":
            request_id = worker.current_call()
        await worker.sock.send_multipart(codec.calls.encode(Notify(id=request_id, method=method), params))

    async def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any] | types.ErrorData:
        """Forward a server-to-client request to the client whose call is in flight, and wait."""
        worker = self.worker
        call_id = worker.current_call()
        if call_id == 0 and method == "roots/list":
            # Asked outside any call (servers often ask right after initialize): no client's roots
            # apply to all of them, so the honest answer is none.
            return {"roots": []}
        if call_id == 0:
            return types.ErrorData(
                code=types.INVALID_REQUEST, message=f"{method}: no client call is in progress to answer it"
            )
        ask_id = next(worker._ask_ids)
        with worker._asks.expect(ask_id) as slot:
            await worker.sock.send_multipart(
                codec.calls.encode(Ask(id=ask_id, call_id=call_id, method=method), _json_encode(params))
            )
            try:
                answer, payload = await slot.wait(worker._call_timeout)
            except trio.TooSlowError:
                return types.ErrorData(
                    code=types.INTERNAL_ERROR, message=f"{method}: the client did not answer in time"
                )
        if not answer.ok:
            return types.ErrorData(code=answer.code or types.INTERNAL_ERROR, message=answer.message)
        try:
            return _result_decoder.decode(payload or b"{}")
        except msgspec.DecodeError:
            return types.ErrorData(code=types.INTERNAL_ERROR, message=f"{method}: undecodable answer")


class _ProgressParams(msgspec.Struct):
    progressToken: int | str | None = None


_progress = msgspec.json.Decoder(_ProgressParams)


class _LoginRequest(msgspec.Struct, kw_only=True):
    redirect_uri: str  # mcpvisor's /oauth/callback, from the operator's settings
    binding: str  # the hash of the cookie the tenant's login link sets
    link_ttl: float = 0.0  # how long that link can be opened (login_link_ttl)


_callback = msgspec.json.Decoder(CallbackParams)
_login_request = msgspec.json.Decoder(_LoginRequest)
_result_decoder = msgspec.json.Decoder(dict[str, Any])
_json_encode = msgspec.json.encode


@asynccontextmanager
async def open_worker(spec: WorkerSpec) -> AsyncIterator[Worker]:
    """A Worker with its sockets connected; closes them on exit."""
    ctx = zmq.Context()
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.IDENTITY, spec.id.encode())
    raw.connect(spec.calls_endpoint)
    sock = ZSocket(raw)
    control = None
    if spec.control_endpoint:
        control_raw = ctx.socket(zmq.DEALER)
        control_raw.connect(spec.control_endpoint)
        control = ZSocket(control_raw)
    try:
        yield Worker(spec, sock, control)
    finally:
        sock.close()
        if control is not None:
            control.close()
        ctx.term()
