"""What the SDK-served endpoints share to pass the Tasks extension through: params and the opt-in gate."""

from __future__ import annotations

from typing import Any

import mcp_types as types
from mcp.server import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ConfigDict

from mcpvisor.frontend.door.tasks import MISSING_CAPABILITY, TASKS, request_opts_in


class TaskParams(types.RequestParams):
    """tasks/get, tasks/update and tasks/cancel params: a task id, the rest forwarded as sent."""

    model_config = ConfigDict(extra="allow")

    taskId: str


def require_tasks(ctx: ServerRequestContext[Any]) -> None:
    """Refuse a tasks/* request whose client did not declare the extension on it (-32021).

    Tasks are handed out to 2026-07-28 clients only (the extension is defined for that version),
    so no handshake-era client holds a handle to ask about.
    """
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS and request_opts_in(ctx.params):
        return
    raise MCPError(
        code=MISSING_CAPABILITY,
        message=f"{ctx.method} needs the {TASKS} extension: declare it in the request's client capabilities",
        data={"requiredCapabilities": {"extensions": {TASKS: {}}}},
    )
