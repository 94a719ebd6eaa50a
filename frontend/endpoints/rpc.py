"""JSON-RPC 2.0 as MCP clients speak it: one envelope decoded once, answers encoded once.

A request's `params` are kept as their members' raw JSON (`dict[str, msgspec.Raw]`): the engine
decodes what it reads (`_meta`, a tool's name, a cursor) and forwards the rest as the client wrote
it. Results travel as JSON bytes from the upstream to the client; only their top level is looked at.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
from msgspec import UNSET, Raw, UnsetType

# JSON-RPC and MCP error codes.
PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
SERVER_ERROR: Final = -32000  # implementation-defined: the server cannot take the request now
HEADER_MISMATCH: Final = -32020  # 2026-07-28: routing headers disagree with the body
MISSING_CAPABILITY: Final = -32021  # 2026-07-28: the request lacks a client capability it needs
UNSUPPORTED_VERSION: Final = -32022  # 2026-07-28: the envelope's protocol version is not served
REQUEST_CANCELLED: Final = -32800  # handshake era: a request that settled cancelled
CONNECTION_CLOSED: Final = -32000

# What HTTP status a 2026-07-28 error answer carries (others: 200).
HTTP_STATUS: Final[dict[int, int]] = {
    PARSE_ERROR: 400,
    INVALID_REQUEST: 400,
    INVALID_PARAMS: 400,
    HEADER_MISMATCH: 400,
    MISSING_CAPABILITY: 400,
    UNSUPPORTED_VERSION: 400,
    METHOD_NOT_FOUND: 404,
}

RequestId = int | str


class RpcError(Exception):
    """A JSON-RPC error answer: code, message (safe to show a client) and optional data."""

    def __init__(self, code: int, message: str, data: Any = UNSET) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def error(self) -> dict[str, Any]:
        found: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not UNSET:
            found["data"] = self.data
        return found


def invalid_params(message: str = "Invalid request parameters", data: Any = "") -> RpcError:
    """The answer to params that do not fit the method (the SDK's words, for clients that match them)."""
    return RpcError(INVALID_PARAMS, message, data)


def method_not_found(method: str) -> RpcError:
    return RpcError(METHOD_NOT_FOUND, "Method not found", method)


class Envelope(msgspec.Struct):
    """One JSON-RPC message, whichever kind: the members present tell a request from the others."""

    jsonrpc: str | UnsetType = UNSET
    id: int | str | UnsetType | None = UNSET
    method: str | UnsetType = UNSET
    params: dict[str, Raw] | UnsetType | None = UNSET
    result: Raw | UnsetType = UNSET
    error: Raw | UnsetType = UNSET

    @property
    def is_request(self) -> bool:
        return self.method is not UNSET and self.id is not UNSET and self.id is not None

    @property
    def is_notification(self) -> bool:
        return self.method is not UNSET and self.id is UNSET

    @property
    def is_answer(self) -> bool:
        """A response or an error for a request the server sent (sampling, elicitation, roots)."""
        return self.method is UNSET and (self.result is not UNSET or self.error is not UNSET)

    def members(self) -> dict[str, Raw]:
        return self.params if isinstance(self.params, dict) else {}


class ErrorBody(msgspec.Struct):
    code: int
    message: str = ""
    data: Any = None


_decode_envelope = msgspec.json.Decoder(Envelope)
_decode_any = msgspec.json.Decoder()
_decode_error = msgspec.json.Decoder(ErrorBody)
encode = msgspec.json.encode


def decode_envelope(body: bytes) -> Envelope:
    """The message in `body`; msgspec.DecodeError (not JSON) or msgspec.ValidationError (not one message)."""
    return _decode_envelope.decode(body)


def decode_error(raw: Raw) -> ErrorBody | None:
    try:
        return _decode_error.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def member(params: dict[str, Raw], name: str, decoder: msgspec.json.Decoder[Any] = _decode_any) -> Any:
    """One member of a request's params, decoded; UNSET when absent."""
    raw = params.get(name)
    if raw is None:
        return UNSET
    return decoder.decode(raw)


def result_message(request_id: RequestId | None, result: bytes) -> bytes:
    """A JSON-RPC response around a result that is already JSON."""
    return b'{"jsonrpc":"2.0","id":' + encode(request_id) + b',"result":' + result + b"}"


def error_message(request_id: RequestId | None, error: RpcError) -> bytes:
    return encode({"jsonrpc": "2.0", "id": request_id, "error": error.error()})


def notification_message(method: str, params: bytes | None) -> bytes:
    head = b'{"jsonrpc":"2.0","method":' + encode(method)
    return head + (b',"params":' + params + b"}" if params is not None else b"}")


def request_message(request_id: RequestId, method: str, params: bytes | None) -> bytes:
    head = b'{"jsonrpc":"2.0","id":' + encode(request_id) + b',"method":' + encode(method)
    return head + (b',"params":' + params + b"}" if params is not None else b"}")
