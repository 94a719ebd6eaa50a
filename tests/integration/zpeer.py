"""A ZeroMQ peer for the wire tests, run as its own process: a ROUTER that echoes.

Usage: python zpeer.py ENDPOINT [HWM]

Binds a ROUTER on ENDPOINT (with SNDHWM and RCVHWM set to HWM when it is not 0), prints "ready" once
bound, and sends every message back to the identity it came from, unchanged. A message whose body is
[b"flood", COUNT, SIZE] instead starts a task that sends COUNT messages [b"<n>", SIZE bytes] numbered
from 0, then [b"done"], to that identity, while echoing carries on.

The peer stops when its stdin closes: the parent closed it, or the parent died.
"""

from __future__ import annotations

import os
import sys

import trio
import zmq

from mcpvisor.wire.zsocket import ZSocket


async def flood(sock: ZSocket, identity: bytes, count: int, size: int) -> None:
    padding = b"x" * size
    for n in range(count):
        await sock.send_multipart([identity, b"%d" % n, padding])
    await sock.send_multipart([identity, b"done"])


async def stop_when_stdin_closes(scope: trio.CancelScope) -> None:
    while True:
        await trio.lowlevel.wait_readable(sys.stdin.fileno())
        if not os.read(sys.stdin.fileno(), 4096):
            scope.cancel()
            return


async def serve(endpoint: str, hwm: int) -> None:
    ctx = zmq.Context()
    raw = ctx.socket(zmq.ROUTER)
    if hwm:
        raw.setsockopt(zmq.SNDHWM, hwm)
        raw.setsockopt(zmq.RCVHWM, hwm)
    sock = ZSocket(raw)
    try:
        raw.bind(endpoint)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop_when_stdin_closes, nursery.cancel_scope)
            print("ready", flush=True)
            while True:
                for frames in await sock.receive_batch():
                    if len(frames) == 4 and frames[1] == b"flood":
                        nursery.start_soon(flood, sock, frames[0], int(frames[2]), int(frames[3]))
                    else:
                        await sock.send_multipart(frames)
    finally:
        sock.close()
        ctx.term()


def main() -> None:
    endpoint = sys.argv[1]
    hwm = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    trio.run(serve, endpoint, hwm)


if __name__ == "__main__":
    main()
