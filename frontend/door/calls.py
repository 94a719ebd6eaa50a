"""One client's request in flight, as the door sees it: who asks, and the way back to them.

The endpoints hand the door a `Requester` (frontend/endpoints/handlers.py implements it): the
caller's identity for the audit record, the spans and the decisions, and the back channel on
which an upstream's progress, log lines and questions reach the client. A `ClientCall` binds it
to the one upstream server a routed request goes to.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
import trio

log = logging.getLogger(__name__)

_decode = msgspec.json.Decoder(dict[str, Any])
_encode = msgspec.json.encode

METHOD_NOT_FOUND = -32601
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602

# Server-to-client requests an upstream may put to the client during its call, and the
# capability the client must have declared for each.
ASKS: dict[str, str] = {
    "sampling/createMessage": "sampling",
    "elicitation/create": "elicitation",
    "roots/list": "roots",
}


class AskFailed(Exception):
    """The client cannot or did not answer; `code` and `message` go back to the upstream."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is asking: what the activity log, a policy decision and a span say of a request."""

    tenant: str = ""
    client: str = ""  # the client's own name (clientInfo.name)
    endpoint: str = ""  # the HTTP path it called, e.g. /mcp/direct
    protocol: str = ""  # its protocol version
    session: str = ""  # its handshake-era session id, "" for a 2026-07-28 request
    request_id: str = ""  # its JSON-RPC id, as text
    traceparent: str = ""  # W3C trace context, from `params._meta` or else the HTTP headers
    tracestate: str = ""


class Requester(Protocol):
    """A client's request in flight (implemented by the endpoints): its caller and its back channel."""

    @property
    def caller(self) -> Caller: ...

    @property
    def modern(self) -> bool:
        """It speaks 2026-07-28: questions go out as `input_required` rounds, logs ride its own answer."""
        ...

    @property
    def progress_token(self) -> str | int | None: ...

    @property
    def carried(self) -> dict[str, Any]:
        """What a 2026-07-28 client brings back from a previous round: `requestState`, `inputResponses`."""
        ...

    def declares(self, capability: str, detail: str | None = None) -> bool:
        """Whether the client declared `capability` (and `detail` inside it, e.g. elicitation's `url`)."""
        ...

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        """Progress of the request, under the client's own progress token (dropped without one)."""
        ...

    async def log(self, params: dict[str, Any]) -> bool:
        """A log line for the request's own answer (2026-07-28, at the level it opted in to); False
        when the client gets logs otherwise (the handshake era's logging/setLevel)."""
        ...

    async def ask(self, method: str, params: dict[str, Any]) -> bytes:
        """Put a question to the client on the request's own stream (handshake era); its JSON
        answer, or AskFailed."""
        ...


class Asker(Protocol):
    async def ask(self, method: str, params: dict[str, Any]) -> bytes: ...


def tag_log(server: str, params: dict[str, Any]) -> dict[str, Any]:
    """Name the server a log line came from in its `logger` field."""
    logger = params.get("logger")
    return {**params, "logger": f"{server}:{logger}" if logger else server}


class ClientCall:
    """Binds a routed request to the client request that caused it."""

    def __init__(self, request: Requester, server: str) -> None:
        self.request = request
        self.server = server
        # A 2026-07-28 call carried over rounds (frontend/door/rounds.py) puts questions there.
        self.rounds: Asker | None = None

    @property
    def modern(self) -> bool:
        return self.request.modern

    @property
    def caller(self) -> Caller:
        return self.request.caller

    @property
    def askable(self) -> bool:
        """The client declared something an upstream may ask it (sampling, elicitation, roots)."""
        return any(self.request.declares(capability) for capability in ASKS.values())

    async def notify(self, method: str, payload: bytes) -> bool:
        """Deliver an upstream notification tied to this call; False when it is not for this client."""
        try:
            params = _decode.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return True
        if method == "notifications/progress":
            progress = params.get("progress")
            if isinstance(progress, int | float) and not isinstance(progress, bool):
                total = params.get("total")
                message = params.get("message")
                await self.request.progress(
                    float(progress),
                    total if isinstance(total, int | float) and not isinstance(total, bool) else None,
                    message if isinstance(message, str) else None,
                )
            return True
        if method == "notifications/message":
            return await self.request.log(tag_log(self.server, params))
        return False

    async def open_url(self, message: str, url: str, timeout: float = 120.0) -> str | None:
        """Ask the user to open `url` (URL-mode elicitation, MCP 2025-11-25): its elicitation id once the
        user accepted, else None.

        Only a handshake-era client that declared URL mode is asked; any other, or one that does
        not answer in time, gets nothing here (the caller's result carries the URL anyway).
        """
        if self.modern or not self.request.declares("elicitation", "url"):
            return None
        elicitation = secrets.token_urlsafe(16)
        params = {"mode": "url", "message": message, "url": url, "elicitationId": elicitation}
        with trio.move_on_after(timeout):
            try:
                answer = _decode.decode(await self.request.ask("elicitation/create", params))
            except (AskFailed, msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.debug("the client did not take the URL elicitation: %s", exc)
                return None
            return elicitation if answer.get("action") == "accept" else None
        return None

    async def ask(self, method: str, payload: bytes) -> bytes:
        """Put the upstream's question to this client and return its JSON answer; AskFailed if it cannot."""
        capability = ASKS.get(method)
        if capability is None:
            raise AskFailed(METHOD_NOT_FOUND, f"{method} cannot be passed to a client")
        if not self.request.declares(capability):
            raise AskFailed(INVALID_REQUEST, f"the client did not declare the capability {method} needs")
        if self.modern and self.rounds is None:
            raise AskFailed(
                INVALID_REQUEST,
                f"the client speaks 2026-07-28 and this request cannot be answered over rounds, so {method}"
                " cannot be put to it",
            )
        try:
            params = _decode.decode(payload) if payload.strip() else {}
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise AskFailed(INVALID_PARAMS, f"invalid {method} from the upstream: {exc}") from None
        if self.rounds is not None:
            # 2026-07-28: the question goes out as an input request of the round's result.
            return await self.rounds.ask(method, params)
        return await self.request.ask(method, params)
