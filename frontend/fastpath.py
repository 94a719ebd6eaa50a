"""The short way for the commonest request: a 2026-07-28 `tools/call` on `/mcp/direct`.

A stateless 2026-07-28 call of an upstream tool, with no progress or log opt-in, is a plain
request-response: this module answers it without the SDK's server, decoding the envelope with
msgspec and passing the upstream's result through as it came, with the fields the protocol adds.
Everything else (another era, another method, progress, logs, a client that can be asked for
sampling, elicitation or roots, Mcp-Param headers, a management tool, anything malformed or
unusual) falls through to the SDK, which also produces every error a
malformed request deserves. The SDK's client checks what this returns in the test suite, in both
eras, against every upstream the tests use.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from fnmatch import fnmatch
from typing import Any

import msgspec

from mcpvisor.frontend.gateway import ENVELOPE_PREFIX, Gateway
from mcpvisor.wire.errors import INTERNAL_ERROR, ErrorCode, WireError

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

MODERN = "2026-07-28"
_PROTOCOL_KEY = "io.modelcontextprotocol/protocolVersion"
_CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
# Keys of `_meta` that ask for more than a plain answer: progress or log delivery on a stream.
_STREAMING_META = ("progressToken", "io.modelcontextprotocol/logLevel")
_ASKABLE = ("sampling", "elicitation", "roots")


class _Params(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    arguments: dict[str, Any] = {}
    _meta: dict[str, Any] = msgspec.field(default_factory=dict, name="_meta")


class _Call(msgspec.Struct, forbid_unknown_fields=True):
    jsonrpc: str
    id: int | str
    method: str
    params: _Params


_decode_call = msgspec.json.Decoder(_Call)
_decode_result = msgspec.json.Decoder(dict[str, Any])
_encode = msgspec.json.encode


class FastPath:
    """Answers the requests it can; returns False for the rest, which the SDK then serves."""

    def __init__(
        self,
        gateway: Gateway,
        *,
        max_body: int,
        allowed_hosts: list[str] | None,
        allowed_origins: list[str] | None,
        server_info: dict[str, str],
    ) -> None:
        self.gateway = gateway
        self.max_body = max_body
        self.allowed_hosts = allowed_hosts
        self.allowed_origins = allowed_origins
        self.server_info = server_info

    def _eligible(self, scope: Scope) -> dict[str, str] | None:
        """The request's headers when it may take the short way, else None."""
        if scope["method"] != "POST":
            return None
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        if headers.get("mcp-protocol-version") != MODERN or headers.get("mcp-method") != "tools/call":
            return None
        if "application/json" not in headers.get("accept", "") or not headers.get("content-type", "").startswith(
            "application/json"
        ):
            return None
        if any(name.startswith("mcp-param-") for name in headers):
            return None
        length = headers.get("content-length")
        if length is None or not length.isdigit() or int(length) > self.max_body:
            return None
        if self.allowed_hosts is not None and not any(fnmatch(headers.get("host", ""), p) for p in self.allowed_hosts):
            return None
        origin = headers.get("origin")
        if (
            origin is not None
            and self.allowed_origins is not None
            and not any(fnmatch(origin, pattern) for pattern in self.allowed_origins)
        ):
            return None
        return headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> tuple[bool, bytes]:
        """(answered, body read): when not answered, the body must be replayed to the SDK."""
        headers = self._eligible(scope)
        if headers is None:
            return False, b""
        mcp_name = headers.get("mcp-name")
        body = b""
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return False, body
            body += message.get("body", b"")
            if len(body) > self.max_body:
                return False, body
            if not message.get("more_body"):
                break
        try:
            call = _decode_call.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return False, body
        meta = call.params._meta
        if (
            call.jsonrpc != "2.0"
            or call.method != "tools/call"
            or meta.get(_PROTOCOL_KEY) != MODERN
            or not isinstance(meta.get(_CAPABILITIES_KEY), dict)
            # A client that can be asked things gets its upstream's questions over rounds, which
            # the SDK's server carries (frontend/rounds.py).
            or any(meta[_CAPABILITIES_KEY].get(name) is not None for name in _ASKABLE)
            or any(key in meta for key in _STREAMING_META)
            or (mcp_name is not None and mcp_name != call.params.name)
        ):
            return False, body
        gateway = self.gateway
        target = gateway.catalog.resolve_tool(call.params.name)
        visible = gateway.visible_servers()
        if target is None or (visible is not None and target[0] not in visible):
            return False, body  # the SDK path explains unknown names
        server, tool = target
        params: dict[str, Any] = {"name": tool, "arguments": call.params.arguments}
        forwarded_meta = {key: value for key, value in meta.items() if not key.startswith(ENVELOPE_PREFIX)}
        if forwarded_meta:
            params["_meta"] = forwarded_meta
        assert gateway.router is not None
        try:
            raw = await gateway.router.request(server, "tools/call", params, gateway.call_timeout(server))
            result = _decode_result.decode(raw)
            if not isinstance(result.get("content"), list):
                raise WireError(ErrorCode.UPSTREAM_ERROR, f"server '{server}' sent a tools/call result without content")
        except WireError as exc:
            error = {"code": exc.jsonrpc_code, "message": f"Tool '{call.params.name}': {exc.message}"}
            await _respond(send, {"jsonrpc": "2.0", "id": call.id, "error": error})
            return True, body
        except msgspec.DecodeError:
            error = {
                "code": INTERNAL_ERROR,
                "message": f"Tool '{call.params.name}': server '{server}' sent invalid JSON",
            }
            await _respond(send, {"jsonrpc": "2.0", "id": call.id, "error": error})
            return True, body
        result.setdefault("resultType", "complete")
        upstream_meta = result.get("_meta")
        stamp = {"io.modelcontextprotocol/serverInfo": self.server_info}
        result["_meta"] = {**upstream_meta, **stamp} if isinstance(upstream_meta, dict) else stamp
        await _respond(send, {"jsonrpc": "2.0", "id": call.id, "result": result})
        return True, body


async def _respond(send: Send, message: dict[str, Any]) -> None:
    data = _encode(message)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": data})


def replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that yields an already-read body first, then whatever comes after it."""
    sent = False

    async def replayed() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
