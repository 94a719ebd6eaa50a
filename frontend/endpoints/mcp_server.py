"""What the SDK-served MCP endpoints share: the server class and its middleware."""

from __future__ import annotations

from typing import Any

from mcp.server import NotificationOptions, Server
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.models import InitializationOptions
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.shared.exceptions import MCPError

from mcpvisor.frontend.door.rounds import ROUND_TTL
from mcpvisor.frontend.door.upstreams import NotFound, UpstreamError
from mcpvisor.frontend.spans import RequestSpans
from mcpvisor.frontend.unsieved import KeepUnsieved
from mcpvisor.runtime import telemetry


class DoorErrors:
    """Server middleware: the door's errors become JSON-RPC errors with their own code and message."""

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        try:
            return await call_next(ctx)
        except (NotFound, UpstreamError) as exc:
            raise MCPError(code=exc.code, message=exc.message) from None


class AnnouncingServer(Server[Any]):
    """An SDK server that tells clients its lists change (they do, whenever an upstream's does)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The SDK's OpenTelemetry middleware opens a span per message even with no exporter
        # installed; on a proxy's hot path that is pure cost. The boundary seals the
        # `requestState` of 2026-07-28 calls carried over rounds (see frontend/door/rounds.py).
        security = RequestStateSecurity.ephemeral(ttl=ROUND_TTL)
        self.middleware = [
            *([RequestSpans()] if telemetry.active is not None else []),  # mcpvisor's own spans (frontend/spans.py)
            RequestStateBoundary(security, default_audience="mcpvisor"),
            KeepUnsieved(),
            DoorErrors(),
        ]

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options
            or NotificationOptions(prompts_changed=True, resources_changed=True, tools_changed=True),
            experimental_capabilities,
            extensions,
        )
