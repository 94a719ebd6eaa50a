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
