"""One client's call in flight: where the upstream's progress, logs and questions go back to."""

from __future__ import annotations

import logging
import secrets
import warnings
from typing import Any, Protocol

import mcp_types as types
import msgspec
import trio
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError, NoBackChannelError
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

log = logging.getLogger(__name__)

_decode = msgspec.json.Decoder(dict[str, Any])
_encode = msgspec.json.encode

# Server-to-client requests a client can be asked during its call, with what it must support.
_ASKS: dict[str, tuple[type[Any], type[Any], types.ClientCapabilities]] = {
    "sampling/createMessage": (
        types.CreateMessageRequest,
        types.CreateMessageResult,
        types.ClientCapabilities(sampling=types.SamplingCapability()),
    ),
    "elicitation/create": (
        types.ElicitRequest,
        types.ElicitResult,
        types.ClientCapabilities(elicitation=types.ElicitationCapability()),
    ),
    "roots/list": (
        types.ListRootsRequest,
        types.ListRootsResult,
        types.ClientCapabilities(roots=types.RootsCapability()),
    ),
}


class AskFailed(Exception):
    """The client cannot or did not answer; `code` and `message` go back to the upstream."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def tag_log(server: str, params: dict[str, Any]) -> dict[str, Any]:
    """Name the server a log line came from in its `logger` field."""
    logger = params.get("logger")
    return {**params, "logger": f"{server}:{logger}" if logger else server}


class Asker(Protocol):
    async def ask(self, method: str, params: dict[str, Any]) -> bytes: ...


class ClientCall:
    """Binds a routed request to the client request that caused it."""

    def __init__(self, ctx: ServerRequestContext[Any], server: str) -> None:
        self.ctx = ctx
        self.server = server
        # A 2026-07-28 call carried over rounds (frontend/door/rounds.py) puts questions there.
        self.rounds: Asker | None = None

    @property
    def modern(self) -> bool:
        return self.ctx.protocol_version in MODERN_PROTOCOL_VERSIONS

    async def notify(self, method: str, payload: bytes) -> bool:
        """Deliver an upstream notification tied to this call; False when it is not for this client."""
        if self.rounds is None:
            return await self._deliver(method, payload)
        try:
            return await self._deliver(method, payload)
        except Exception as exc:  # between rounds no request of the client's is open to carry it
            log.debug("dropped %s between rounds of a call to %s: %s", method, self.server, exc)
            return True

    async def _deliver(self, method: str, payload: bytes) -> bool:
        try:
            params = _decode.decode(payload)
        except msgspec.DecodeError:
            return True
        session = self.ctx.session
        if method == "notifications/progress":
            # The SDK puts the client's own token back on it.
            progress = params.get("progress")
            if isinstance(progress, int | float):
                await session.report_progress(float(progress), params.get("total"), params.get("message"))
            return True
        if method == "notifications/message" and self.modern:
            # 2026-07-28: logs ride the call's own stream, at the level the request opted in to
            # (the SDK drops what is below it). Handshake-era clients get logs by logging/setLevel.
            tagged = tag_log(self.server, params)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", MCPDeprecationWarning)
                await session.send_log_message(tagged.get("level", "info"), tagged.get("data"), logger=tagged["logger"])
            return True
        return False

    async def open_url(self, message: str, url: str, timeout: float = 120.0) -> str | None:
        """Ask the user to open `url` (URL-mode elicitation, MCP 2025-11-25): its elicitation id once the
        user accepted, else None.

        Only a handshake-era client that declared URL mode is asked; any other, or one that does
        not answer in time, gets nothing here (the caller's result carries the URL anyway).
        """
        if self.modern:
            return None
        capabilities = self.ctx.session.client_capabilities
        if capabilities is None or capabilities.elicitation is None or capabilities.elicitation.url is None:
            return None
        params = types.ElicitRequestURLParams(message=message, url=url, elicitation_id=secrets.token_urlsafe(16))
        with trio.move_on_after(timeout):
            try:
                result = await self.ctx.session.send_request(
                    types.ElicitRequest(params=params),
                    types.ElicitResult,
                    metadata=ServerMessageMetadata(related_request_id=self.ctx.request_id),
                )
            except (MCPError, NoBackChannelError, ValidationError) as exc:
                log.debug("the client did not take the URL elicitation: %s", exc)
                return None
            return params.elicitation_id if result.action == "accept" else None
        return None

    async def ask(self, method: str, payload: bytes) -> bytes:
        """Put the upstream's question to this client and return its JSON answer; AskFailed if it cannot."""
        spec = _ASKS.get(method)
        if spec is None:
            raise AskFailed(types.METHOD_NOT_FOUND, f"{method} cannot be passed to a client")
        request_type, result_type, capability = spec
        if self.modern and self.rounds is None:
            raise AskFailed(
                types.INVALID_REQUEST,
                f"the client speaks 2026-07-28 and this request cannot be answered over rounds, so {method}"
                " cannot be put to it",
            )
        if not self.ctx.session.check_client_capability(capability):
            raise AskFailed(types.INVALID_REQUEST, f"the client did not declare the capability {method} needs")
        try:
            params = _decode.decode(payload) if payload else {}
            request = request_type.model_validate({"method": method, "params": params or None}, by_name=False)
        except (msgspec.DecodeError, ValidationError) as exc:
            raise AskFailed(types.INVALID_PARAMS, f"invalid {method} from the upstream: {exc}") from None
        if self.rounds is not None:
            # 2026-07-28: the question goes out as an input request of the round's result.
            return await self.rounds.ask(method, params)
        try:
            result = await self.ctx.session.send_request(
                request, result_type, metadata=ServerMessageMetadata(related_request_id=self.ctx.request_id)
            )
        except MCPError as exc:
            raise AskFailed(exc.code, exc.message) from None
        except NoBackChannelError:
            raise AskFailed(types.INVALID_REQUEST, f"the client has no channel for {method}") from None
        except ValidationError as exc:
            raise AskFailed(types.INTERNAL_ERROR, f"the client's answer to {method} is invalid: {exc}") from None
        return _encode(result.model_dump(by_alias=True, mode="json", exclude_none=True))
