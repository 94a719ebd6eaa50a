"""A pyzmq socket driven by trio.

pyzmq has no trio integration, so this adapter owns the rules that make one correct:

- `zmq.FD` is edge-triggered: it signals that `zmq.EVENTS` may have changed, not that a message
  is waiting. So `EVENTS` is checked before every wait, and the receive side drains with
  `NOBLOCK` while `EVENTS` shows `POLLIN` (asking costs less than the `zmq.Again` a receive too
  many raises: pyzmq builds an exception, its errno enum and its message for it).
- Any call into the socket (send, receive, reading `EVENTS`) can process its pending commands and
  so consume the edge another task is waiting for: after each, whoever waits for what `EVENTS`
  now shows is woken.
- Only one task may wait on the FD at a time (trio forbids two waiters on one fd); other tasks
  park on a lot that the FD waiter releases.
- ROUTER sockets get `ROUTER_MANDATORY`: at the high-water mark a ROUTER otherwise drops messages
  without a word, and an unknown peer is an error rather than silence. Its `POLLOUT` means "some
  peer has room", so a send to a full peer polls instead of waiting on `EVENTS`.
- `trio.lowlevel.notify_closing` is called before the socket closes, so no task is left waiting
  on a dead fd.

A send that goes at once does not yield to the scheduler (it only checks for cancellation): what
sends next is the caller's wait for an answer, and a turn of trio's loop between the two is a
wake-up per call on each side of each hop. A send to a peer at its high-water mark waits, and so
lets other tasks run.

Flags are plain ints and multipart messages are sent and read frame by frame here: pyzmq's flags
are `IntFlag`s, whose every `&` and `|` runs Python code (about 1.4 us each), and its
`send_multipart`/`recv_multipart` combine them per frame. A call crosses two of these sockets.
"""

from __future__ import annotations

from collections.abc import Sequence

import trio
import zmq

_POLLIN = int(zmq.POLLIN)
_POLLOUT = int(zmq.POLLOUT)
_NOBLOCK = int(zmq.NOBLOCK)
_NOBLOCK_MORE = _NOBLOCK | int(zmq.SNDMORE)
_EVENTS = int(zmq.EVENTS)
_RCVMORE = int(zmq.RCVMORE)


class ZSocket:
    """Async send/receive over one ZeroMQ socket. One task owns the receive side."""

    def __init__(self, sock: zmq.Socket) -> None:
        self._sock = sock
        self._fd: int = sock.getsockopt(zmq.FD)
        self._lot = trio.lowlevel.ParkingLot()
        self._fd_wait_scope: trio.CancelScope | None = None
        self._closed = False
        self._waiters = {_POLLIN: 0, _POLLOUT: 0}  # tasks in _wait_for, by flag
        sock.setsockopt(zmq.LINGER, 0)
        if sock.type == zmq.ROUTER:
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)

    @property
    def zmq_socket(self) -> zmq.Socket:
        return self._sock

    @property
    def closed(self) -> bool:
        return self._closed

    # -- waiting ---------------------------------------------------------------------------------

    def _events(self) -> int:
        try:
            return self._sock.getsockopt(_EVENTS)
        except zmq.ZMQError as exc:
            if self._closed or exc.errno == zmq.ENOTSOCK:
                raise trio.ClosedResourceError("socket closed") from None
            raise

    async def _wait_for(self, flag: int) -> bool:
        """Return once `EVENTS` shows `flag`; at most one task waits on the fd itself.

        True when it waited, that is let other tasks run (a checkpoint).
        """
        self._waiters[flag] += 1
        try:
            return await self._wait_loop(flag)
        finally:
            self._waiters[flag] -= 1

    async def _wait_loop(self, flag: int) -> bool:
        waited = False
        while True:
            if self._closed:
                raise trio.ClosedResourceError("socket closed")
            events = self._events()
            if events & flag:
                return waited
            self._wake(events)  # reading EVENTS may have taken another waiter's edge
            waited = True
            if self._fd_wait_scope is not None:
                # Another task is on the fd; it wakes everyone whenever anything happens.
                await self._lot.park()
                continue
            with trio.CancelScope() as scope:
                self._fd_wait_scope = scope
                try:
                    await trio.lowlevel.wait_readable(self._fd)
                finally:
                    self._fd_wait_scope = None
                    self._lot.unpark_all()

    def _wake(self, events: int) -> None:
        """Wake every waiter if `events` shows what one of them waits for."""
        if any(events & flag and count for flag, count in self._waiters.items()):
            if self._fd_wait_scope is not None:
                self._fd_wait_scope.cancel()
            self._lot.unpark_all()

    def _kick(self) -> None:
        """After a send or receive, which may have consumed an edge: wake whoever can go on."""
        if not self._closed:
            self._wake(self._events())

    # -- sending ---------------------------------------------------------------------------------

    async def send_multipart(self, frames: Sequence[bytes]) -> None:
        """Send one message; waits (never drops) while the peer is at its high-water mark.

        Raises `zmq.ZMQError` with errno `EHOSTUNREACH` for a ROUTER peer that is not connected.
        A checkpoint only when cancelled or when it waited (see the module's docstring).
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        poll_delay = 0.001
        while True:
            if self._closed:
                raise trio.ClosedResourceError("socket closed")
            try:
                self._send(frames)
            except zmq.Again:
                events = self._events()
                if not events & _POLLOUT:
                    await self._wait_for(_POLLOUT)
                    continue
                # A ROUTER whose other peers have room: nothing on the fd says when this
                # peer has, so poll (a busy loop here would freeze every task).
                self._wake(events)
                await trio.sleep(poll_delay)
                poll_delay = min(poll_delay * 2, 0.05)
                continue
            self._kick()
            return

    def send_multipart_nowait(self, frames: Sequence[bytes]) -> bool:
        """Send if it can be done without waiting; False when the peer is at its high-water mark."""
        if self._closed:
            raise trio.ClosedResourceError("socket closed")
        try:
            self._send(frames)
        except zmq.Again:
            self._kick()
            return False
        self._kick()
        return True

    def _send(self, frames: Sequence[bytes]) -> None:
        """Queue one message or raise `zmq.Again`. ZeroMQ queues a multipart message atomically:
        once its first frame is accepted, the rest are too, so NOBLOCK cannot split one."""
        send = self._sock.send
        last = len(frames) - 1
        for index, frame in enumerate(frames):
            send(frame, _NOBLOCK_MORE if index < last else _NOBLOCK)

    def _receive(self) -> list[bytes]:
        """One whole message (its frames arrive together), or `zmq.Again`."""
        sock = self._sock
        frames = [sock.recv(_NOBLOCK)]
        while sock.getsockopt(_RCVMORE):
            frames.append(sock.recv(_NOBLOCK))
        return frames

    # -- receiving -------------------------------------------------------------------------------

    async def receive_batch(self, max_messages: int = 256) -> list[list[bytes]]:
        """Wait for at least one message, then drain up to `max_messages` without waiting."""
        waited = False
        while True:
            batch: list[list[bytes]] = []
            events = self._sock.getsockopt
            try:
                while len(batch) < max_messages and events(_EVENTS) & _POLLIN:
                    batch.append(self._receive())
            except zmq.Again:
                pass
            except zmq.ZMQError as exc:
                if self._closed or exc.errno == zmq.ENOTSOCK:
                    raise trio.ClosedResourceError("socket closed") from None
                raise
            if batch:
                if self._waiters[_POLLOUT]:
                    self._kick()
                if not waited:
                    await trio.lowlevel.checkpoint()
                return batch
            waited = await self._wait_for(_POLLIN) or waited

    async def receive_multipart(self) -> list[bytes]:
        """Receive one message. Prefer `receive_batch` in loops."""
        waited = False
        while True:
            try:
                frames = self._receive()
            except zmq.Again:
                waited = await self._wait_for(_POLLIN) or waited
                continue
            except zmq.ZMQError as exc:
                if self._closed or exc.errno == zmq.ENOTSOCK:
                    raise trio.ClosedResourceError("socket closed") from None
                raise
            if self._waiters[_POLLOUT]:
                self._kick()
            if not waited:
                await trio.lowlevel.checkpoint()
            return frames

    # -- closing ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the socket, first waking every task that waits on it."""
        if self._closed:
            return
        self._closed = True
        trio.lowlevel.notify_closing(self._fd)
        self._lot.unpark_all()
        self._sock.close(linger=0)

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> ZSocket:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
