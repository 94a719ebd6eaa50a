"""Pass-through requests to a streamable-HTTP upstream: the call's JSON POSTed as it came.

A stdio upstream's calls pass through as lines (workers/stdio.py). A streamable-HTTP upstream's
went through the SDK's client session, which validates each request and result with pydantic,
carries every message through memory streams and tasks, and decodes and encodes the result again:
most of the worker's CPU for such a call. The session still does what a session is for here: it
connects, discovers, pings, and takes the upstream's unasked notifications on its GET stream. The
requests the frontend forwards (PASS_THROUGH) are POSTed by `HttpCalls` on that same session
(its `Mcp-Session-Id`, the protocol version it agreed), under ids of their own, through the same
HTTP client (its authentication, its routing and trace headers), and their answers are read as
they come: one JSON body, or an SSE stream that ends with the result, whose notifications go on
to the frontend and whose requests (sampling, elicitation, roots, ping) the call's client answers.

What the SDK's transport does and this does not: reconnect to a stream that broke with a resumption
token (such a call fails, as a stdio call fails when its upstream dies). Redirects are followed
within the endpoint's origin only, as the SDK follows them.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

import httpx2
import mcp_types as types
import msgspec
import trio
from mcp.client.streamable_http import MCP_SESSION_ID
from mcp.shared._httpx_utils import stream_within_origin
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER

from mcpvisor.workers.stdio import FORWARDED_NOTIFICATIONS, RawError

log = logging.getLogger(__name__)

_ROOM: Final = 64 * 1024  # an answer's envelope around a result of max_result bytes
_CANCEL_BUDGET: Final = 2.0  # seconds a cancelled call spends telling the upstream
_DRAIN: Final = 1.0  # seconds a stream may go on after its answer before it is closed
LIST_CHANGED: Final = frozenset(
    {
        "notifications/tools/list_changed",
        "notifications/resources/list_changed",
        "notifications/prompts/list_changed",
    }
)


class _Error(msgspec.Struct):
    code: int = types.INTERNAL_ERROR
    message: str = ""


class _Message(msgspec.Struct):
    """One JSON-RPC message from the upstream; params and result stay bytes."""

    id: int | str | None = None
    method: str | None = None
    params: msgspec.Raw = msgspec.Raw(b"")
    result: msgspec.Raw = msgspec.Raw(b"")
    error: _Error | None = None


_decode = msgspec.json.Decoder(_Message)
_decode_params = msgspec.json.Decoder(dict[str, Any])
_encode = msgspec.json.encode

Notify = Callable[[str, bytes], Awaitable[None]]
# The call's client's answer to the upstream's question, checked (as JSON), or None when no client is asked it.
Answer = Callable[[str, dict[str, Any]], Awaitable["dict[str, Any] | types.ErrorData | None"]]


class TooLarge(Exception):
    """The upstream's answer is past max_result_bytes (its size, as far as it was read)."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


class Unreachable(Exception):
    """The request did not get through to the upstream, or its answer stopped half-way."""


class Malformed(Exception):
    """The upstream's answer to the request is not one: not JSON-RPC, or an answer to another id."""


class HttpCalls:
    """Requests POSTed on an SDK session's streamable-HTTP connection, outside the session."""

    def __init__(
        self,
        http: httpx2.AsyncClient,
        url: str,
        *,
        notify: Notify,
        answer: Answer,
        list_changed: Callable[[], None],
        max_result: int,
    ) -> None:
        self.http = http
        self.url = url
        self.notify = notify
        self.answer = answer
        self.list_changed = list_changed
        self.max_result = max_result
        self.session_id: str | None = None
        self.protocol_version = ""  # set once the session's initialize is answered: then ready
        self._ids = itertools.count(1)

    @property
    def ready(self) -> bool:
        return bool(self.protocol_version)

    async def see(self, response: httpx2.Response) -> None:
        """The HTTP client's response hook: the session's id, from the answer that gave it."""
        session_id = response.headers.get(MCP_SESSION_ID)
        if session_id:
            self.session_id = session_id

    def _headers(self) -> dict[str, str]:
        headers = {
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            MCP_PROTOCOL_VERSION_HEADER: self.protocol_version,
        }
        if self.session_id:
            headers[MCP_SESSION_ID] = self.session_id
        return headers

    async def request(self, method: str, params: bytes | None) -> bytes:
        """The upstream's JSON result; RawError for its JSON-RPC error, TooLarge, Malformed, or Unreachable."""
        if self.http.is_closed:  # the session's connection is being torn down
            raise Unreachable("the connection to the upstream is closed")
        # Ids of their own: the session's requests are numbered from 0 on the same connection.
        request_id = f"mcpvisor-{next(self._ids)}"
        body = b'{"jsonrpc":"2.0","id":%b,"method":%b' % (_encode(request_id), _encode(method))
        body += b',"params":%b}' % params if params else b"}"
        try:
            async with stream_within_origin(
                self.http, "POST", self.url, content=body, headers=self._headers()
            ) as response:
                return await self._answer(response, request_id)
        except (RawError, TooLarge, Malformed):
            raise  # the upstream answered, with an error: nothing to cancel
        except BaseException as exc:  # cancelled, or no answer came: the upstream may still run it
            with trio.CancelScope(shield=True), trio.move_on_after(_CANCEL_BUDGET):
                await self._cancel(request_id)
            if isinstance(exc, httpx2.TransportError):
                raise Unreachable(describe(exc)) from None
            raise

    async def _cancel(self, request_id: str) -> None:
        """Tell the upstream a request it may still be running is given up (the SDK's session does the same)."""
        notice = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": request_id}}
        try:
            await self._post(notice)
        except httpx2.HTTPError as exc:
            log.debug("could not tell the upstream of a cancelled request: %s", describe(exc))

    async def _post(self, message: dict[str, Any]) -> None:
        """A message the upstream answers with 202 (a notification, an answer to its question)."""
        async with stream_within_origin(
            self.http, "POST", self.url, content=_encode(message), headers=self._headers()
        ) as response:
            await response.aread()

    async def _answer(self, response: httpx2.Response, request_id: str) -> bytes:
        kind = response.headers.get("content-type", "").lower()
        if not 200 <= response.status_code < 300 or response.status_code in (202, 204):
            raise await self._refusal(response, kind)
        if kind.startswith("application/json"):
            body = await self._read(response)
            try:
                message = _decode.decode(body)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise Malformed(f"its answer is not JSON-RPC ({exc})") from None
            if message.method is not None or message.id != request_id:
                raise Malformed("its answer is not the answer to this request")
            return self._outcome(message)
        if kind.startswith("text/event-stream"):
            return await self._stream(response, request_id)
        raise RawError(types.INVALID_REQUEST, f"Unexpected content type: {kind}")

    async def _read(self, response: httpx2.Response) -> bytes:
        """A JSON answer's body, refused as soon as it grows past what a result may be."""
        limit = self.max_result + _ROOM
        parts = []
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > limit:
                raise TooLarge(size)
            parts.append(chunk)
        return b"".join(parts)

    async def _refusal(self, response: httpx2.Response, kind: str) -> RawError:
        """The error an answer that is not a result stands for, as the SDK's transport reads it."""
        status = response.status_code
        if status in (202, 204):
            return RawError(types.INVALID_REQUEST, "server answered a request with 202 Accepted")
        if 300 <= status < 400:
            return RawError(types.INVALID_REQUEST, f"server redirected the request off its origin ({status})")
        if kind.startswith("application/json"):
            try:
                message = _decode.decode(await self._read(response))
            except (msgspec.DecodeError, msgspec.ValidationError, TooLarge):
                message = None
            if message is not None and message.error is not None:
                return RawError(message.error.code, message.error.message)
        if status == 404:
            if self.session_id is None:
                return RawError(types.METHOD_NOT_FOUND, "Not Found")
            return RawError(types.INVALID_REQUEST, "Session terminated")
        return RawError(types.INTERNAL_ERROR, f"Server returned an error response (HTTP {status})")

    def _outcome(self, message: _Message) -> bytes:
        if message.error is not None:
            raise RawError(message.error.code, message.error.message)
        result = bytes(message.result)
        if len(result) > self.max_result:
            raise TooLarge(len(result))
        return result or b"{}"

    async def _stream(self, response: httpx2.Response, request_id: str) -> bytes:
        """Read the call's SSE stream until its answer: what comes before it is passed on.

        The stream is then read to its end (the server ends it after the answer), so that the
        connection goes back to the pool: a stream left half-read is closed, and the next call
        would open a connection of its own.
        """
        events = httpx2.EventSource(response, max_event_size=self.max_result + _ROOM).__aiter__()
        answer: _Message | None = None
        try:
            async for event in events:
                if not event.data:
                    continue
                try:
                    message = _decode.decode(event.data.encode())
                except (msgspec.DecodeError, msgspec.ValidationError):
                    # Its text is not shown: what an upstream sends may be a user's data.
                    log.warning("upstream sent an event that is not JSON-RPC (%d bytes): skipped", len(event.data))
                    continue
                if message.method is None:
                    if message.id == request_id:
                        answer = message
                        break
                    continue  # an answer to something else: not this stream's to read
                if message.id is None:
                    await self._notified(message.method, bytes(message.params) or b"{}")
                else:
                    await self._asked(message.id, message.method, bytes(message.params) or b"{}")
            if answer is not None:
                with trio.move_on_after(_DRAIN):
                    async for _ in events:
                        pass
        except httpx2.SSEError as exc:
            if answer is None and "exceeded" in str(exc):
                raise TooLarge(self.max_result + _ROOM + 1) from None
            if answer is None:
                raise Unreachable(f"the upstream's stream failed: {exc}") from None
        except httpx2.TransportError:
            if answer is None:
                raise
        if answer is None:
            raise Unreachable("the upstream's stream ended without an answer")
        return self._outcome(answer)

    async def _notified(self, method: str, params: bytes) -> None:
        """As the session takes them: a list change means discovery again; progress, log lines and
        resource updates go on to the frontend; the rest is dropped."""
        if method in LIST_CHANGED:
            self.list_changed()
        elif method in FORWARDED_NOTIFICATIONS:
            await self.notify(method, params)

    async def _asked(self, ask_id: int | str, method: str, params: bytes) -> None:
        """Answer a request the upstream put on the call's stream, by asking the call's client."""
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": ask_id}
        if method == "ping":
            answer: dict[str, Any] | types.ErrorData | None = {}
        else:
            try:
                decoded = _decode_params.decode(params)
            except (msgspec.DecodeError, msgspec.ValidationError):
                decoded = {}
            answer = await self.answer(method, decoded)
        if answer is None:
            reply["error"] = {"code": types.METHOD_NOT_FOUND, "message": f"Method not found: {method}"}
        elif isinstance(answer, types.ErrorData):
            reply["error"] = {"code": answer.code, "message": answer.message}
        else:
            reply["result"] = answer
        try:
            await self._post(reply)
        except httpx2.HTTPError as exc:
            log.warning("could not give the upstream the client's answer to %s: %s", method, describe(exc))


def describe(exc: BaseException) -> str:
    """A transport failure in a few words (httpx's own messages can be empty)."""
    return str(exc) or type(exc).__name__
