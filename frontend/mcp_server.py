"""What both SDK-served MCP endpoints share: the server class, and params and results as forwarded."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
from mcp.server import NotificationOptions, Server
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.models import InitializationOptions
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.shared.exceptions import MCPError

from mcpvisor.frontend.rounds import ROUND_TTL
from mcpvisor.frontend.unsieved import KeepUnsieved
from mcpvisor.frontend.upstreams import NotFound, UpstreamError

# `_meta` keys that describe the client's own connection to mcpvisor (the 2026-07-28 envelope):
# they must not reach an upstream, whose connection is the worker's.
ENVELOPE_PREFIX = "io.modelcontextprotocol/"

_decode = msgspec.json.Decoder(dict[str, Any])


def forwardable(params: Any, ctx: Any = None) -> dict[str, Any]:
    """Request params as wire JSON for an upstream, without the client's connection envelope.

    The params exactly as the client sent them (`ctx.params`, already validated by the SDK) are
    preferred to a dump of the parsed model: cheaper, and nothing the client sent is lost.
    """
    raw = getattr(ctx, "params", None)
    if isinstance(raw, Mapping):
        data: dict[str, Any] = dict(raw)
    else:
        data = params.model_dump(by_alias=True, mode="json", exclude_none=True)
    meta = data.get("_meta")
    if meta:
        meta = {key: value for key, value in meta.items() if not key.startswith(ENVELOPE_PREFIX)}
        if meta:
            data["_meta"] = meta
        else:
            del data["_meta"]
    return data


def complete(result: dict[str, Any]) -> dict[str, Any]:
    """Mark a result as final; 2026-07-28 clients require `resultType`, older ones drop it."""
    result.setdefault("resultType", "complete")
    return result


def decoded(result: bytes | dict[str, Any]) -> dict[str, Any]:
    """An upstream's result for the SDK, which answers with a dict (an input_required one already is)."""
    return result if isinstance(result, dict) else complete(_decode.decode(result))


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
        # `requestState` of 2026-07-28 calls carried over rounds (see frontend/rounds.py).
        security = RequestStateSecurity.ephemeral(ttl=ROUND_TTL)
        self.middleware = [
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
