"""MCP spans as OpenTelemetry's semantic conventions for MCP name them, and trace context carried
in a request's `params._meta` (`traceparent`, `tracestate`, `baggage`: the conventions' propagation).

Used by the frontend and the workers only while telemetry is on (`telemetry.active`); the
OpenTelemetry API it imports is already loaded by the MCP SDK.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec
from opentelemetry import propagate
from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.trace import Span, StatusCode

from mcpvisor.wire.errors import ErrorCode, WireError
from mcpvisor.wire.redaction import redact_secrets, redact_url, redacted_json

# Longest name kept as a span name's target; a client may send any name, the span name stays short.
NAME_LIMIT: Final = 128
URI_LIMIT: Final = 512
RESOURCE_METHODS: Final = frozenset({"resources/read", "resources/subscribe", "resources/unsubscribe"})
# The keys of the W3C propagators; stale ones from a client are removed before mcpvisor writes its own.
CONTEXT_KEYS: Final = ("traceparent", "tracestate", "baggage")
# Errors whose message is mcpvisor's own (a timeout, a stopped worker), not text an upstream wrote
# and that may echo what it was sent: only these describe a span's error status by default.
_OWN_MESSAGES: Final = frozenset(ErrorCode) - {ErrorCode.UPSTREAM_ERROR, ErrorCode.BAD_REQUEST}

_decode_params = msgspec.json.Decoder(dict[str, Any] | None)
_encode = msgspec.json.encode


def operation(method: str, params: Mapping[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """The span name (`tools/call get_weather`) and the attributes the request's method and params give."""
    attributes: dict[str, Any] = {"mcp.method.name": method}
    name = params.get("name") if params is not None else None
    target = name[:NAME_LIMIT] if isinstance(name, str) and name else None
    if method == "tools/call" and target is not None:
        attributes["gen_ai.tool.name"] = target
        attributes["gen_ai.operation.name"] = "execute_tool"
    elif method == "prompts/get" and target is not None:
        attributes["gen_ai.prompt.name"] = target
    else:
        target = None
    uri = params.get("uri") if params is not None else None
    if method in RESOURCE_METHODS and isinstance(uri, str):
        # A URL's password or token never goes out with it.
        attributes["mcp.resource.uri"] = redact_url(uri)[:URI_LIMIT]
    return (f"{method} {target}" if target else method), attributes


def decode_params(params: bytes | None) -> dict[str, Any] | None:
    """A request's JSON params as an object; None when absent or not an object (they go on unchanged)."""
    if not params:
        return None
    try:
        return _decode_params.decode(params)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def remote_parent(carrier: Mapping[str, Any] | None) -> Context | None:
    """The parent a carrier names (a wire message's context, a request's `_meta`, HTTP headers), if valid."""
    if not carrier:
        return None
    found = {key: value for key in CONTEXT_KEYS if isinstance(value := carrier.get(key), str)}
    if "traceparent" not in found:
        return None
    context = propagate.extract(found)
    return context if trace_api.get_current_span(context).get_span_context().is_valid else None


def carrier(span: Span) -> dict[str, str]:
    """The span's context as the configured propagators write it (`traceparent`, `tracestate`, ...)."""
    written: dict[str, str] = {}
    propagate.inject(written, context=trace_api.set_span_in_context(span))
    return written


def with_context(params: dict[str, Any], span: Span) -> dict[str, Any]:
    """`params` whose `_meta` names `span` as the parent of whatever the receiver does with them."""
    meta = params.get("_meta")
    meta = {key: value for key, value in meta.items() if key not in CONTEXT_KEYS} if isinstance(meta, dict) else {}
    meta.update(carrier(span))
    return {**params, "_meta": meta}


def encode_params(params: dict[str, Any]) -> bytes:
    return _encode(params)


def arguments_attribute(params: Mapping[str, Any] | None) -> dict[str, str]:
    """`gen_ai.tool.call.arguments`, redacted as the activity log keeps them (for `record_arguments`)."""
    arguments = params.get("arguments") if params is not None else None
    text = redacted_json(arguments) if arguments is not None else None
    return {"gen_ai.tool.call.arguments": text} if text is not None else {}


def result_attribute(result: bytes) -> dict[str, str]:
    """`gen_ai.tool.call.result`, redacted likewise."""
    text = redacted_json(result)
    return {"gen_ai.tool.call.result": text} if text is not None else {}


def tool_error(method: str, result: bytes) -> bool:
    """Whether a tools/call result says the tool failed (`isError: true`): the conventions' `tool_error`."""
    if method != "tools/call" or b'"isError"' not in result:
        return False
    document = decode_params(result)
    return document is not None and document.get("isError") is True


def failure_attributes(error: WireError) -> dict[str, str]:
    """`error.type` (the JSON-RPC code an upstream answered, else mcpvisor's reason) and the status code."""
    if error.mcp_code is not None:
        code = str(error.mcp_code)
        return {"error.type": code, "rpc.response.status_code": code}
    return {"error.type": error.code.name.lower()}


def set_failure(span: Span, error: WireError, *, describe: bool = False) -> None:
    """Mark `span` failed; its description is the message only where mcpvisor wrote it (or `describe`)."""
    span.set_attributes(failure_attributes(error))
    own = error.code in _OWN_MESSAGES and error.mcp_code is None
    span.set_status(StatusCode.ERROR, redact_secrets(error.message)[:300] if own or describe else None)


def set_tool_error(span: Span) -> None:
    span.set_attribute("error.type", "tool_error")
    span.set_status(StatusCode.ERROR)
