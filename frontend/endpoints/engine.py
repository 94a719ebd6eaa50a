"""mcpvisor's MCP engine over streamable HTTP, without I/O (h11's shape).

`Engine.receive` takes one HTTP request (method, headers, body, who sent it) and returns what it
is: a `Reply` to send at once (a refusal, a notification's 202, a session's end), a `Call` for the
endpoint's handler, an `Accepted` client message whose effect the serving loop applies (a
cancellation, the answer to a question the server asked), or an `OpenStream` (a session's GET
stream). What goes out is formatted here too: an `Exchange` turns a handler's answer, its stream
events and its questions into JSON or SSE bytes for the client's era. The serving loop
(serving.py) is the I/O around it: it reads bodies, runs handlers, writes what this module makes.

Where the eras differ:
- handshake era (2024-11-05 .. 2025-11-25): `initialize` opens a session (`Mcp-Session-Id`); every
  later request names it; a GET opens its stream for what the server says unasked; DELETE ends
  it. Errors are JSON-RPC errors with HTTP 200. A request whose answer nothing can interrupt (no
  progress token, no log level, a client that declared nothing it could be asked) is answered
  with JSON, any other on an SSE stream carrying its progress, logs and questions.
- 2026-07-28: every POST stands alone, its envelope in `params._meta`, its routing headers
  (`MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name`, `Mcp-Param-*`) checked against the body;
  errors carry the HTTP status of their code; an answer turns into an SSE stream only when the
  handler says something before it ends (progress, a log line, the 15 s keep-alive).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec
from mcp.shared.inbound import decode_header_value, validate_mcp_param_headers, x_mcp_header_map
from msgspec import UNSET, Raw

from mcpvisor.frontend.endpoints import rpc
from mcpvisor.frontend.endpoints.eras import (
    CAPABILITIES_KEY,
    CLIENT_INFO_KEY,
    HANDSHAKE_VERSIONS,
    MODERN_VERSIONS,
    PROTOCOL_KEY,
    is_modern,
)
from mcpvisor.frontend.endpoints.rpc import RpcError
from mcpvisor.frontend.endpoints.sessions import Session, Sessions

SESSION_HEADER: Final = "mcp-session-id"
VERSION_HEADER: Final = "mcp-protocol-version"
METHOD_HEADER: Final = "mcp-method"
NAME_HEADER: Final = "mcp-name"
_ROUTING_HEADERS: Final = frozenset({VERSION_HEADER, METHOD_HEADER, NAME_HEADER})
_NAME_BEARING: Final = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}
_ASKABLE: Final = ("sampling", "elicitation", "roots")
_JSON = b"application/json"
_SSE_HEADERS: Final = (
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"connection", b"keep-alive"),
    (b"x-accel-buffering", b"no"),
)
PING: Final = b": ping\r\n\r\n"
_SCHEMAS_KEPT: Final = 50_000
_INVALID_BODY: Final = "Body must be a single JSON-RPC request or notification object"
_decode_any = msgspec.json.Decoder()


class Headers:
    """A request's headers: names lower-cased, values as text; a name sent twice keeps its last value."""

    __slots__ = ("_names", "values")

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self._names = [name.decode("latin-1").lower() for name, _ in raw]
        self.values = {name: value.decode("latin-1") for name, (_, value) in zip(self._names, raw, strict=True)}

    def get(self, name: str) -> str | None:
        return self.values.get(name)

    def repeated(self, names: frozenset[str]) -> str | None:
        """The first of `names` sent more than once, or None."""
        seen: set[str] = set()
        for name in self._names:
            if name in names:
                if name in seen:
                    return name
                seen.add(name)
        return None

    def accepts(self) -> tuple[bool, bool]:
        """(JSON, SSE): what the client takes, with RFC 7231 wildcards."""
        kinds = {part.split(";")[0].strip().lower() for part in self.values.get("accept", "").split(",")}
        anything = "*/*" in kinds
        return (
            anything or "application/json" in kinds or "application/*" in kinds,
            anything or "text/event-stream" in kinds or "text/*" in kinds,
        )


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """One HTTP request to an MCP endpoint: `owner` names the credential it came with."""

    method: str
    headers: Headers
    body: bytes
    owner: str = ""


@dataclass(frozen=True, slots=True)
class Reply:
    """An answer to send at once; nothing runs."""

    status: int
    body: bytes = b""
    headers: tuple[tuple[bytes, bytes], ...] = ()


@dataclass(slots=True)
class Call:
    """A JSON-RPC request for the endpoint's handler of `method`."""

    id: rpc.RequestId
    method: str
    params: dict[str, Raw]
    meta: dict[str, Any]
    version: str
    capabilities: dict[str, Any]
    client_info: dict[str, Any]
    headers: Headers
    session: Session | None = None
    owner: str = ""  # the credential it came with
    opens_session: bool = False  # an `initialize` without a session: it opens one if it succeeds
    stream: bool = False  # handshake era: answered on an SSE stream

    @property
    def modern(self) -> bool:
        return is_modern(self.version)

    @property
    def client_name(self) -> str:
        name = self.client_info.get("name")
        return name if isinstance(name, str) else ""

    @property
    def progress_token(self) -> str | int | None:
        token = self.meta.get("progressToken")
        return token if isinstance(token, str | int) and not isinstance(token, bool) else None

    def declares(self, capability: str) -> bool:
        return isinstance(self.capabilities.get(capability), dict)


@dataclass(frozen=True, slots=True)
class Cancelled:
    """The client gave up on request `request_id` of its session."""

    session: Session
    request_id: rpc.RequestId


@dataclass(frozen=True, slots=True)
class Answered:
    """The client answered the server's request `request_id` (on its session)."""

    session: Session
    request_id: rpc.RequestId
    result: Raw | None
    error: rpc.ErrorBody | None


@dataclass(frozen=True, slots=True)
class Accepted:
    """A notification or an answer: 202 at once, then its effect (if any) applied."""

    reply: Reply
    effect: Cancelled | Answered | None = None


@dataclass(frozen=True, slots=True)
class OpenStream:
    """A session's GET stream, for what the server says unasked."""

    session: Session


@dataclass(frozen=True, slots=True)
class EndSession:
    """DELETE: the client ends its session."""

    session: Session


Inbound = Reply | Call | Accepted | OpenStream | EndSession


@dataclass(frozen=True, slots=True)
class Security:
    """The Host and Origin values a listener accepts (DNS rebinding); None: any."""

    hosts: tuple[str, ...] | None = None
    origins: tuple[str, ...] | None = None

    @classmethod
    def loopback(cls) -> Security:
        return cls(
            hosts=("127.0.0.1:*", "localhost:*", "[::1]:*"),
            origins=("http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"),
        )

    def refusal(self, method: str, headers: Headers) -> Reply | None:
        if method == "POST" and not (headers.get("content-type") or "").lower().startswith("application/json"):
            return _text(400, "Invalid Content-Type header")
        if self.hosts is not None and not _matches(headers.get("host"), self.hosts):
            return _text(421, "Invalid Host header")
        origin = headers.get("origin")
        if origin and self.origins is not None and not _matches(origin, self.origins):
            return _text(403, "Invalid Origin header")
        return None


def _matches(value: str | None, patterns: tuple[str, ...]) -> bool:
    if not value:
        return False
    return any(value == p or (p.endswith(":*") and value.startswith(p[:-1])) for p in patterns)


def _text(status: int, text: str) -> Reply:
    return Reply(status, text.encode(), ((b"content-type", b"text/plain; charset=utf-8"),))


def _json_reply(status: int, body: bytes, session: Session | None = None) -> Reply:
    headers: tuple[tuple[bytes, bytes], ...] = ((b"content-type", _JSON),)
    if session is not None:
        headers += ((SESSION_HEADER.encode(), session.id.encode()),)
    return Reply(status, body, headers)


def _error_reply(status: int, code: int, message: str, session: Session | None = None) -> Reply:
    return _json_reply(status, rpc.error_message(None, RpcError(code, message)), session)


SESSION_NOT_FOUND: Final = _error_reply(404, rpc.INVALID_REQUEST, "Session not found")


class Engine:
    """Reads an endpoint's HTTP requests for both eras; keeps its handshake-era sessions."""

    def __init__(
        self,
        methods: Callable[[], frozenset[str]],
        *,
        security: Security = Security(),
        sessions: Sessions | None = None,
        input_schema: Callable[[str], Mapping[str, Any] | None] = lambda name: None,
    ) -> None:
        self.methods = methods  # the methods the endpoint's handlers serve (extensions included)
        self.security = security
        self.sessions = sessions if sessions is not None else Sessions()
        self.input_schema = input_schema  # a tool's input schema, for its Mcp-Param-* headers
        self._annotations: dict[int, tuple[Mapping[str, Any], bool]] = {}

    def receive(self, request: HttpRequest) -> Inbound:
        version = request.headers.get(VERSION_HEADER)
        if version is not None and version not in HANDSHAKE_VERSIONS:
            return self._modern(request, version)
        return self._handshake(request, version)

    # -- 2026-07-28 ----------------------------------------------------------------------------

    def _modern(self, request: HttpRequest, version_header: str) -> Inbound:
        headers = request.headers
        if (refused := self.security.refusal(request.method, headers)) is not None:
            return refused
        if request.method != "POST":
            return Reply(405, b"", ((b"allow", b"POST"),))
        takes_json, takes_sse = headers.accepts()
        if not (takes_json and takes_sse):
            return Reply(406)
        try:
            envelope = rpc.decode_envelope(request.body)
        except msgspec.ValidationError:  # (a DecodeError too): JSON, but not one message
            envelope = None
        except msgspec.DecodeError:
            return _json_reply(400, rpc.error_message(None, RpcError(rpc.PARSE_ERROR, "Parse error")))
        if envelope is None or not envelope.is_request:
            return self._modern_notification(request.body, envelope, version_header)
        if envelope.jsonrpc != "2.0":
            return _json_reply(400, rpc.error_message(None, RpcError(rpc.INVALID_REQUEST, _INVALID_BODY)))
        request_id: rpc.RequestId = envelope.id  # type: ignore[assignment]
        method: str = envelope.method  # type: ignore[assignment]
        params = envelope.members()

        def refuse(error: RpcError) -> Reply:
            return _json_reply(rpc.HTTP_STATUS.get(error.code, 200), rpc.error_message(request_id, error))

        if (repeated := headers.repeated(_ROUTING_HEADERS)) is not None:
            return refuse(RpcError(rpc.HEADER_MISMATCH, f"{repeated} header appears more than once"))
        try:
            meta, version, capabilities, info = _envelope(params, headers, method)
            if method == "tools/call":
                self._check_param_headers(params, headers)
        except RpcError as error:
            return refuse(error)
        return Call(request_id, method, params, meta, version, capabilities, info, headers, owner=request.owner)

    def _modern_notification(self, body: bytes, envelope: rpc.Envelope | None, version: str) -> Reply:
        """An id-less message is acknowledged and dropped (a 2026-07-28 client cancels by closing
        its stream); anything else that is not one request is refused."""
        if envelope is None or not envelope.is_notification or envelope.jsonrpc != "2.0":
            try:
                decoded = _decode_any.decode(body)
            except msgspec.DecodeError:
                decoded = None
            shaped = isinstance(decoded, dict) and "id" not in decoded and isinstance(decoded.get("method"), str)
            if not (shaped and decoded.get("jsonrpc") == "2.0" and isinstance(decoded.get("params", {}), dict | None)):
                return _json_reply(400, rpc.error_message(None, RpcError(rpc.INVALID_REQUEST, _INVALID_BODY)))
        if version not in MODERN_VERSIONS:
            return _json_reply(400, rpc.error_message(None, unsupported(version)))
        return Reply(202)

    def _check_param_headers(self, params: dict[str, Raw], headers: Headers) -> None:
        """A tools/call's `Mcp-Param-*` headers must agree with the arguments the tool's schema names."""
        sent = any(name.startswith("mcp-param-") for name in headers.values)
        try:
            name = rpc.member(params, "name")
        except msgspec.DecodeError:
            return  # the handler explains params that are not JSON
        schema = self.input_schema(name) if isinstance(name, str) else None
        if schema is None or not (sent or self._annotated(schema)):
            return  # no header sent, none declared: nothing can disagree
        arguments = rpc.member(params, "arguments")
        if arguments is UNSET or arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            return  # the handler explains arguments that are not an object
        rejection = validate_mcp_param_headers(schema, arguments, headers.values)
        if rejection is not None:
            raise RpcError(rejection.code, rejection.message)

    def _annotated(self, schema: Mapping[str, Any]) -> bool:
        """Whether a tool's input schema declares any `Mcp-Param-*` header (`x-mcp-header`), kept per schema."""
        found = self._annotations.get(id(schema))
        if found is None or found[0] is not schema:
            if len(self._annotations) > _SCHEMAS_KEPT:
                self._annotations.clear()
            found = self._annotations[id(schema)] = (schema, bool(x_mcp_header_map(schema)))
        return found[1]

    # -- handshake era -------------------------------------------------------------------------

    def _handshake(self, request: HttpRequest, version_header: str | None) -> Inbound:
        headers = request.headers
        session_id = headers.get(SESSION_HEADER)
        session: Session | None = None
        if session_id is not None:
            session = self.sessions.find(session_id, request.owner)
            if session is None:
                return SESSION_NOT_FOUND
        if (refused := self.security.refusal(request.method, headers)) is not None:
            return refused
        if request.method == "POST":
            return self._post(request, session, version_header)
        if session is None:
            if request.method in ("GET", "DELETE"):
                return _error_reply(400, rpc.INVALID_REQUEST, "Bad Request: Missing session ID")
            return Reply(405, b"", ((b"allow", b"GET, POST, DELETE"), (b"content-type", _JSON)))
        if request.method == "GET":
            if not headers.accepts()[1]:
                return _error_reply(406, rpc.INVALID_REQUEST, "Not Acceptable: Client must accept text/event-stream")
            if session.stream_open:
                return _error_reply(
                    409, rpc.INVALID_REQUEST, "Conflict: Only one SSE stream is allowed per session", session
                )
            return OpenStream(session)
        if request.method == "DELETE":
            return EndSession(session)
        return Reply(
            405,
            rpc.error_message(None, RpcError(rpc.INVALID_REQUEST, "Method Not Allowed")),
            (
                (b"allow", b"GET, POST, DELETE"),
                (b"content-type", _JSON),
                (SESSION_HEADER.encode(), session.id.encode()),
            ),
        )

    def _post(self, request: HttpRequest, session: Session | None, version_header: str | None) -> Inbound:
        headers = request.headers
        takes_json, takes_sse = headers.accepts()
        if not (takes_json and takes_sse):
            message = "Not Acceptable: Client must accept both application/json and text/event-stream"
            return _error_reply(406, rpc.INVALID_REQUEST, message, session)
        try:
            envelope = rpc.decode_envelope(request.body)
        except msgspec.ValidationError as exc:  # (a DecodeError too): JSON, but not one message
            return _error_reply(400, rpc.INVALID_PARAMS, f"Validation error: {exc}", session)
        except msgspec.DecodeError as exc:
            return _error_reply(400, rpc.PARSE_ERROR, f"Parse error: {exc}", session)
        if envelope.jsonrpc != "2.0" or not (envelope.is_request or envelope.is_notification or envelope.is_answer):
            return _error_reply(400, rpc.INVALID_PARAMS, "Validation error: not a JSON-RPC message", session)
        if envelope.method == "initialize" and envelope.is_request:
            return self._initialize(request, envelope, session)
        if session is None:
            return _error_reply(400, rpc.INVALID_REQUEST, "Bad Request: Missing session ID")
        if not envelope.is_request:
            return Accepted(_json_reply(202, b"", session), self._effect(session, envelope))
        params = envelope.members()
        try:
            meta = _meta(params)
        except RpcError as error:
            meta = {}
            if envelope.method in self.methods():
                return self._refused_call(envelope, session, error)
        call = Call(
            envelope.id,  # type: ignore[arg-type]
            envelope.method,  # type: ignore[arg-type]
            params,
            meta,
            session.version,
            session.capabilities,
            session.client_info,
            headers,
            session,
            owner=request.owner,
        )
        call.stream = not quiet(call)
        return call

    def _refused_call(self, envelope: rpc.Envelope, session: Session, error: RpcError) -> Reply:
        return _json_reply(200, rpc.error_message(envelope.id, error), session)  # type: ignore[arg-type]

    def _initialize(self, request: HttpRequest, envelope: rpc.Envelope, session: Session | None) -> Inbound:
        opens = session is None
        if opens:
            session = self.sessions.open(request.owner)
            if session is None:
                return _error_reply(503, rpc.INTERNAL_ERROR, "Too many open sessions")
        assert session is not None
        params = envelope.members()
        try:
            meta = _meta(params)
        except RpcError:
            meta = {}
        return Call(
            envelope.id,  # type: ignore[arg-type]
            "initialize",
            params,
            meta,
            session.version,
            {},
            {},
            request.headers,
            session,
            owner=request.owner,
            opens_session=opens,
        )

    def _effect(self, session: Session, envelope: rpc.Envelope) -> Cancelled | Answered | None:
        if envelope.is_answer:
            if envelope.id is UNSET or envelope.id is None:
                return None
            error = rpc.decode_error(envelope.error) if envelope.error is not UNSET else None
            result = envelope.result if envelope.result is not UNSET else None
            return Answered(session, envelope.id, result, error)  # type: ignore[arg-type]
        if envelope.method == "notifications/initialized":
            session.initialized = True
        elif envelope.method == "notifications/cancelled":
            try:
                request_id = rpc.member(envelope.members(), "requestId")
            except msgspec.DecodeError:
                return None
            if isinstance(request_id, int | str) and not isinstance(request_id, bool):
                return Cancelled(session, request_id)
        return None


def quiet(call: Call) -> bool:
    """Nothing can come between a handshake-era request and its answer: it is answered with JSON."""
    session = call.session
    if call.progress_token is not None or (session is not None and session.log_level is not None):
        return False
    return not any(call.declares(name) for name in _ASKABLE)


def _meta(params: dict[str, Raw]) -> dict[str, Any]:
    raw = params.get("_meta")
    if raw is None:
        return {}
    try:
        meta = _decode_any.decode(raw)
    except msgspec.DecodeError:
        meta = None
    if not isinstance(meta, dict):
        raise rpc.invalid_params()
    return meta


def unsupported(version: object) -> RpcError:
    return RpcError(
        rpc.UNSUPPORTED_VERSION,
        "Unsupported protocol version",
        {"supported": list(MODERN_VERSIONS), "requested": version},
    )


def _envelope(
    params: dict[str, Raw], headers: Headers, method: str
) -> tuple[dict[str, Any], str, dict[str, Any], dict[str, Any]]:
    """(meta, version, capabilities, client info) of a 2026-07-28 request, or the RpcError of the
    first rung it fails: the envelope's keys, the routing headers, the version."""
    try:
        meta = _meta(params)
    except RpcError:
        meta = None
    if meta is None or "_meta" not in params:
        raise RpcError(
            rpc.INVALID_PARAMS,
            f"params._meta must be an object carrying the required {PROTOCOL_KEY!r} and {CAPABILITIES_KEY!r}"
            " envelope keys",
        )
    missing = [key for key in (PROTOCOL_KEY, CAPABILITIES_KEY) if key not in meta]
    if missing:
        raise RpcError(
            rpc.INVALID_PARAMS, f"params._meta is missing the required envelope key(s): {', '.join(missing)}"
        )
    version = meta[PROTOCOL_KEY]
    if headers.get(VERSION_HEADER) != version:
        raise RpcError(
            rpc.HEADER_MISMATCH, f"{VERSION_HEADER} header does not match the request envelope's protocol version"
        )
    if headers.get(METHOD_HEADER) != method:
        raise RpcError(rpc.HEADER_MISMATCH, f"{METHOD_HEADER} header does not match the request body's method")
    if (key := _NAME_BEARING.get(method)) is not None:
        named = rpc.member(params, key)
        if named is not UNSET and named is not None and decode_header_value(headers.get(NAME_HEADER)) != named:
            raise RpcError(
                rpc.HEADER_MISMATCH, f"{NAME_HEADER} header does not match the request body's {key!r} parameter"
            )
    if not isinstance(version, str):
        raise RpcError(rpc.INVALID_PARAMS, "the protocol-version envelope value must be a string")
    if version not in MODERN_VERSIONS:
        raise unsupported(version)
    capabilities = meta[CAPABILITIES_KEY]
    info = meta.get(CLIENT_INFO_KEY)
    return meta, version, capabilities if isinstance(capabilities, dict) else {}, info if isinstance(info, dict) else {}


# -- what goes out -----------------------------------------------------------------------------


@dataclass(slots=True)
class Exchange:
    """The answer to one call, as JSON or as an SSE stream, in the call's era."""

    call: Call
    streaming: bool = False  # the SSE head has been sent
    answered: bool = False

    def json(self, message: bytes, *, error_code: int | None = None) -> Reply:
        """The whole answer as one JSON body."""
        self.answered = True
        status = 200
        if error_code is not None and self.call.modern:
            status = rpc.HTTP_STATUS.get(error_code, 200)
        return _json_reply(status, message, self.call.session)

    def head(self) -> tuple[int, list[tuple[bytes, bytes]]]:
        """The SSE stream's status and headers."""
        self.streaming = True
        headers = list(_SSE_HEADERS)
        if self.call.session is not None:
            headers.append((SESSION_HEADER.encode(), self.call.session.id.encode()))
        return 200, headers

    def answer_event(self, message: bytes) -> bytes:
        self.answered = True
        return event(message)


def event(message: bytes) -> bytes:
    """One SSE `message` event carrying a JSON-RPC message."""
    return b"event: message\r\ndata: " + message + b"\r\n\r\n"


def stream_head(session: Session) -> tuple[int, list[tuple[bytes, bytes]]]:
    """A session's GET stream: status and headers."""
    return 200, [*_SSE_HEADERS, (SESSION_HEADER.encode(), session.id.encode())]


def ended_reply(session: Session) -> Reply:
    """The answer to DELETE."""
    return _json_reply(200, b"", session)
