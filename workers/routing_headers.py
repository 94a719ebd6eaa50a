"""`Mcp-Method` and `Mcp-Name` on every request the worker POSTs to a streamable HTTP upstream,
and the request's trace context (`traceparent`, `tracestate`, `baggage`) as W3C headers.

2026-07-28 lets load balancers and gateways route by these headers without reading the body.
The SDK's client sets them only on 2026-07-28 sessions, and the worker speaks the handshake era to
its upstream, so an httpx request hook copies them from the JSON-RPC body it is about to send. The
trace context is copied the same way from `params._meta`, where the call's span put it, so an HTTP
server's own instrumentation (a proxy, a framework) joins the same trace.
"""

from __future__ import annotations

import re
from typing import Any

import httpx2
import msgspec
from mcp.shared.inbound import MCP_METHOD_HEADER, MCP_NAME_HEADER, NAME_BEARING_METHODS, encode_header_value


class _Envelope(msgspec.Struct):
    method: str | None = None
    params: dict[str, Any] | None = None


_decode = msgspec.json.Decoder(_Envelope)

# What a trace header may hold: the W3C formats' characters, within their propagation limits.
_TRACE_HEADERS = {
    "traceparent": re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}"),
    "tracestate": re.compile(r"[\x20-\x7e]{1,512}"),
    "baggage": re.compile(r"[\x20-\x7e]{1,8192}"),
}


def routing_headers(body: bytes) -> dict[str, str]:
    """The routing headers a JSON-RPC request body calls for; none for a response, a batch or garbage."""
    try:
        message = _decode.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return {}
    if message.method is None:
        return {}
    headers = {MCP_METHOD_HEADER: message.method}
    key = NAME_BEARING_METHODS.get(message.method)
    name = (message.params or {}).get(key) if key is not None else None
    if isinstance(name, str):
        headers[MCP_NAME_HEADER] = encode_header_value(name)
    meta = (message.params or {}).get("_meta")
    if isinstance(meta, dict) and isinstance(meta.get("traceparent"), str):
        for header, form in _TRACE_HEADERS.items():
            value = meta.get(header)
            if isinstance(value, str) and form.fullmatch(value):
                headers[header] = value
    return headers


async def stamp_routing_headers(request: httpx2.Request) -> None:
    """httpx request hook: add the routing headers the body calls for, keeping any already set."""
    if request.method != "POST":
        return
    try:
        body = request.content
    except httpx2.RequestNotRead:  # a streamed body: nothing to read the method from
        return
    for name, value in routing_headers(body).items():
        request.headers.setdefault(name, value)
