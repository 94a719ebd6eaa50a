"""The receive side of a socket: drain it, decode each message once, hand it on.

Every process has loops of this shape; this is the one place that knows the envelope layout
(ROUTER identity, SUB topic) and what to do with a message that does not decode: log it and go on,
so no peer can end the loop by sending garbage.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from mcpvisor.wire.codec import Codec
from mcpvisor.wire.zsocket import ZSocket

M = TypeVar("M")

# (envelope frames, message, payload frame or None)
Handler = Callable[[list[bytes], M, bytes | None], Awaitable[None]]
Undecodable = Callable[[list[bytes], list[bytes], Exception], Awaitable[None]]

log = logging.getLogger(__name__)


async def serve_messages(
    sock: ZSocket,
    codec: Codec[M],
    handle: Handler[M],
    *,
    envelope: int = 0,
    undecodable: Undecodable | None = None,
    what: str = "message",
) -> None:
    """Receive forever; `handle` each decoded message, in order, in this task.

    `envelope` is the number of leading frames that are not the message (1 for a ROUTER's peer
    identity or a SUB topic). A message that does not decode goes to `undecodable` (envelope,
    message frames, error) when given, else it is logged and dropped.
    """
    while True:
        for frames in await sock.receive_batch():
            head, body = frames[:envelope], frames[envelope:]
            try:
                msg, payload = codec.decode(body)
            # Garbage can fail in the UTF-8 of a string (UnicodeDecodeError, a ValueError, as
            # msgspec's own errors are) or nest deeper than the stack (RecursionError).
            except (ValueError, RecursionError) as exc:
                if len(head) < envelope:
                    log.warning("dropping a %s without its envelope", what)
                elif undecodable is not None:
                    await undecodable(head, body, exc)
                else:
                    log.warning("dropping an undecodable %s: %s", what, _short(exc))
                continue
            await handle(head, msg, payload)


def _short(exc: Exception) -> str:
    text = str(exc)
    return text if len(text) <= 200 else text[:200] + "..."
