"""What an endpoint is to the engine: a table of handlers over the door, and the server it presents.

`dispatch` runs one `Call` the way every endpoint runs it: the era's method set, the session's
state, the params' shape, then the endpoint's handler, whose result is shaped for the client's
era (frontend/endpoints/eras.py). A handler gets a `Context`: the call, who asks, and the back
channel to the client, which the door reaches through the `Requester` protocol
(frontend/door/calls.py) without knowing the engine.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol

import msgspec
from msgspec import Raw

from mcpvisor.frontend import spans
from mcpvisor.frontend.door.calls import AskFailed, Caller
from mcpvisor.frontend.endpoints import eras, rpc
from mcpvisor.frontend.endpoints.engine import Call
from mcpvisor.frontend.endpoints.request_state import StateSeal
from mcpvisor.frontend.endpoints.rpc import RpcError
from mcpvisor.frontend.gate.activity import trace_context
from mcpvisor.runtime import mcp_spans, telemetry

Result = bytes | dict[str, Any]
Handler = Callable[["Context"], Awaitable[Result]]


class Outbox(Protocol):
    """The I/O side of one call's answer (frontend/endpoints/serving.py)."""

    async def send(self, message: bytes) -> None:
        """A JSON-RPC message on the call's own answer stream (it becomes SSE if it was not)."""
        ...

    async def request(self, method: str, params: dict[str, Any]) -> bytes:
        """A request to the client on the call's stream; its JSON result, or AskFailed."""
        ...

    async def tell(self, method: str, params: dict[str, Any] | None) -> None:
        """A notification for the client on its session's stream, which outlives the call."""
        ...


@dataclass(frozen=True)
class Identity:
    """The server an endpoint presents: its `serverInfo`, capabilities (per protocol version) and
    instructions, asked for each `initialize` and `server/discover` (they may change)."""

    server_info: Callable[[], dict[str, Any]]
    capabilities: Callable[[str], dict[str, Any]]
    instructions: Callable[[], str | None] = lambda: None


@dataclass
class Table:
    """One endpoint: its path, its handlers by method, and its identity."""

    path: str
    handlers: dict[str, Handler]
    identity: Identity
    input_schema: Callable[[str], Mapping[str, Any] | None] = lambda name: None
    seal: StateSeal | None = None  # the stack's sealing of 2026-07-28 round states (request_state.py)
    # Called when a handshake-era session of this endpoint ends (its subscriptions end with it).
    on_session_end: list[Callable[[Any], Awaitable[None]]] = field(default_factory=list)

    def methods(self) -> frozenset[str]:
        return frozenset(self.handlers) | {"initialize", "ping"}

    def stamp(self) -> bytes:
        """The `serverInfo` a 2026-07-28 result carries in `_meta`, encoded."""
        return msgspec.json.encode(self.identity.server_info())


class Context:
    """One call as its handler and the door see it (the door's `Requester`)."""

    def __init__(self, call: Call, table: Table, outbox: Outbox, *, tenant: str = "", carried: dict[str, Any]) -> None:
        self.call = call
        self.table = table
        self.outbox = outbox
        self.tenant = tenant
        # What a 2026-07-28 client brings back from a round: its answers, and the state, opened.
        self.carried = carried
        self._caller: Caller | None = None

    @property
    def caller(self) -> Caller:
        if self._caller is None:
            call = self.call
            parent, state = trace_context(call.meta, call.headers.values)
            self._caller = Caller(
                tenant=self.tenant,
                client=call.client_name,
                endpoint=self.table.path,
                protocol=call.version,
                session=call.session.id if call.session is not None else "",
                request_id=str(call.id),
                traceparent=parent,
                tracestate=state,
            )
        return self._caller

    @property
    def modern(self) -> bool:
        return self.call.modern

    @property
    def params(self) -> dict[str, Raw]:
        return self.call.params

    @property
    def meta(self) -> dict[str, Any]:
        return self.call.meta

    @property
    def progress_token(self) -> str | int | None:
        return self.call.progress_token

    def declares(self, capability: str, detail: str | None = None) -> bool:
        found = self.call.capabilities.get(capability)
        return isinstance(found, dict) and (detail is None or isinstance(found.get(detail), dict))

    async def notify(self, method: str, params: dict[str, Any] | None) -> None:
        """A notification on this call's own answer."""
        payload = None if params is None else msgspec.json.encode(params)
        await self.outbox.send(rpc.notification_message(method, payload))

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        token = self.progress_token
        if token is None:
            return
        params: dict[str, Any] = {"progressToken": token, "progress": progress}
        if total is not None:
            params["total"] = total
        if message is not None:
            params["message"] = message
        await self.notify("notifications/progress", params)

    async def log(self, params: dict[str, Any]) -> bool:
        if not self.modern:
            return False  # handshake-era clients hear logs on their session's stream, by logging/setLevel
        wanted = self.meta.get(eras.LOG_LEVEL_KEY)
        level = params.get("level")
        levels = eras.LOG_LEVELS
        if wanted in levels and level in levels and levels.index(level) >= levels.index(wanted):
            await self.notify("notifications/message", params)
        return True

    async def ask(self, method: str, params: dict[str, Any]) -> bytes:
        if self.modern or not self.call.stream:
            raise AskFailed(rpc.INVALID_REQUEST, f"the client has no channel for {method}")
        return await self.outbox.request(method, params)

    async def tell(self, method: str, params: dict[str, Any] | None) -> None:
        await self.outbox.tell(method, params)


# -- params as each method takes them ----------------------------------------------------------


class _Params(msgspec.Struct):
    """What every request's params may carry."""


class _CallParams(_Params):
    name: str
    arguments: Raw = Raw(b"null")


class _Paginated(_Params):
    cursor: str | None = None


class _Uri(_Params):
    uri: str


class _Prompt(_Params):
    name: str
    arguments: dict[str, str] | None = None


class _Reference(msgspec.Struct):
    type: str


class _Argument(msgspec.Struct):
    name: str
    value: str


class _Complete(_Params):
    ref: _Reference
    argument: _Argument


class _Level(_Params):
    level: Literal["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]


class _Implementation(msgspec.Struct):
    name: str
    version: str


class _Initialize(_Params):
    protocolVersion: str
    capabilities: dict[str, Any]
    clientInfo: _Implementation


class _Filter(msgspec.Struct):
    toolsListChanged: bool | None = None
    promptsListChanged: bool | None = None
    resourcesListChanged: bool | None = None
    resourceSubscriptions: list[str] | None = None


class _Listen(_Params):
    notifications: _Filter


class _Task(_Params):
    taskId: str


class _Meta(msgspec.Struct):
    progressToken: str | int | None = None


_SHAPES: Final[dict[str, type[_Params]]] = {
    "tools/call": _CallParams,
    "tools/list": _Paginated,
    "resources/list": _Paginated,
    "resources/templates/list": _Paginated,
    "prompts/list": _Paginated,
    "resources/read": _Uri,
    "resources/subscribe": _Uri,
    "resources/unsubscribe": _Uri,
    "prompts/get": _Prompt,
    "completion/complete": _Complete,
    "logging/setLevel": _Level,
    "initialize": _Initialize,
    "subscriptions/listen": _Listen,
    "tasks/get": _Task,
    "tasks/update": _Task,
    "tasks/cancel": _Task,
}
_DECODERS: Final = {method: msgspec.json.Decoder(shape) for method, shape in _SHAPES.items()}
_decode_meta = msgspec.json.Decoder(_Meta)


def check_params(call: Call) -> None:
    """Refuse params that do not fit the method (INVALID_PARAMS, as the SDK words it)."""
    if call.method == "tools/call":
        _check_call(call)
        return
    decoder = _DECODERS.get(call.method)
    try:
        if decoder is not None:
            checked = decoder.decode(msgspec.json.encode(call.params))
            if isinstance(checked, _CallParams) and bytes(checked.arguments).lstrip()[:1] not in (b"{", b"n"):
                raise rpc.invalid_params()
        if "_meta" in call.params:
            _decode_meta.decode(call.params["_meta"])
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise rpc.invalid_params() from None
    if call.modern and (level := call.meta.get(eras.LOG_LEVEL_KEY)) is not None and level not in eras.LOG_LEVELS:
        raise rpc.invalid_params()


def _check_call(call: Call) -> None:
    """check_params of a tools/call, the commonest request, without encoding its params again."""
    params = call.params
    name = params.get("name")
    arguments = params.get("arguments")
    if name is None or bytes(name)[:1] != b'"' or (arguments is not None and bytes(arguments)[:1] not in b"{n"):
        raise rpc.invalid_params()
    try:
        if "_meta" in params:
            _decode_meta.decode(params["_meta"])
        _decode_name.decode(name)
        if arguments is not None and bytes(arguments)[:1] == b"n":
            _decode_null.decode(arguments)
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise rpc.invalid_params() from None
    if call.modern and (level := call.meta.get(eras.LOG_LEVEL_KEY)) is not None and level not in eras.LOG_LEVELS:
        raise rpc.invalid_params()


_decode_name = msgspec.json.Decoder(str)
_decode_null = msgspec.json.Decoder(None)


async def served(context: Context) -> bytes:
    """`dispatch` in the request's span (frontend/spans.py) while telemetry is on: its parent is the
    client's (`params._meta`, else the HTTP headers); an error answer or a tool's failure is told on it."""
    if telemetry.active is None:
        return await dispatch(context)
    call = context.call
    named = {key: value for key in ("name", "uri") if isinstance(value := _decoded(call.params, key), str)}
    extra: dict[str, Any] = {
        "mcp.protocol.version": call.version,
        "jsonrpc.request.id": str(call.id),
        "mcpvisor.endpoint": context.table.path,
    }
    if call.session is not None:
        extra["mcp.session.id"] = call.session.id[:128]
    headers = {key: value for key in mcp_spans.CONTEXT_KEYS if (value := call.headers.get(key)) is not None}
    with spans.serving(call.method, {**named, "_meta": call.meta}, headers, **extra) as serving:
        if serving is None:  # telemetry stopped meanwhile: the process is on its way out
            return await dispatch(context)
        try:
            result = await dispatch(context)
        except RpcError as exc:
            serving.error(exc.code, exc.message)
            raise
        serving.result(result)
        return result


def _decoded(params: dict[str, Raw], key: str) -> Any:
    try:
        return rpc.member(params, key)
    except msgspec.DecodeError:
        return None


async def dispatch(context: Context) -> bytes:
    """Run one call through its endpoint: the JSON result for the client's era, or RpcError."""
    call = context.call
    method = call.method
    if method in eras.SPEC_METHODS and not eras.serves(call.version, method):
        raise rpc.method_not_found(method)
    handler = context.table.handlers.get(method)
    if handler is None and method not in ("initialize", "ping"):
        raise rpc.method_not_found(method)
    session = call.session
    if not call.modern and session is not None and not session.initialized and method not in ("initialize", "ping"):
        raise rpc.invalid_params()
    check_params(call)
    rounds = call.modern and method in eras.INPUT_REQUIRED_METHODS and context.table.seal is not None
    if rounds:
        context.carried = _carried(context)
    if method == "initialize":
        result: Result = initialize(context)
    elif method == "ping":
        result = b"{}"
    else:
        assert handler is not None
        result = await handler(context)
    if rounds and isinstance(result, dict) and result.get("resultType") == "input_required":
        state = result.get("requestState")
        if isinstance(state, str):
            assert context.table.seal is not None
            sealed = context.table.seal.seal(state, method, _bound(call), call.owner)
            result = {**result, "requestState": sealed}
    try:
        return eras.shape(method, call.version, result, context.table.stamp() if call.modern else None)
    except eras.BadResult:
        raise RpcError(rpc.INTERNAL_ERROR, "Handler returned an invalid result") from None


def _bound(call: Call) -> dict[str, Any]:
    """The members of a request its round state is bound to."""
    found: dict[str, Any] = {}
    for key in ("name", "uri", "arguments"):
        value = rpc.member(call.params, key)
        if value is not msgspec.UNSET:
            found[key] = value
    return found


def _carried(context: Context) -> dict[str, Any]:
    """What a 2026-07-28 client brings back from the last round: its answers and the state, opened."""
    call = context.call
    carried: dict[str, Any] = {}
    state = rpc.member(call.params, "requestState")
    if state is not msgspec.UNSET and state is not None:
        assert context.table.seal is not None
        carried["requestState"] = context.table.seal.open(state, call.method, _bound(call), call.owner)
    responses = rpc.member(call.params, "inputResponses")
    if responses is not msgspec.UNSET and responses is not None:
        if not isinstance(responses, dict):
            raise rpc.invalid_params()
        carried["inputResponses"] = responses
    return carried


def initialize(context: Context) -> dict[str, Any]:
    """`initialize`: the version both speak, and what the endpoint offers at it (the session keeps both)."""
    call = context.call
    requested = rpc.member(call.params, "protocolVersion")
    version = requested if requested in eras.HANDSHAKE_VERSIONS else eras.LATEST_HANDSHAKE
    identity = context.table.identity
    result: dict[str, Any] = {
        "protocolVersion": version,
        "capabilities": identity.capabilities(version),
        "serverInfo": identity.server_info(),
    }
    if (instructions := identity.instructions()) is not None:
        result["instructions"] = instructions
    session = call.session
    if session is not None:
        capabilities = rpc.member(call.params, "capabilities")
        info = rpc.member(call.params, "clientInfo")
        session.version = version
        session.capabilities = capabilities if isinstance(capabilities, dict) else {}
        session.client_info = info if isinstance(info, dict) else {}
        session.initialized = True
    return result


async def discover(context: Context) -> dict[str, Any]:
    """`server/discover` (2026-07-28): the versions served and what the endpoint offers at them."""
    identity = context.table.identity
    result: dict[str, Any] = {
        "supportedVersions": list(eras.MODERN_VERSIONS),
        "capabilities": identity.capabilities(context.call.version),
    }
    if (instructions := identity.instructions()) is not None:
        result["instructions"] = instructions
    return result


def ask_failed(exc: AskFailed) -> RpcError:
    return RpcError(exc.code, exc.message)
