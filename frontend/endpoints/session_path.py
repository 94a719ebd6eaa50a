"""The short way for handshake-era clients: `tools/call` and lists on sessions the SDK created.

A 2025-06-18 or 2025-11-25 client sends each request on its `Mcp-Session-Id`, and the SDK's
session server answers it on an SSE stream after a trip through its message loop, its models and
its middleware: about 2 ms of CPU per call, more than the rest of the chain. When nothing can
stream during a request (no progress token, a client that declared none of sampling,
elicitation and roots, no log level set on the session), the answer is one JSON message, which
this module gives directly: the envelope decoded with msgspec, the upstream's result forwarded as
its bytes, list pages served from `Listing`s. The call still goes through `Upstreams.call_tool`
(the gate, the audit record).

An endpoint's own tools that need nothing of the SDK (`retrieve_tools` on `/mcp`) are answered by
their handler, the result shaped as the SDK's server shapes it for the session's version.

The SDK keeps everything else: `initialize` (sessions exist only once it created them), the GET
stream, DELETE, notifications, server-to-client requests, management tools, a session it does not
know or has ended (its 404), a bad cursor, anything malformed or unusual. A request falls through
before anything of it was acted on, with its body replayed.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
import trio
from mcp.server import Server
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, authorization_context
from mcp.server.connection import Connection
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from mcpvisor.frontend.door.calls import Caller
from mcpvisor.frontend.door.forwarding import ENVELOPE_PREFIX
from mcpvisor.frontend.door.upstreams import NotFound, Refused, UpstreamError, Upstreams
from mcpvisor.frontend.endpoints.clients import connection_of
from mcpvisor.frontend.endpoints.fastpath import (
    CallParams,
    ListParams,
    LocalTool,
    Receive,
    Scope,
    Send,
    _BadResult,
    admitted,
    read_body,
    shaped_result,
)
from mcpvisor.frontend.endpoints.listings import Listing
from mcpvisor.frontend.endpoints.rpc import RpcError
from mcpvisor.frontend.gate.activity import trace_context
from mcpvisor.wire.errors import INTERNAL_ERROR

_ASKABLE = ("sampling", "elicitation", "roots")
_JSON = frozenset({"application/json", "application/*", "*/*"})
_SSE = frozenset({"text/event-stream", "text/*", "*/*"})
_encode = msgspec.json.encode


class _Request(msgspec.Struct, forbid_unknown_fields=True):
    jsonrpc: str
    id: int | str
    method: str
    params: msgspec.Raw = msgspec.Raw(b"")  # empty when absent; decoded by method


class _CancelParams(msgspec.Struct):
    requestId: int | str


class _Cancel(msgspec.Struct):
    method: str
    params: _CancelParams


_decode_request = msgspec.json.Decoder(_Request)
_decode_cancel = msgspec.json.Decoder(_Cancel)
_decode_call = msgspec.json.Decoder(CallParams)
_decode_list = msgspec.json.Decoder(ListParams)
_decode_arguments = msgspec.json.Decoder(dict[str, Any])


class Sessions:
    """Server middleware that notes each handshake-era session's connection as the SDK serves it.

    The short path needs what `initialize` declared (the client's capabilities) and whether the
    client asked for logs; the SDK keeps both on the connection, which it does not expose by
    session id.
    """

    def __init__(self) -> None:
        self._connections: weakref.WeakValueDictionary[str, Connection] = weakref.WeakValueDictionary()
        self._logging: weakref.WeakSet[Connection] = weakref.WeakSet()

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        connection = connection_of(ctx)
        if connection is not None and connection.session_id is not None:
            self._connections[connection.session_id] = connection
            if ctx.method == "logging/setLevel":
                self._logging.add(connection)
        return await call_next(ctx)

    def client_name(self, session_id: str) -> str:
        """The name the session's client gave in its initialize, for the activity log."""
        connection = self._connections.get(session_id)
        params = connection.client_params if connection is not None else None
        name = params.client_info.name if params is not None and params.client_info is not None else ""
        return name if isinstance(name, str) else ""

    def quiet(self, session_id: str) -> str | None:
        """The session's protocol version when it is initialized and nothing can stream to it
        during a request; else None."""
        connection = self._connections.get(session_id)
        if connection is None or not connection.initialize_accepted or connection in self._logging:
            return None
        capabilities = connection.client_capabilities
        if capabilities is not None and any(getattr(capabilities, name, None) is not None for name in _ASKABLE):
            return None
        return connection.protocol_version


class SessionPath:
    """Answers what it can on the SDK's sessions of one endpoint; returns False for the rest."""

    def __init__(
        self,
        upstreams: Upstreams,
        manager: StreamableHTTPSessionManager,
        sessions: Sessions,
        listings: Mapping[str, Listing],
        *,
        sdk_tools: frozenset[str],
        max_body: int,
        allowed_hosts: list[str] | None,
        allowed_origins: list[str] | None,
        local_tools: Mapping[str, LocalTool] | None = None,
        upstream_tools: bool = True,
    ) -> None:
        self.upstreams = upstreams
        self.manager = manager
        self.sessions = sessions
        self.listings = listings
        self.sdk_tools = sdk_tools  # tools the endpoint's own handlers serve (they need the SDK's context)
        self.local_tools: Mapping[str, LocalTool] = local_tools or {}
        self.upstream_tools = upstream_tools  # other names are upstream tools (else the SDK's)
        self.max_body = max_body
        self.allowed_hosts = allowed_hosts
        self.allowed_origins = allowed_origins
        # Calls answered here and still running, by session and request id: a client cancels one
        # with a notification on another POST.
        self._running: dict[tuple[str, int | str], trio.CancelScope] = {}

    def _transport(self, scope: Scope) -> tuple[str, StreamableHTTPServerTransport, str] | None:
        """The session's id, transport and protocol version when the request may take the short way."""
        if scope["method"] != "POST":
            return None
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        session_id = headers.get("mcp-session-id")
        if not session_id or headers.get("mcp-protocol-version") not in HANDSHAKE_PROTOCOL_VERSIONS:
            return None
        if headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return None
        accepted = {part.split(";")[0].strip().lower() for part in headers.get("accept", "").split(",")}
        # The SDK's transport streams answers: it wants a client that takes both.
        if not (_JSON & accepted and _SSE & accepted):
            return None
        if not admitted(headers, self.max_body, self.allowed_hosts, self.allowed_origins):
            return None
        # Sessions are the SDK's: one it does not know, has ended, or that belongs to another
        # credential gets its answer from it.
        transport = self.manager._server_instances.get(session_id)
        if transport is None or transport.is_terminated:
            return None
        if transport.idle_scope is not None and transport.idle_scope.cancel_called:
            return None
        user = scope.get("user")
        requestor = authorization_context(user) if isinstance(user, AuthenticatedUser) else None
        if requestor != self.manager._session_owners.get(session_id):
            return None
        version = self.sessions.quiet(session_id)
        if version is None or version not in HANDSHAKE_PROTOCOL_VERSIONS:
            return None
        return session_id, transport, version

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> tuple[bool, bytes]:
        """(answered, body read): when not answered, the body must be replayed to the SDK."""
        found = self._transport(scope)
        if found is None:
            return False, b""
        session_id, transport, version = found
        complete, body = await read_body(receive, self.max_body)
        if not complete:
            return False, body
        try:
            request = _decode_request.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError):
            self._cancel(session_id, body)
            return False, body  # the SDK answers every notification, a cancel included
        if request.jsonrpc != "2.0":
            return False, body
        with _in_flight(transport):
            if request.method == "tools/call":
                with trio.CancelScope() as scope:
                    key = (session_id, request.id)
                    self._running[key] = scope
                    try:
                        message = await self._call(request, version, self.sessions.client_name(session_id))
                    finally:
                        del self._running[key]
                if scope.cancelled_caught:
                    # As on the SDK's path, a cancelled request gets no answer: its stream just ends.
                    await _respond(send, 200, b"", b"text/event-stream", session_id)
                    return True, body
            elif request.method in self.listings:
                message = self._list(request, version)
            else:
                message = None
        if message is None:
            return False, body
        await _respond(send, 200, message, b"application/json", session_id)
        return True, body

    def _cancel(self, session_id: str, body: bytes) -> None:
        """A `notifications/cancelled` for a call running here cancels it."""
        if b"notifications/cancelled" not in body:
            return
        try:
            notice = _decode_cancel.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return
        scope = self._running.get((session_id, notice.params.requestId))
        if notice.method == "notifications/cancelled" and scope is not None:
            scope.cancel()

    def _list(self, request: _Request, version: str) -> bytes | None:
        try:
            params = _decode_list.decode(request.params) if request.params else ListParams()
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        if "progressToken" in params._meta:
            return None
        try:
            result = self.listings[request.method].result(params.cursor, version)
        except RpcError:
            return None  # the SDK's path explains a bad cursor
        return b'{"jsonrpc":"2.0","id":' + _encode(request.id) + b',"result":' + result + b"}"

    async def _call(self, request: _Request, version: str, client: str = "") -> bytes | None:
        if not request.params:
            return None
        try:
            params = _decode_call.decode(request.params)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        if "progressToken" in params._meta or params.name in self.sdk_tools:
            return None
        if bytes(params.arguments).lstrip()[:1] != b"{":
            return None  # the SDK explains arguments that are not an object
        head = b'{"jsonrpc":"2.0","id":' + _encode(request.id) + b","
        local = self.local_tools.get(params.name)
        if local is not None:
            shaped = shaped_result(version, await local(_decode_arguments.decode(params.arguments)))
            if shaped is None:
                error = {"code": INTERNAL_ERROR, "message": "Internal error: the tool's result could not be sent"}
                return head + b'"error":' + _encode(error) + b"}"
            return head + b'"result":' + _encode(shaped) + b"}"
        if not self.upstream_tools:
            return None
        try:
            target = self.upstreams.find_tool(params.name)
        except NotFound as exc:
            return head + b'"error":' + _encode({"code": exc.code, "message": exc.message}) + b"}"
        forwarded: dict[str, Any] = {"name": target.tool, "arguments": params.arguments}
        meta = {key: value for key, value in params._meta.items() if not key.startswith(ENVELOPE_PREFIX)}
        if meta:
            forwarded["_meta"] = meta
        try:
            parent, state = trace_context(params._meta, {})
            caller = Caller(client=client, endpoint="/mcp/direct", traceparent=parent, tracestate=state)
            raw = await self.upstreams.call_tool(target, forwarded, via="direct", caller=caller)
            assert isinstance(raw, bytes)  # only a client's call can be carried over rounds
            return head + b'"result":' + _result(raw) + b"}"
        except Refused as refused:
            return head + b'"result":' + _encode(refused.answer) + b"}"
        except UpstreamError as exc:
            return head + b'"error":' + _encode({"code": exc.code, "message": exc.message}) + b"}"
        except _BadResult as exc:
            error = {"code": INTERNAL_ERROR, "message": f"Tool '{params.name}': server '{target.server}' {exc}"}
            return head + b'"error":' + _encode(error) + b"}"


@dataclass
class Shortcuts:
    """What an endpoint's short paths share with its SDK server (see `ShortPaths`)."""

    listings: Mapping[str, Listing]
    sessions: Sessions
    sdk_tools: frozenset[str] = frozenset()  # names the SDK's server answers (they need its context)
    local_tools: Mapping[str, LocalTool] = field(default_factory=dict)  # answered by their handler here
    upstream_tools: bool = True  # any other name is an upstream tool; else the SDK's server answers it


class ShortPaths:
    """One endpoint's short paths: `FastPath` for 2026-07-28 requests, `SessionPath` on sessions."""

    def __init__(
        self,
        upstreams: Upstreams,
        manager: StreamableHTTPSessionManager,
        server: Server[Any],
        shortcuts: Shortcuts,
        *,
        max_body: int,
        allowed_hosts: list[str] | None,
        allowed_origins: list[str] | None,
    ) -> None:
        self.sessions = SessionPath(
            upstreams,
            manager,
            shortcuts.sessions,
            shortcuts.listings,
            sdk_tools=shortcuts.sdk_tools,
            max_body=max_body,
            allowed_hosts=allowed_hosts,
            allowed_origins=allowed_origins,
            local_tools=shortcuts.local_tools,
            upstream_tools=shortcuts.upstream_tools,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> tuple[bool, bytes]:
        """(answered, body read): when not answered, the body must be replayed to the SDK."""
        # A request that names no session opens one: the SDK's server answers it.
        if not any(name == b"mcp-session-id" for name, _ in scope["headers"]):
            return False, b""
        return await self.sessions(scope, receive, send)


async def _respond(send: Send, status: int, body: bytes, content_type: bytes, session_id: str) -> None:
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        (b"mcp-session-id", session_id.encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# The top-level fields of a tools/call result a handshake-era client gets: the SDK's server drops
# any other (`resultType` included), and keeps these as the upstream wrote them (unsieved.py).
_RESULT_FIELDS = frozenset({"content", "structuredContent", "isError", "_meta"})
_decode_fields = msgspec.json.Decoder(dict[str, msgspec.Raw])


def _result(raw: bytes) -> bytes:
    """An upstream's tools/call result as a handshake-era client gets it: as it came, less fields
    its protocol has not got."""
    try:
        fields = _decode_fields.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise _BadResult("sent a tools/call result that is not valid JSON") from None
    if "content" not in fields or bytes(fields["content"]).lstrip()[:1] != b"[":
        raise _BadResult("sent a tools/call result without content")
    if fields.keys() <= _RESULT_FIELDS:
        return raw.strip()
    return _encode({key: value for key, value in fields.items() if key in _RESULT_FIELDS})


class _in_flight:
    """Holds the session open while a request is served, as the SDK's transport does for its own.

    The transport ends a session once no request has been in flight for its idle timeout; the
    requests answered here never reach it, so they suspend and restart that countdown the same way.
    """

    def __init__(self, transport: StreamableHTTPServerTransport) -> None:
        self.transport = transport

    def __enter__(self) -> None:
        if self.transport.idle_scope is not None and self.transport._idle_timeout is not None:
            self.transport._requests_in_flight += 1
            self.transport.idle_scope.deadline = math.inf

    def __exit__(self, *exc: object) -> None:
        transport = self.transport
        if transport.idle_scope is not None and transport._idle_timeout is not None:
            transport._requests_in_flight -= 1
            if not transport._requests_in_flight:
                transport.idle_scope.deadline = anyio.current_time() + transport._idle_timeout
