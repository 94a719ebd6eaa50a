"""The short way for the commonest requests of 2026-07-28 clients on `/mcp/direct`.

A stateless 2026-07-28 call of an upstream tool, with no progress or log opt-in, is a plain
request-response: this module answers it without the SDK's server, decoding the envelope with
msgspec and passing the upstream's result through as it came, with the fields the protocol adds.
`tools/list`, `prompts/list` and `resources/list` are answered from pages encoded once per change
of what clients see (frontend/endpoints/listings.py).
An endpoint's own tools that need nothing of the SDK (`retrieve_tools` on `/mcp`) are answered
by their handler, the result shaped as the SDK's server shapes it.
Everything else (another era, another method, progress, logs, a client that can be asked for
sampling, elicitation or roots, Mcp-Param headers, a management tool, a bad cursor, anything
malformed or unusual) falls through to the SDK, which also produces every error a
malformed request deserves. The SDK's client checks what this returns in the test suite, in both
eras, against every upstream the tests use (tests/e2e/test_short_paths.py).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from fnmatch import fnmatch
from typing import Any

import msgspec
from mcp_types.methods import serialize_server_result
from pydantic import ValidationError

from mcpvisor.frontend.door.forwarding import ENVELOPE_PREFIX
from mcpvisor.frontend.door.tasks import declares_tasks
from mcpvisor.frontend.door.upstreams import NotFound, Refused, UpstreamError, Upstreams
from mcpvisor.frontend.endpoints.listings import Listing
from mcpvisor.wire.errors import INTERNAL_ERROR

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
# An endpoint's own tool answered on the short paths: arguments in, a CallToolResult wire dict out.
LocalTool = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]

MODERN = "2026-07-28"
_PROTOCOL_KEY = "io.modelcontextprotocol/protocolVersion"
_CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
# Keys of `_meta` that ask for more than a plain answer: progress or log delivery on a stream.
_STREAMING_META = ("progressToken", "io.modelcontextprotocol/logLevel")
_ASKABLE = ("sampling", "elicitation", "roots")
_METHODS = ("tools/call", "tools/list", "prompts/list", "resources/list")
# What the SDK adds to every list result of /mcp/direct: complete, not to be cached (direct.CACHE_HINTS).
_LIST_PREFIX = b'"resultType":"complete","cacheScope":"private","ttlMs":0,'


class CallParams(msgspec.Struct, forbid_unknown_fields=True):
    """The params of a plain tools/call, as both short paths read them."""

    name: str
    arguments: msgspec.Raw = msgspec.Raw(b"{}")  # forwarded as the client wrote it
    _meta: dict[str, Any] = msgspec.field(default_factory=dict, name="_meta")


class _Call(msgspec.Struct, forbid_unknown_fields=True):
    jsonrpc: str
    id: int | str
    method: str
    params: CallParams


class ListParams(msgspec.Struct, forbid_unknown_fields=True):
    """The params of a list request, as both short paths read them."""

    cursor: str | None = None
    _meta: dict[str, Any] = msgspec.field(default_factory=dict, name="_meta")


class _ListCall(msgspec.Struct, forbid_unknown_fields=True):
    jsonrpc: str
    id: int | str
    method: str
    params: ListParams | None = None


_decode_list = msgspec.json.Decoder(_ListCall)
_decode_call = msgspec.json.Decoder(_Call)
_decode_result = msgspec.json.Decoder(Any)
_encode = msgspec.json.encode


class FastPath:
    """Answers the requests it can; returns False for the rest, which the SDK then serves."""

    def __init__(
        self,
        upstreams: Upstreams,
        *,
        max_body: int,
        allowed_hosts: list[str] | None,
        allowed_origins: list[str] | None,
        server_info: dict[str, str],
        listings: Mapping[str, Listing] | None = None,
        local_tools: Mapping[str, LocalTool] | None = None,
        upstream_tools: bool = True,
    ) -> None:
        self.upstreams = upstreams
        self.listings: Mapping[str, Listing] = listings or {}
        self.local_tools: Mapping[str, LocalTool] = local_tools or {}
        self.upstream_tools = upstream_tools  # other names are upstream tools (else the SDK's)
        self.max_body = max_body
        self.allowed_hosts = allowed_hosts
        self.allowed_origins = allowed_origins
        self.server_info = server_info
        self._stamp_fields = {"io.modelcontextprotocol/serverInfo": server_info}
        self._stamp = _encode(self._stamp_fields)

    def _eligible(self, scope: Scope) -> dict[str, str] | None:
        """The request's headers when it may take the short way, else None."""
        if scope["method"] != "POST":
            return None
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        if headers.get("mcp-protocol-version") != MODERN or headers.get("mcp-method") not in _METHODS:
            return None
        if "application/json" not in headers.get("accept", "") or not headers.get("content-type", "").startswith(
            "application/json"
        ):
            return None
        if any(name.startswith("mcp-param-") for name in headers):
            return None
        if not admitted(headers, self.max_body, self.allowed_hosts, self.allowed_origins):
            return None
        return headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> tuple[bool, bytes]:
        """(answered, body read): when not answered, the body must be replayed to the SDK."""
        headers = self._eligible(scope)
        if headers is None:
            return False, b""
        mcp_name = headers.get("mcp-name")
        complete, body = await read_body(receive, self.max_body)
        if not complete:
            return False, body
        if headers["mcp-method"] != "tools/call":
            return await self._list(headers["mcp-method"], body, send), body
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
            # the SDK's server carries (frontend/door/rounds.py).
            or any(meta[_CAPABILITIES_KEY].get(name) is not None for name in _ASKABLE)
            or declares_tasks(meta[_CAPABILITIES_KEY])  # its task handles are routed on the SDK path
            or any(key in meta for key in _STREAMING_META)
            or (mcp_name is not None and mcp_name != call.params.name)
        ):
            return False, body
        arguments = bytes(call.params.arguments)
        if arguments.lstrip()[:1] != b"{":
            return False, body  # the SDK explains arguments that are not an object
        local = self.local_tools.get(call.params.name)
        if local is not None:
            result = await local(_decode_result.decode(arguments))
            await _respond(send, self._local_result(call.id, result))
            return True, body
        if not self.upstream_tools:
            return False, body
        try:
            target = self.upstreams.find_tool(call.params.name)
        except NotFound:
            return False, body  # the SDK path explains unknown names
        params: dict[str, Any] = {"name": target.tool, "arguments": call.params.arguments}
        forwarded_meta = {key: value for key, value in meta.items() if not key.startswith(ENVELOPE_PREFIX)}
        if forwarded_meta:
            params["_meta"] = forwarded_meta
        try:
            raw = await self.upstreams.call_tool(target, params, via="direct")
            assert isinstance(raw, bytes)  # only a client's call can be carried over rounds
            message = self._result(call.id, raw)
        except Refused as refused:
            message = self._result(call.id, _encode(refused.answer))
        except UpstreamError as exc:
            message = _encode({"jsonrpc": "2.0", "id": call.id, "error": {"code": exc.code, "message": exc.message}})
        except _BadResult as exc:
            error = {"code": INTERNAL_ERROR, "message": f"Tool '{call.params.name}': server '{target.server}' {exc}"}
            message = _encode({"jsonrpc": "2.0", "id": call.id, "error": error})
        await _respond(send, message)
        return True, body

    async def _list(self, method: str, body: bytes, send: Send) -> bool:
        """A 2026-07-28 list request answered from its cached page; False when the SDK must answer."""
        listing = self.listings.get(method)
        if listing is None:
            return False
        try:
            request = _decode_list.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return False
        params = request.params or ListParams()
        meta = params._meta
        if (
            request.jsonrpc != "2.0"
            or request.method != method
            or meta.get(_PROTOCOL_KEY) != MODERN
            or not isinstance(meta.get(_CAPABILITIES_KEY), dict)
            or any(meta[_CAPABILITIES_KEY].get(name) is not None for name in _ASKABLE)
            or any(key in meta for key in _STREAMING_META)
        ):
            return False
        result = listing.result(params.cursor, MODERN, prefix=_LIST_PREFIX, suffix=b',"_meta":' + self._stamp)
        if result is None:
            return False
        await _respond(send, b'{"jsonrpc":"2.0","id":' + _encode(request.id) + b',"result":' + result + b"}")
        return True

    def _local_result(self, request_id: int | str, result: dict[str, Any]) -> bytes:
        """The JSON-RPC response carrying a local tool's result, as the SDK's server sends it."""
        head = b'{"jsonrpc":"2.0","id":' + _encode(request_id) + b","
        shaped = shaped_result(MODERN, result)
        if shaped is None:
            error = {"code": INTERNAL_ERROR, "message": "Internal error: the tool's result could not be sent"}
            return head + b'"error":' + _encode(error) + b"}"
        meta = shaped.get("_meta")
        shaped["_meta"] = {**(meta if isinstance(meta, dict) else {}), **self._stamp_fields}
        return head + b'"result":' + _encode(shaped) + b"}"

    def _result(self, request_id: int | str, raw: bytes) -> bytes:
        """The JSON-RPC response carrying an upstream's result, with the fields 2026-07-28 adds.

        Usually spliced around the upstream's bytes as they came; decoded and encoded again only
        when the upstream set `_meta` or `resultType` itself, which must be merged.
        """
        try:
            fields = _decode_fields.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise _BadResult("sent a tools/call result that is not valid JSON") from None
        if "content" not in fields or bytes(fields["content"]).lstrip()[:1] != b"[":
            raise _BadResult("sent a tools/call result without content")
        envelope = b'{"jsonrpc":"2.0","id":' + _encode(request_id) + b',"result":'
        if fields.keys() <= _PLAIN_FIELDS:
            body = raw.strip()
            return envelope + b'{"resultType":"complete","_meta":' + self._stamp + b"," + body[1:] + b"}"
        # The SDK's server drops fields the protocol has not got; `_meta` and `resultType` merge.
        result: dict[str, Any] = {key: value for key, value in fields.items() if key in _RESULT_FIELDS}
        result.setdefault("resultType", msgspec.Raw(b'"complete"'))
        stamp = {"io.modelcontextprotocol/serverInfo": self.server_info}
        upstream_meta = _decode_result.decode(fields["_meta"]) if "_meta" in fields else None
        result["_meta"] = {**upstream_meta, **stamp} if isinstance(upstream_meta, dict) else stamp
        return envelope + _encode(result) + b"}"


_PLAIN_FIELDS = frozenset({"content", "structuredContent", "isError"})
_RESULT_FIELDS = _PLAIN_FIELDS | {"_meta", "resultType"}
_decode_fields = msgspec.json.Decoder(dict[str, msgspec.Raw])


def shaped_result(version: str, result: dict[str, Any]) -> dict[str, Any] | None:
    """A tools/call result as the SDK's server sends it to a client of `version` (the same check and
    sieve); None for one it would refuse."""
    plain = _plain_shape(version, result)
    if plain is not None:
        return plain
    try:
        return serialize_server_result("tools/call", version, result)
    except (ValidationError, KeyError):
        log.exception("a local tool returned a result that cannot be sent")
        return None


# Versions whose tools/call results carry `structuredContent`; the last also `resultType`.
_STRUCTURED_VERSIONS = frozenset({"2025-06-18", "2025-11-25", MODERN})
_LOCAL_FIELDS = frozenset({"content", "structuredContent", "isError", "resultType"})


def _plain_shape(version: str, result: dict[str, Any]) -> dict[str, Any] | None:
    """What the SDK's serializer makes of the usual local result (text blocks, structured content),
    without its models; None for anything else, which the serializer then shapes."""
    if version not in _STRUCTURED_VERSIONS or not result.keys() <= _LOCAL_FIELDS:
        return None
    content, is_error = result.get("content"), result.get("isError", False)
    if not isinstance(content, list) or not isinstance(is_error, bool):
        return None
    for block in content:
        if not isinstance(block, dict) or block.keys() != {"type", "text"} or block["type"] != "text":
            return None
        if not isinstance(block["text"], str):
            return None
    if result.get("resultType", "complete") != "complete":
        return None
    shaped: dict[str, Any] = {"content": content}
    if "isError" in result:
        shaped["isError"] = is_error
    if version == MODERN:
        shaped["resultType"] = "complete"
    if "structuredContent" in result:
        if not isinstance(result["structuredContent"], dict):
            return None
        shaped["structuredContent"] = result["structuredContent"]
    return shaped


class _BadResult(Exception):
    """An upstream's tools/call result that cannot be forwarded."""


async def _respond(send: Send, data: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": data})


def admitted(
    headers: Mapping[str, str], max_body: int, allowed_hosts: list[str] | None, allowed_origins: list[str] | None
) -> bool:
    """A declared body within the limit, and the Host and Origin the SDK's transport would accept."""
    length = headers.get("content-length")
    if length is None or not length.isdigit() or int(length) > max_body:
        return False
    if allowed_hosts is not None and not any(fnmatch(headers.get("host", ""), p) for p in allowed_hosts):
        return False
    origin = headers.get("origin")
    return origin is None or allowed_origins is None or any(fnmatch(origin, p) for p in allowed_origins)


async def read_body(receive: Receive, max_body: int) -> tuple[bool, bytes]:
    """(whole body read within `max_body`, what was read): when not whole, replay what was read."""
    body = b""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return False, body
        body += message.get("body", b"")
        if len(body) > max_body:
            return False, body
        if not message.get("more_body"):
            return True, body
