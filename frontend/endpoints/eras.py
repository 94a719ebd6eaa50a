"""What differs between the protocol eras, in one place: versions, methods, and the shape of results.

The handshake era (2024-11-05 to 2025-11-25) opens a session with `initialize`; the 2026-07-28 era
sends every request on its own with an envelope in `params._meta` (protocol version, client
capabilities and info) and no session. The same result is shaped for each: a 2026-07-28 result
carries `resultType`, lists and reads their cache hints (`ttlMs`, `cacheScope`) and every result
the server's identity in `_meta`; a handshake-era result carries none of them. Members a result
type of the client's era has not got are dropped at the top level; what is inside them is passed
through as it came (a gateway forwards, it does not rewrite).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
from msgspec import Raw

MODERN: Final = "2026-07-28"
MODERN_VERSIONS: Final = (MODERN,)
HANDSHAKE_VERSIONS: Final = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_HANDSHAKE: Final = "2025-11-25"
# What a handshake-era request without `MCP-Protocol-Version` is taken to speak (the spec's default).
DEFAULT_HANDSHAKE: Final = "2025-03-26"

ENVELOPE_PREFIX: Final = "io.modelcontextprotocol/"
PROTOCOL_KEY: Final = "io.modelcontextprotocol/protocolVersion"
CAPABILITIES_KEY: Final = "io.modelcontextprotocol/clientCapabilities"
CLIENT_INFO_KEY: Final = "io.modelcontextprotocol/clientInfo"
SERVER_INFO_KEY: Final = "io.modelcontextprotocol/serverInfo"
LOG_LEVEL_KEY: Final = "io.modelcontextprotocol/logLevel"
SUBSCRIPTION_ID_KEY: Final = "io.modelcontextprotocol/subscriptionId"

LOG_LEVELS: Final = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")

# The methods each era defines for a client to send (others are extensions: tasks/*).
HANDSHAKE_METHODS: Final = frozenset(
    {
        "initialize",
        "ping",
        "logging/setLevel",
        "completion/complete",
        "prompts/get",
        "prompts/list",
        "resources/list",
        "resources/read",
        "resources/subscribe",
        "resources/unsubscribe",
        "resources/templates/list",
        "tools/call",
        "tools/list",
    }
)
MODERN_METHODS: Final = frozenset(
    {
        "server/discover",
        "subscriptions/listen",
        "completion/complete",
        "prompts/get",
        "prompts/list",
        "resources/list",
        "resources/read",
        "resources/templates/list",
        "tools/call",
        "tools/list",
    }
)
SPEC_METHODS: Final = HANDSHAKE_METHODS | MODERN_METHODS
# Requests whose 2026-07-28 answer may be `input_required` (the client answers and asks again).
INPUT_REQUIRED_METHODS: Final = frozenset({"tools/call", "prompts/get", "resources/read"})
# Results a 2026-07-28 client may cache, as mcpvisor hints: never (lists change with every upstream).
CACHEABLE: Final = frozenset(
    {"tools/list", "resources/list", "resources/templates/list", "prompts/list", "resources/read", "server/discover"}
)
CORE_RESULT_TYPES: Final = frozenset({"complete", "input_required"})

_LISTED = frozenset({"nextCursor", "_meta"})
# The top-level members of each method's result in the handshake era.
_HANDSHAKE_FIELDS: Final[dict[str, frozenset[str]]] = {
    "tools/call": frozenset({"content", "structuredContent", "isError", "_meta"}),
    "tools/list": _LISTED | {"tools"},
    "resources/list": _LISTED | {"resources"},
    "resources/templates/list": _LISTED | {"resourceTemplates"},
    "prompts/list": _LISTED | {"prompts"},
    "resources/read": frozenset({"contents", "_meta"}),
    "prompts/get": frozenset({"description", "messages", "_meta"}),
    "completion/complete": frozenset({"completion", "_meta"}),
    "initialize": frozenset({"protocolVersion", "capabilities", "serverInfo", "instructions", "_meta"}),
}
_CACHED = frozenset({"resultType", "ttlMs", "cacheScope"})
_MODERN_FIELDS: Final[dict[str, frozenset[str]]] = {
    "tools/call": _HANDSHAKE_FIELDS["tools/call"] | {"resultType"},
    "tools/list": _HANDSHAKE_FIELDS["tools/list"] | _CACHED,
    "resources/list": _HANDSHAKE_FIELDS["resources/list"] | _CACHED,
    "resources/templates/list": _HANDSHAKE_FIELDS["resources/templates/list"] | _CACHED,
    "prompts/list": _HANDSHAKE_FIELDS["prompts/list"] | _CACHED,
    "resources/read": _HANDSHAKE_FIELDS["resources/read"] | _CACHED,
    "prompts/get": _HANDSHAKE_FIELDS["prompts/get"] | {"resultType"},
    "completion/complete": _HANDSHAKE_FIELDS["completion/complete"] | {"resultType"},
    "server/discover": frozenset({"supportedVersions", "capabilities", "instructions", "_meta"}) | _CACHED,
    "subscriptions/listen": frozenset({"_meta", "resultType"}),
}
_INPUT_REQUIRED_FIELDS: Final = frozenset({"inputRequests", "requestState", "_meta", "resultType"})
# A 2026-07-28 tool definition has no `execution` (the 2025-11-25 task hint).
_MODERN_TOOL_DROPS: Final = frozenset({"execution"})

_decode_members = msgspec.json.Decoder(dict[str, Raw])
_decode_meta = msgspec.json.Decoder(dict[str, Any])
_encode = msgspec.json.encode
_COMPLETE = Raw(b'"complete"')
_NO_TTL = Raw(b"0")
_PRIVATE = Raw(b'"private"')


def is_modern(version: str) -> bool:
    return version in MODERN_VERSIONS


def serves(version: str, method: str) -> bool:
    """Whether `method` is one this era defines (False for extension methods)."""
    return method in (MODERN_METHODS if version in MODERN_VERSIONS else HANDSHAKE_METHODS)


class BadResult(Exception):
    """A result that is not a JSON object: it cannot be shaped for a client."""


def shape(method: str, version: str, result: bytes | dict[str, Any], server_info: bytes | None) -> bytes:
    """`result` as a client of `version` gets it for `method`, encoded.

    `server_info` is the encoded `serverInfo` stamped into a 2026-07-28 result's `_meta`
    (unless the result names one already).
    """
    if isinstance(result, bytes):
        try:
            members: dict[str, Any] = _decode_members.decode(result)
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise BadResult("the result is not a JSON object") from None
    else:
        members = result
    if version not in MODERN_VERSIONS:
        allowed = _HANDSHAKE_FIELDS.get(method)
        if allowed is not None and not members.keys() <= allowed:
            members = {key: value for key, value in members.items() if key in allowed}
        elif isinstance(result, bytes):
            return result.strip()
        return _encode(members)
    result_type = members.get("resultType")
    kind = _text(result_type)
    if kind is not None and kind not in CORE_RESULT_TYPES:
        pass  # an extension's own result (a Tasks extension's task): its shape is the extension's
    elif kind == "input_required" and method in INPUT_REQUIRED_METHODS:
        members = {key: value for key, value in members.items() if key in _INPUT_REQUIRED_FIELDS}
    else:
        allowed = _MODERN_FIELDS.get(method)
        if allowed is not None:
            members = {key: value for key, value in members.items() if key in allowed}
        if method in CACHEABLE:
            members.setdefault("ttlMs", _NO_TTL)
            members.setdefault("cacheScope", _PRIVATE)
        members["resultType"] = _COMPLETE if result_type is None else result_type
    if server_info is not None:
        members["_meta"] = _stamped(members.get("_meta"), server_info)
    return _encode(members)


def _text(value: Any) -> str | None:
    if isinstance(value, Raw):
        try:
            decoded = msgspec.json.decode(value)
        except msgspec.DecodeError:
            return None
        return decoded if isinstance(decoded, str) else None
    return value if isinstance(value, str) else None


def _stamped(meta: Any, server_info: bytes) -> Any:
    """A result's `_meta` with the server's identity in it (a value the result set wins)."""
    stamp = Raw(server_info)
    if meta is None:
        return {SERVER_INFO_KEY: stamp}
    if isinstance(meta, Raw):
        try:
            meta = _decode_meta.decode(meta)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return meta  # not an object: the result's own, left as it is
    if isinstance(meta, dict) and meta.get(SERVER_INFO_KEY) is None:
        return {**meta, SERVER_INFO_KEY: stamp}
    return meta


def tool_definitions(tools: list[dict[str, Any]], version: str) -> list[dict[str, Any]]:
    """Tool definitions as a client of `version` lists them."""
    if version not in MODERN_VERSIONS or not any(_MODERN_TOOL_DROPS & tool.keys() for tool in tools):
        return tools
    return [{key: value for key, value in tool.items() if key not in _MODERN_TOOL_DROPS} for tool in tools]


def meta_of(params: dict[str, Raw]) -> dict[str, Any]:
    """A request's `_meta`, decoded (empty when absent); msgspec errors when it is not an object."""
    raw = params.get("_meta")
    if raw is None:
        return {}
    decoded = _decode_meta.decode(raw)
    return decoded


def forwarded_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """`_meta` without the client's own envelope keys, which describe its connection to mcpvisor."""
    return {key: value for key, value in meta.items() if not key.startswith(ENVELOPE_PREFIX)}


def is_tool_result(result: dict[str, Any]) -> bool:
    """Whether one of mcpvisor's own results is a tool result (else a bug of mcpvisor's, answered
    as an internal error rather than sent)."""
    content, is_error = result.get("content"), result.get("isError", False)
    if not isinstance(content, list) or not all(isinstance(block, dict) for block in content):
        return False
    return isinstance(is_error, bool) and isinstance(result.get("structuredContent", {}), dict)


def local_tool_result(version: str, result: dict[str, Any], server_info: bytes | None = None) -> bytes | None:
    """One of mcpvisor's own tools' results as a client of `version` gets it; None for one that is not one."""
    return shape("tools/call", version, result, server_info) if is_tool_result(result) else None
