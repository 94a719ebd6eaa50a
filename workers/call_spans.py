"""The span of each call a worker makes to its upstream: a CLIENT span named by the MCP conventions.

Its parent is the frontend's span, carried on the wire (`Request.trace_context`), else the
client's own `params._meta`; its context goes to the upstream in the request's `_meta` (and, for a
remote upstream, as HTTP headers: see routing_headers). Nothing here runs while telemetry is off.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry.trace import Span, SpanKind

from mcpvisor.runtime import mcp_spans, telemetry
from mcpvisor.wire.errors import ErrorCode, WireError
from mcpvisor.wire.messages import Request
from mcpvisor.workers import upstream_spans

if TYPE_CHECKING:
    from mcpvisor.workers.upstream import Upstream


class CallSpan:
    """One upstream call's span, and what its duration is recorded with."""

    __slots__ = ("attributes", "method", "span", "started", "telemetry")

    def __init__(self, tel: telemetry.Telemetry, span: Span, method: str, attributes: dict[str, Any]) -> None:
        self.telemetry = tel
        self.span = span
        self.method = method
        self.attributes = attributes  # those of the duration histogram
        self.started = time.perf_counter()

    def end(self, outcome: bytes | WireError | None) -> None:
        """End with the upstream's result, a failure, or None for a call the frontend gave up on."""
        span = self.span
        attributes = self.attributes
        if isinstance(outcome, WireError):
            mcp_spans.set_failure(span, outcome, describe=self.telemetry.record_arguments)
            attributes = {**attributes, **mcp_spans.failure_attributes(outcome)}
        elif outcome is None:
            cancelled = WireError(ErrorCode.CANCELLED, "the call was cancelled")
            mcp_spans.set_failure(span, cancelled)
            attributes = {**attributes, "error.type": "cancelled"}
        elif mcp_spans.tool_error(self.method, outcome):
            mcp_spans.set_tool_error(span)
            attributes = {**attributes, "error.type": "tool_error"}
        if self.telemetry.record_arguments and isinstance(outcome, bytes):
            span.set_attributes(mcp_spans.result_attribute(outcome))
        span.end()
        if self.telemetry.client_duration is not None:
            self.telemetry.client_duration.record(time.perf_counter() - self.started, attributes)


class _HoldsSpan(Protocol):
    span: CallSpan | None


def begin(upstream: Upstream, msg: Request, payload: bytes | None) -> tuple[bytes | None, CallSpan | None]:
    """Start the call's span; the params to send upstream, which name it as their parent.

    With telemetry off, or params that are not a JSON object, the params go on as they came.
    """
    tel = telemetry.active
    if tel is None:
        return payload, None
    params = mcp_spans.decode_params(payload) if payload else {}
    name, attributes = mcp_spans.operation(msg.method, params)
    meta = params.get("_meta") if params is not None else None
    parent = mcp_spans.remote_parent(msg.trace_context) or mcp_spans.remote_parent(
        meta if isinstance(meta, dict) else None
    )
    attributes.update(upstream_spans.attributes(upstream))
    histogram = dict(attributes)
    histogram.pop("mcp.resource.uri", None)  # one series per resource would not be a histogram
    if msg.activity_id:
        attributes["mcpvisor.request.id"] = msg.activity_id
    if tel.record_arguments:
        attributes.update(mcp_spans.arguments_attribute(params))
    span = tel.tracer.start_span(name, context=parent, kind=SpanKind.CLIENT, attributes=attributes)
    if params is None:
        return payload, CallSpan(tel, span, msg.method, histogram)
    return mcp_spans.encode_params(mcp_spans.with_context(params, span)), CallSpan(tel, span, msg.method, histogram)


def end(call: _HoldsSpan, outcome: bytes | WireError | None) -> None:
    """End the span `call` holds, once: the first outcome told is the call's."""
    if call.span is not None:
        span, call.span = call.span, None
        span.end(outcome)
