"""One socket write for a response of known length, where hypercorn's HTTP/1.1 makes two.

Hypercorn writes a response's head as soon as the app starts the response, then its body: two
`send` system calls, two trips through its connection's send lock, and on loopback two wake-ups of
the client, for every answer of the short paths and every page of a listing. When the head
declares a `content-length`, the body follows at once and nothing streams, so the head is held and
written with the first part of the body (or the end of the message, for an empty one).
A streamed answer (SSE, chunked) has no `content-length`: its head is still written at once, for
the client waits for it before any event.
"""

from __future__ import annotations

from typing import Any

import h11
from hypercorn.events import RawData
from hypercorn.protocol.events import Body, EndBody
from hypercorn.protocol.h11 import H11Protocol

_HELD = "_mcpvisor_held_head"


async def _send_h11_event(self: Any, event: Any) -> None:
    try:
        data = self.connection.send(event)
    except h11.LocalProtocolError:
        if self.connection.their_state != h11.ERROR:
            raise
        return
    held = self.__dict__.pop(_HELD, None)
    if held is not None:
        data = held + data
    elif type(event) is h11.Response and _fixed_length(event):
        self.__dict__[_HELD] = data
        return
    await self.send(RawData(data=data))


def _fixed_length(response: h11.Response) -> bool:
    return any(name == b"content-length" for name, _ in response.headers)


async def _stream_send(self: Any, event: Any) -> None:
    # Whatever comes instead of the body (the stream closing, raw data) first sends the head held.
    if type(event) not in _BODY_EVENTS and (held := self.__dict__.pop(_HELD, None)) is not None:
        await self.send(RawData(data=held))
    await _original_stream_send(self, event)


_BODY_EVENTS = (Body, EndBody)
_original_stream_send = H11Protocol.stream_send
_patched = False


def coalesce_response_writes() -> None:
    """Make hypercorn's HTTP/1.1 protocol write a fixed-length response in one piece (idempotent)."""
    global _patched
    if _patched:
        return
    _patched = True
    H11Protocol._send_h11_event = _send_h11_event  # type: ignore[method-assign]
    H11Protocol.stream_send = _stream_send  # type: ignore[method-assign]
