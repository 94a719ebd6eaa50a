"""What the SDK-served MCP endpoints share: the server class and its middleware."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import mcp_types as types
import msgspec
from mcp.server import NotificationOptions, Server
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.models import InitializationOptions
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError, NoBackChannelError
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from mcpvisor.frontend.door.calls import AskFailed, Caller
from mcpvisor.frontend.door.rounds import ROUND_TTL
from mcpvisor.frontend.door.tasks import request_opts_in
from mcpvisor.frontend.door.upstreams import NotFound, UpstreamError
from mcpvisor.frontend.endpoints.rpc import RpcError
from mcpvisor.frontend.gate.activity import trace_context
from mcpvisor.frontend.unsieved import KeepUnsieved


class DoorErrors:
    """Server middleware: the door's errors become JSON-RPC errors with their own code and message."""

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        try:
            return await call_next(ctx)
        except (NotFound, UpstreamError) as exc:
            raise MCPError(code=exc.code, message=exc.message) from None
        except RpcError as exc:
            raise MCPError(code=exc.code, message=exc.message, data=exc.data or None) from None


class AnnouncingServer(Server[Any]):
    """An SDK server that tells clients its lists change (they do, whenever an upstream's does)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The SDK's OpenTelemetry middleware opens a span per message even with no exporter
        # installed; on a proxy's hot path that is pure cost. The boundary seals the
        # `requestState` of 2026-07-28 calls carried over rounds (see frontend/door/rounds.py).
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


# The client requests an upstream may put to a client during its call, with the SDK's types.
_ASKS: dict[str, tuple[type[Any], type[Any]]] = {
    "sampling/createMessage": (types.CreateMessageRequest, types.CreateMessageResult),
    "elicitation/create": (types.ElicitRequest, types.ElicitResult),
    "roots/list": (types.ListRootsRequest, types.ListRootsResult),
}


class SdkRequester:
    """A request the SDK's server serves, as the door's `Requester` (until the engine serves every request)."""

    def __init__(self, ctx: ServerRequestContext[Any]) -> None:
        self.ctx = ctx
        raw = getattr(ctx, "params", None)
        self._params: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}

    @property
    def caller(self) -> Caller:
        meta = self._params.get("_meta") if isinstance(self._params.get("_meta"), Mapping) else {}
        request = getattr(self.ctx, "request", None)
        headers = getattr(request, "headers", None) or {}
        path = getattr(getattr(request, "url", None), "path", "") or ""
        parent, state = trace_context(meta or {}, headers)
        params = self.ctx.session.client_params
        name = params.client_info.name if params is not None and params.client_info is not None else ""
        if not name and isinstance(info := (meta or {}).get("io.modelcontextprotocol/clientInfo"), Mapping):
            name = info.get("name") if isinstance(info.get("name"), str) else ""
        return Caller(
            client=name or "",
            endpoint=path.rstrip("/") or "",
            protocol=self.ctx.protocol_version or "",
            traceparent=parent,
            tracestate=state,
        )

    @property
    def modern(self) -> bool:
        return self.ctx.protocol_version in MODERN_PROTOCOL_VERSIONS

    @property
    def progress_token(self) -> str | int | None:
        meta = getattr(self.ctx, "meta", None)
        if not meta:
            return None
        return meta.get("progress_token", meta.get("progressToken"))

    @property
    def carried(self) -> dict[str, Any]:
        return {
            key: self._params[key] for key in ("requestState", "inputResponses") if self._params.get(key) is not None
        }

    def declares(self, capability: str, detail: str | None = None) -> bool:
        if capability == "extensions":
            return self.modern and request_opts_in(self._params)
        capabilities = self.ctx.session.client_capabilities
        found = getattr(capabilities, capability, None) if capabilities is not None else None
        return found is not None and (detail is None or getattr(found, detail, None) is not None)

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        await self.ctx.session.report_progress(progress, total, message)

    async def log(self, params: dict[str, Any]) -> bool:
        if not self.modern:
            return False
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            await self.ctx.session.send_log_message(
                params.get("level", "info"), params.get("data"), logger=params["logger"]
            )
        return True

    async def ask(self, method: str, params: dict[str, Any]) -> bytes:
        request_type, result_type = _ASKS[method]
        try:
            request = request_type.model_validate({"method": method, "params": params or None}, by_name=False)
            result = await self.ctx.session.send_request(
                request, result_type, metadata=ServerMessageMetadata(related_request_id=self.ctx.request_id)
            )
        except MCPError as exc:
            raise AskFailed(exc.code, exc.message) from None
        except NoBackChannelError:
            raise AskFailed(types.INVALID_REQUEST, f"the client has no channel for {method}") from None
        except ValidationError as exc:
            raise AskFailed(types.INVALID_PARAMS, f"invalid {method}: {exc}") from None
        return msgspec.json.encode(result.model_dump(by_alias=True, mode="json", exclude_none=True))

    async def tell(self, method: str, params: dict[str, Any] | None) -> None:
        connection = getattr(self.ctx.session, "_connection", None)
        if connection is not None:
            await connection.notify(method, params)
