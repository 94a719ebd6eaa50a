"""The frontend's line to the supervisor: control commands over a DEALER socket."""

from __future__ import annotations

import itertools
import logging
from typing import Any

import msgspec
import trio

from mcpvisor.wire import codec
from mcpvisor.wire.messages import Command, Reply
from mcpvisor.wire.zsocket import ZSocket

log = logging.getLogger(__name__)


class ControlError(Exception):
    """The supervisor refused a command or did not answer; the message is safe to show a client."""


class ControlClient:
    """Sends commands to the supervisor and matches the replies (one receiving task)."""

    def __init__(self, sock: ZSocket, *, timeout: float = 30.0) -> None:
        self.sock = sock
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[trio.Event, list[Reply]]] = {}

    async def call(self, name: str, args: list[str] | None = None, data: Any = None) -> Any:
        """Run a control command; its result, or ControlError with the supervisor's message."""
        request_id = next(self._ids)
        done, slot = self._pending[request_id] = (trio.Event(), [])
        try:
            await self.sock.send_multipart(
                codec.control.encode(Command(id=request_id, name=name, args=args or [], data=data))
            )
            with trio.move_on_after(self.timeout):
                await done.wait()
        finally:
            del self._pending[request_id]
        if not slot:
            raise ControlError(f"the supervisor did not answer '{name}' within {self.timeout:g}s")
        reply = slot[0]
        if not reply.ok:
            raise ControlError(reply.error)
        return reply.result

    async def serve(self) -> None:
        while True:
            for frames in await self.sock.receive_batch():
                try:
                    msg, _ = codec.control.decode(frames)
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    log.error("undecodable control reply: %s", exc)
                    continue
                if isinstance(msg, Reply) and (pending := self._pending.get(msg.id)) is not None:
                    pending[1].append(msg)
                    pending[0].set()
