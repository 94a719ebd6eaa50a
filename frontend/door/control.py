"""The frontend's line to the supervisor: control commands over a DEALER socket.

The same line carries the supervisor's questions on an operator's behalf (`OperatorRequest`),
answered by the `on_request` handler (frontend/endpoints/operator.py).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from mcpvisor.runtime.replies import PendingReplies
from mcpvisor.wire import codec
from mcpvisor.wire.inbox import serve_messages
from mcpvisor.wire.messages import Command, ControlMessage, OperatorReply, OperatorRequest, Reply
from mcpvisor.wire.zsocket import ZSocket

log = logging.getLogger(__name__)

RequestHandler = Callable[[OperatorRequest], Awaitable[OperatorReply]]


class ControlError(Exception):
    """The supervisor refused a command or did not answer; the message is safe to show a client.

    `exit_code` is the command's LSB code (2 a bad argument, 4 an unknown name), 1 when none came.
    """

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class ControlClient:
    """Sends commands to the supervisor and matches the replies (one receiving task)."""

    def __init__(self, sock: ZSocket, *, timeout: float = 30.0) -> None:
        self.sock = sock
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._pending: PendingReplies[int, Reply] = PendingReplies()

    async def call(self, name: str, args: list[str] | None = None, data: Any = None) -> Any:
        """Run a control command; its result, or ControlError with the supervisor's message."""
        request_id = next(self._ids)
        with self._pending.expect(request_id) as slot:
            await self.sock.send_multipart(
                codec.control.encode(Command(id=request_id, name=name, args=args or [], data=data))
            )
            try:
                reply = await slot.wait(self.timeout)
            except trio.TooSlowError:
                raise ControlError(f"the supervisor did not answer '{name}' within {self.timeout:g}s") from None
        if not reply.ok:
            raise ControlError(reply.error, reply.exit_code or 1)
        return reply.result

    async def serve(self, on_request: RequestHandler | None = None) -> None:
        """Take in replies, and answer the supervisor's requests with `on_request`, until cancelled."""
        async with trio.open_nursery() as nursery:

            async def handle(_envelope: list[bytes], msg: ControlMessage, _payload: bytes | None) -> None:
                if isinstance(msg, Reply):
                    self._pending.deliver(msg.id, msg)
                elif isinstance(msg, OperatorRequest):
                    nursery.start_soon(self._answer, msg, on_request)

            await serve_messages(self.sock, codec.control, handle, what="control reply")

    async def _answer(self, request: OperatorRequest, on_request: RequestHandler | None) -> None:
        if on_request is None:
            reply = OperatorReply(id=request.id, error="this frontend does not take operator requests", exit_code=1)
        else:
            reply = await on_request(request)
        with contextlib.suppress(trio.ClosedResourceError):  # the frontend is stopping
            await self.sock.send_multipart(codec.control.encode(reply))
