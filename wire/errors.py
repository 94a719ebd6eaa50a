"""Error codes carried on the wire, and how each reaches an MCP client."""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    """Why a routed request failed. Values are stable: they cross process boundaries."""

    UNKNOWN_TOOL = 1
    UNKNOWN_SERVER = 2
    SERVER_UNAVAILABLE = 3  # worker not running, or upstream not ready
    TIMEOUT = 4
    BUSY = 5  # in-flight bound reached
    CANCELLED = 6
    UPSTREAM_ERROR = 7  # the upstream answered with a JSON-RPC error; `mcp_code` holds its code
    UPSTREAM_GONE = 8  # the upstream connection or the worker died while the call was in flight
    BAD_REQUEST = 9
    INTERNAL = 10
    FORBIDDEN = 11
    LOGIN_REQUIRED = 12  # the upstream needs this tenant to connect its account (`SERVER:login`)


# JSON-RPC codes (MCP specification): what a client sees for each failure.
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
METHOD_NOT_FOUND = -32601
# Implementation-defined server errors live in -32000..-32099.
SERVER_ERROR = -32000
REQUEST_TIMEOUT = -32001

JSONRPC_CODE = {
    ErrorCode.UNKNOWN_TOOL: INVALID_PARAMS,
    ErrorCode.UNKNOWN_SERVER: INVALID_PARAMS,
    ErrorCode.SERVER_UNAVAILABLE: SERVER_ERROR,
    ErrorCode.TIMEOUT: REQUEST_TIMEOUT,
    ErrorCode.BUSY: SERVER_ERROR,
    ErrorCode.CANCELLED: SERVER_ERROR,
    ErrorCode.UPSTREAM_ERROR: SERVER_ERROR,
    ErrorCode.UPSTREAM_GONE: SERVER_ERROR,
    ErrorCode.BAD_REQUEST: INVALID_PARAMS,
    ErrorCode.INTERNAL: INTERNAL_ERROR,
    ErrorCode.FORBIDDEN: SERVER_ERROR,
    ErrorCode.LOGIN_REQUIRED: SERVER_ERROR,
}


class WireError(Exception):
    """A failure with a wire code and a message that is safe to show a client."""

    def __init__(self, code: ErrorCode, message: str, *, mcp_code: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.mcp_code = mcp_code

    @property
    def jsonrpc_code(self) -> int:
        """The JSON-RPC code a client sees: the upstream's own where it gave one."""
        if self.code is ErrorCode.UPSTREAM_ERROR and self.mcp_code is not None:
            return self.mcp_code
        return JSONRPC_CODE[self.code]
