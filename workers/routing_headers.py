"""`Mcp-Method` and `Mcp-Name` on every request the worker POSTs to a streamable HTTP upstream.

2026-07-28 lets load balancers and gateways route by these headers without reading the body.
The SDK's client sets them only on 2026-07-28 sessions, and the worker speaks the handshake era to
its upstream, so an httpx request hook copies them from the JSON-RPC body it is about to send.
"""

from __future__ import annotations

from typing import Any

import httpx2
import msgspec
from mcp.shared.inbound import MCP_METHOD_HEADER, MCP_NAME_HEADER, NAME_BEARING_METHODS, encode_header_value


class _Envelope(msgspec.Struct):
    method: str | None = None
    params: dict[str, Any] | None = None


_decode = msgspec.json.Decoder(_Envelope)


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
