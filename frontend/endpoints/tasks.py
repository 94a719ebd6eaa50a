"""What the SDK-served endpoints share to pass the Tasks extension through: params and the opt-in gate."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import mcp_types as types
from mcp.server import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_NAME_HEADER, decode_header_value
from mcp_types import HEADER_MISMATCH
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ConfigDict

from mcpvisor.frontend.door.tasks import MISSING_CAPABILITY, TASKS, request_opts_in
from mcpvisor.frontend.door.upstreams import UpstreamError

REQUIRED = {"requiredCapabilities": {"extensions": {TASKS: {}}}}


class TaskParams(types.RequestParams):
    """tasks/get, tasks/update and tasks/cancel params: a task id, the rest forwarded as sent."""

    model_config = ConfigDict(extra="allow")

    taskId: str


def check_task_request(ctx: ServerRequestContext[Any], task_id: str) -> None:
    """Refuse a tasks/* request whose `Mcp-Name` names another task (-32020, HTTP 400) or whose
    client did not declare the extension on it (-32021).

    The SDK checks `Mcp-Name` only for the methods it knows. A request without the header is let
    through, as for clients that predate the extension's routing headers. Tasks are handed out to
    2026-07-28 clients only (the extension is defined for that version), so no handshake-era
    client holds a handle to ask about.
    """
    headers = getattr(ctx.request, "headers", None)  # the HTTP request's, when it came over HTTP
    named = decode_header_value(headers.get(MCP_NAME_HEADER)) if headers is not None else None
    if named is not None and named.strip() != task_id:
        raise MCPError(code=HEADER_MISMATCH, message=f"{MCP_NAME_HEADER} header does not match the request's taskId")
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS and request_opts_in(ctx.params):
        return
    raise MCPError(
        code=MISSING_CAPABILITY,
        message=f"{ctx.method} needs the {TASKS} extension: declare it in the request's client capabilities",
        data=REQUIRED,
    )


def call_refused(exc: UpstreamError, definition: Mapping[str, Any]) -> MCPError:
    """A failed tools/call as the client gets it: a task-only tool's -32021 names the extension.

    The worker carries an upstream's error code and message, not its `data`; for a tool whose
    definition requires a task, the capability it misses is known here.
    """
    execution = definition.get("execution")
    required = isinstance(execution, Mapping) and execution.get("taskSupport") == "required"
    data = REQUIRED if exc.code == MISSING_CAPABILITY and required else None
    return MCPError(code=exc.code, message=exc.message, data=data)
