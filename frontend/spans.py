"""The frontend's spans: each MCP request it serves, and the door's part in it.

A request's span (SERVER, named by the MCP conventions: `tools/call echo:echo`) has the client's
span as its parent: the one in `params._meta`, else the HTTP `traceparent` header, else none (the
request starts a trace). The engine opens it with `serving` for each request it serves
(frontend/endpoints/handlers.py); a call the door makes with no request being served (none today
but a test's) has it opened by the door.

The door's part (`Door`) is that same span when the request is the call itself (a tool of
/mcp/direct, of a server's own endpoint, a resource read), and a child span when a built-in tool
makes the call (call_tool_*, proxy, code_execution, each of whose calls is a child of its span).
It tells the gate's decision and the worker it routed to; while it is current, the router sends
its context to the worker with the request (`wire_context`).

Nothing here does any work while telemetry is off.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Final

from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, StatusCode

from mcpvisor.runtime import mcp_spans, telemetry

# The requests whose door span is the request's own: the client asked for exactly this call.
SAME_CALL: Final = frozenset({"direct", "server-endpoint"})
_NO_CONTEXT: Final[dict[str, str]] = {}
_TRACE_HEADERS: Final = (b"traceparent", b"tracestate", b"baggage")
# HTTP headers that say what the conventions record, for a request a short path answers.
_NOTED_HEADERS: Final = {b"mcp-protocol-version": "mcp.protocol.version", b"mcp-session-id": "mcp.session.id"}


@dataclass(slots=True)
class _Serving:
    """The request being served in this task, and what its duration is recorded with."""

    span: Span
    method: str
    started: float = field(default_factory=time.perf_counter)
    metric: dict[str, Any] = field(default_factory=dict)


_serving: ContextVar[_Serving | None] = ContextVar("mcpvisor_serving", default=None)
_in_door: ContextVar[bool] = ContextVar("mcpvisor_in_door", default=False)


@dataclass(slots=True)
class _HttpRequest:
    """What the HTTP request this task serves says: its trace headers, its protocol version and session."""

    trace: dict[str, str]
    attributes: dict[str, str]


# For the short paths, which give the door no request object to read these from.
_http: ContextVar[_HttpRequest | None] = ContextVar("mcpvisor_http_request", default=None)


def note_http(scope: Mapping[str, Any]) -> None:
    """Keep what the HTTP request's headers say for the request spans this task opens."""
    if telemetry.active is None:
        return
    noted = _HttpRequest({}, {})
    for name, value in scope.get("headers") or ():
        if name in _TRACE_HEADERS:
            noted.trace[name.decode("latin-1")] = value.decode("latin-1")
        elif (attribute := _NOTED_HEADERS.get(name)) is not None:
            noted.attributes[attribute] = value.decode("latin-1")[:128]
    _http.set(noted)


def wire_context() -> dict[str, str]:
    """The current span as the propagators write it, for the worker: empty while telemetry is off."""
    if telemetry.active is None:
        return _NO_CONTEXT
    span = trace_api.get_current_span()
    return mcp_spans.carrier(span) if span.get_span_context().is_valid else _NO_CONTEXT


def _parent(meta: Any, headers: Mapping[str, Any] | None) -> tuple[Context, list[Link]]:
    """The client's span: from `_meta`, else from the HTTP headers (then linked, if both name one)."""
    from_meta = mcp_spans.remote_parent(meta if isinstance(meta, Mapping) else None)
    from_headers = mcp_spans.remote_parent(headers)
    if from_meta is None:
        return from_headers or Context(), []
    if from_headers is None:
        return from_meta, []
    return from_meta, [Link(trace_api.get_current_span(from_headers).get_span_context())]


def _headers_of(request: Any) -> Mapping[str, Any] | None:
    headers = getattr(request, "headers", None)
    if headers is None:
        noted = _http.get()
        return noted.trace if noted is not None else None
    return {key: value for key in mcp_spans.CONTEXT_KEYS if isinstance(value := headers.get(key), str)}


def _open(
    tel: telemetry.Telemetry,
    method: str,
    params: Mapping[str, Any] | None,
    headers: Mapping[str, Any] | None,
    extra: dict[str, Any],
) -> _Serving:
    name, attributes = mcp_spans.operation(method, params)
    metric = {**attributes, "network.transport": "tcp", "network.protocol.name": "http"}
    metric.pop("mcp.resource.uri", None)
    attributes.update(metric)
    attributes.update(extra)
    if "mcp.protocol.version" in extra:
        metric["mcp.protocol.version"] = extra["mcp.protocol.version"]
    context, links = _parent(params.get("_meta") if params is not None else None, headers)
    span = tel.tracer.start_span(name, context=context, kind=SpanKind.SERVER, attributes=attributes, links=links)
    return _Serving(span, method, metric=metric)


def _close(tel: telemetry.Telemetry, serving: _Serving, error_type: str | None) -> None:
    serving.span.end()
    if tel.server_duration is not None:
        metric = serving.metric if error_type is None else {**serving.metric, "error.type": error_type}
        tel.server_duration.record(time.perf_counter() - serving.started, metric)


def _tool_error(method: str, result: Any) -> bool:
    if isinstance(result, bytes):
        return mcp_spans.tool_error(method, result)
    if isinstance(result, Mapping):
        return result.get("isError") is True
    return getattr(result, "is_error", None) is True


def _error_type(span: Span) -> str | None:
    """The `error.type` the span already has: the door's more precise one is kept (refused, timeout)."""
    value = (getattr(span, "attributes", None) or {}).get("error.type")
    return str(value) if value is not None else None


def _failed(span: Span, code: int, message: str | None) -> str:
    error_type = str(code)
    span.set_attribute("rpc.response.status_code", error_type)
    if (told := _error_type(span)) is not None:
        return told
    span.set_attribute("error.type", error_type)
    span.set_status(StatusCode.ERROR, message)
    return error_type


def _policy(decision: str, policies: tuple[str, ...]) -> dict[str, Any]:
    found: dict[str, Any] = {"mcpvisor.policy.decision": decision} if decision else {}
    if policies:
        found["mcpvisor.policy.ids"] = list(policies)
    return found


def gate_passed(decision: str, policies: tuple[str, ...]) -> None:
    """The gate let the call through: said on the door's span (current while the door runs the call)."""
    if telemetry.active is None:
        return
    span = trace_api.get_current_span()
    span.add_event("gate", {"mcpvisor.gate.decision": "allowed", **_policy(decision, policies)})
    span.set_attribute("mcpvisor.gate.decision", "allowed")


class Served:
    """What a road tells the span of a request it serves: an error answer, or a tool's failure."""

    __slots__ = ("error_type", "serving", "tel")

    def __init__(self, tel: telemetry.Telemetry, serving: _Serving) -> None:
        self.tel = tel
        self.serving = serving
        self.error_type: str | None = None

    def error(self, code: int, message: str) -> None:
        """The request was answered with a JSON-RPC error. The message may quote an upstream's, which
        may echo what the client sent: the code alone, unless the operator asked for arguments."""
        self.error_type = _failed(self.serving.span, code, message[:300] if self.tel.record_arguments else None)

    def result(self, result: Any) -> None:
        """The request was answered with `result` (a tool's `isError: true` is a failure too)."""
        if self.serving.method == "tools/call" and _tool_error("tools/call", result):
            self.error_type = _error_type(self.serving.span) or "tool_error"
            if self.error_type == "tool_error":
                mcp_spans.set_tool_error(self.serving.span)


@contextmanager
def serving(
    method: str, params: Mapping[str, Any] | None, headers: Mapping[str, Any] | None, **attributes: Any
) -> Iterator[Served | None]:
    """The span of one MCP request the frontend serves, current while it is served: for any road
    (the engine, frontend/endpoints/handlers.py). None while off.

    `headers` are the HTTP request's trace headers (the parent when `params._meta` names none);
    `attributes` the conventions' that the road knows (`mcp.protocol.version`, `mcp.session.id`,
    `jsonrpc.request.id`, `mcpvisor.endpoint`).
    """
    tel = telemetry.active
    if tel is None:
        yield None
        return
    opened = _open(tel, method, params, headers, attributes)
    served = Served(tel, opened)
    token = _serving.set(opened)
    try:
        with trace_api.use_span(opened.span, record_exception=False, set_status_on_exception=False):
            yield served
    except BaseException as exc:
        if served.error_type is None:
            served.error_type = type(exc).__name__
            opened.span.set_attribute("error.type", served.error_type)
            opened.span.set_status(StatusCode.ERROR)
        raise
    finally:
        _serving.reset(token)
        _close(tel, opened, served.error_type)


class Door:
    """The door's part of one call: the gate's decision, the routing, how the call ended."""

    __slots__ = ("_own", "_request", "span", "tel")

    def __init__(self, tel: telemetry.Telemetry, span: Span, own: _Serving | None, request: _Serving | None) -> None:
        self.tel = tel
        self.span = span
        self._own = own  # the request span the door opened itself (a short path's request)
        self._request = request  # the request span this door's span is (or is below)

    def refused(self, reason: str, decision: str = "", policies: tuple[str, ...] = ()) -> None:
        """The gate stopped the call: policy, quarantine, pinning (changed since approval), destructive,
        login; a policy's refusal names its decision and the policies that made it."""
        event = {"mcpvisor.gate.decision": "refused", "mcpvisor.gate.reason": reason, **_policy(decision, policies)}
        self.span.add_event("gate", event)
        self.span.set_attributes({"mcpvisor.gate.decision": "refused", "error.type": "refused"})
        self.span.set_status(StatusCode.ERROR, f"refused by the gate: {reason}")

    def failed(self, code: int, message: str, reason: str = "", *, own: bool = False) -> None:
        """The call failed: `reason` is mcpvisor's (timeout, upstream_gone, ...); the message is told
        only when mcpvisor wrote it (`own`), or when the operator asked for arguments to be recorded."""
        if reason:
            self.span.set_attribute("error.type", reason)
            self.span.set_status(StatusCode.ERROR, message[:300] if own or self.tel.record_arguments else None)
        _failed(self.span, code, message[:300] if own or self.tel.record_arguments else None)

    def answered(self, method: str, result: bytes | dict[str, Any]) -> None:
        if isinstance(result, bytes) and mcp_spans.tool_error(method, result):
            mcp_spans.set_tool_error(self.span)

    def close(self) -> None:
        if self._own is not None:
            _close(self.tel, self._own, _error_type(self.span))
        elif self._request is None or self.span is not self._request.span:
            self.span.end()


@contextmanager
def door(
    tenant: str,
    method: str,
    server: str,
    name: str,
    params: Mapping[str, Any],
    call: Any,
    *,
    via: str,
    worker: str,
) -> Iterator[Door | None]:
    """The door's span for one call to `server` (None: telemetry is off, or the door is already in one)."""
    tel = telemetry.active
    if tel is None or _in_door.get():
        yield None
        return
    serving = _serving.get()
    own = None
    attributes: dict[str, Any] = {"mcpvisor.server": server, "mcpvisor.worker_id": worker, "mcpvisor.via": via}
    if tenant:
        attributes["mcpvisor.tenant"] = tenant
    if serving is None:
        # A short path's request: the door serves it, so its span is the request's.
        request_params = {**params, "name": name} if method == "tools/call" else params
        ctx = getattr(call, "ctx", None)
        noted = _http.get()
        extra: dict[str, Any] = dict(noted.attributes) if noted is not None else {}
        own = serving = _open(tel, method, request_params, _headers_of(getattr(ctx, "request", None)), extra)
        span = serving.span
    elif via in SAME_CALL or (not via and serving.method == method):
        span = serving.span
    else:
        span_name, own_attributes = mcp_spans.operation(method, {**params, "name": name})
        attributes.update(own_attributes)
        context = trace_api.set_span_in_context(serving.span)
        span = tel.tracer.start_span(span_name, context=context, attributes=attributes)
    span.set_attributes(attributes)
    handle = Door(tel, span, own, serving)
    token = _in_door.set(True)
    try:
        if own is not None:
            token_serving = _serving.set(own)
        with trace_api.use_span(span, record_exception=False, set_status_on_exception=False):
            yield handle
    finally:
        if own is not None:
            _serving.reset(token_serving)
        _in_door.reset(token)
        handle.close()
