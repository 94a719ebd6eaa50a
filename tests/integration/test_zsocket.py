"""The trio ZeroMQ adapter keeps the wire rules: nothing lost, nothing dropped, nobody left asleep."""

from __future__ import annotations

import contextlib
import select
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import pytest
import trio
import trio.testing
import zmq

from mcpvisor.wire import codec
from mcpvisor.wire.messages import Request
from mcpvisor.wire.zsocket import ZSocket

PEER = Path(__file__).with_name("zpeer.py")


@contextmanager
def short_tempdir() -> Iterator[Path]:
    """A directory for ipc sockets: their paths must stay under ~100 characters."""
    path = Path(tempfile.mkdtemp(prefix="mz", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def zmq_context() -> Iterator[zmq.Context]:
    ctx = zmq.Context()
    try:
        yield ctx
    finally:
        ctx.destroy(linger=0)


@asynccontextmanager
async def open_peer(hwm: int = 0) -> AsyncIterator[str]:
    """Run zpeer.py (an echoing ROUTER) in its own process; yields its endpoint once it is bound."""
    with short_tempdir() as workdir:
        endpoint = f"ipc://{workdir}/peer.sock"
        proc = await trio.lowlevel.open_process(
            [sys.executable, str(PEER), endpoint, str(hwm)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        try:
            assert proc.stdout is not None
            assert proc.stdin is not None
            with trio.fail_after(20):
                ready = b""
                while not ready.endswith(b"\n"):
                    chunk = await proc.stdout.receive_some()
                    assert chunk, f"peer exited before it was ready: {ready!r}"
                    ready += chunk
            assert ready == b"ready\n"
            yield endpoint
            await proc.stdin.aclose()  # the peer stops when its stdin closes
            with trio.fail_after(10):
                assert await proc.wait() == 0
        finally:
            if proc.returncode is None:
                proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()
                await proc.stdin.aclose()
                await proc.stdout.aclose()


def dealer(ctx: zmq.Context, endpoint: str, identity: bytes, hwm: int = 0) -> ZSocket:
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.IDENTITY, identity)
    if hwm:
        raw.setsockopt(zmq.SNDHWM, hwm)
        raw.setsockopt(zmq.RCVHWM, hwm)
    raw.connect(endpoint)
    return ZSocket(raw)


async def receive_flood(sock: ZSocket, count: int) -> None:
    """Read what the peer's flood sends: `count` numbered messages in order, then b"done"."""
    expected = 0
    while True:
        for frames in await sock.receive_batch():
            if frames == [b"done"]:
                assert expected == count
                return
            assert frames[0] == b"%d" % expected
            expected += 1


def fill_send_queue(sock: ZSocket, message: list[bytes]) -> None:
    """Send until the queues and the kernel's buffers are full, and stay full once ZeroMQ settles."""
    while True:
        while sock.send_multipart_nowait(message):
            pass
        select.select([], [], [], 0.05)
        if not sock.zmq_socket.getsockopt(zmq.EVENTS) & zmq.POLLOUT:
            return


def zmq_fd_readable(sock: ZSocket, timeout: float) -> bool:
    """Block, without letting trio run, until ZeroMQ signals the socket's fd (commands pending)."""
    fd = sock.zmq_socket.getsockopt(zmq.FD)
    return bool(select.select([fd], [], [], timeout)[0])


# -- between processes --------------------------------------------------------------------------------


async def test_pipelined_requests_from_concurrent_senders_all_come_back() -> None:
    senders, per_sender = 8, 1250
    total = senders * per_sender
    seen: Counter[int] = Counter()

    async def send_requests(first: int) -> None:
        for n in range(first, first + per_sender):
            request = Request(id=n, method="tools/call", timeout=30.0)
            await sock.send_multipart(codec.calls.encode(request, b'{"n":%d}' % n))

    async def collect_replies() -> None:
        while seen.total() < total:
            for frames in await sock.receive_batch():
                msg, payload = codec.calls.decode(frames)
                assert isinstance(msg, Request)
                assert payload == b'{"n":%d}' % msg.id
                seen[msg.id] += 1

    async with open_peer(hwm=100) as endpoint:
        with zmq_context() as ctx:
            async with dealer(ctx, endpoint, b"frontend", hwm=100) as sock:
                with trio.fail_after(60):
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(collect_replies)
                        for s in range(senders):
                            nursery.start_soon(send_requests, s * per_sender)
                with trio.move_on_after(0.2):
                    extra = await sock.receive_batch()
                    pytest.fail(f"more replies than requests: {extra[:3]}")

    assert sorted(seen) == list(range(total))
    assert set(seen.values()) == {1}


async def test_router_waits_at_the_high_water_mark_instead_of_dropping() -> None:
    count = 20_000
    async with open_peer(hwm=100) as endpoint:
        with zmq_context() as ctx:
            async with dealer(ctx, endpoint, b"slow", hwm=100) as sock:
                with trio.fail_after(30):
                    await sock.send_multipart([b"flood", b"%d" % count, b"1024"])
                    # 20 MB against queues of 100 messages and the kernel's buffers: the peer's
                    # ROUTER is at the high-water mark long before this reader starts.
                    await trio.sleep(0.5)
                    await receive_flood(sock, count)


async def test_a_slow_peer_does_not_stall_the_router_for_others() -> None:
    count = 20_000
    async with open_peer(hwm=100) as endpoint:
        with zmq_context() as ctx:
            async with dealer(ctx, endpoint, b"slow", hwm=100) as slow, dealer(ctx, endpoint, b"fast") as fast:
                await slow.send_multipart([b"flood", b"%d" % count, b"1024"])
                await trio.sleep(0.3)  # the peer's flood task now waits for room at `slow`
                # Its ROUTER still shows POLLOUT (`fast` has room), so EVENTS says nothing about
                # `slow`; the peer must keep serving `fast` meanwhile.
                with trio.fail_after(10):
                    for n in range(200):
                        await fast.send_multipart([b"ping", b"%d" % n])
                        assert await fast.receive_multipart() == [b"ping", b"%d" % n]
                with trio.fail_after(30):
                    await receive_flood(slow, count)


@pytest.mark.parametrize("batched", [False, True], ids=["receive_multipart", "receive_batch"])
async def test_receiver_wakes_when_a_send_on_its_socket_takes_the_read_edge(batched: bool) -> None:
    rounds = 2000
    send_reply, replies = trio.open_memory_channel[list[bytes]](rounds)

    async def receive_replies() -> None:
        while True:
            if batched:
                for frames in await sock.receive_batch():
                    send_reply.send_nowait(frames)
            else:
                send_reply.send_nowait(await sock.receive_multipart())

    async with open_peer() as endpoint:
        with zmq_context() as ctx:
            async with dealer(ctx, endpoint, b"pinger") as sock:
                # A receiver asleep in a receive call while the other task goes through the
                # socket, thousands of times over; the exact interleavings where a send or a
                # receive takes the other's edge are pinned down by the one-process tests below.
                with trio.fail_after(30):
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(receive_replies)
                        for n in range(rounds):
                            await sock.send_multipart([b"%d" % n])
                            assert await replies.receive() == [b"%d" % n]
                        nursery.cancel_scope.cancel()


# -- one process ---------------------------------------------------------------------------------------


async def test_sending_to_an_unknown_identity_is_an_error_not_silence() -> None:
    with short_tempdir() as workdir, zmq_context() as ctx:
        endpoint = f"ipc://{workdir}/router.sock"
        raw = ctx.socket(zmq.ROUTER)
        raw.bind(endpoint)
        async with ZSocket(raw) as router, dealer(ctx, endpoint, b"known") as known:
            with pytest.raises(zmq.ZMQError) as info:
                await router.send_multipart([b"nobody", b"hello"])
            assert info.value.errno == zmq.EHOSTUNREACH

            with trio.fail_after(5):
                await known.send_multipart([b"hello"])
                assert await router.receive_multipart() == [b"known", b"hello"]
                await router.send_multipart([b"known", b"hi"])
                assert await known.receive_multipart() == [b"hi"]

            with pytest.raises(zmq.ZMQError) as info:
                router.send_multipart_nowait([b"nobody", b"hello"])
            assert info.value.errno == zmq.EHOSTUNREACH


async def test_close_wakes_every_waiter_with_closed_resource_error() -> None:
    outcomes: list[str] = []

    async def expect_closed(operation: str, call: Callable[[], Awaitable[object]]) -> None:
        with pytest.raises(trio.ClosedResourceError):
            await call()
        outcomes.append(operation)

    with short_tempdir() as workdir, zmq_context() as ctx:
        raw = ctx.socket(zmq.DEALER)
        raw.setsockopt(zmq.IMMEDIATE, 1)  # no peer, so no pipe: a send waits as well
        raw.connect(f"ipc://{workdir}/nobody.sock")
        sock = ZSocket(raw)
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(expect_closed, "receive", sock.receive_multipart)
                nursery.start_soon(expect_closed, "send", lambda: sock.send_multipart([b"x"]))
                await trio.testing.wait_all_tasks_blocked()
                assert outcomes == []
                sock.close()
        assert sorted(outcomes) == ["receive", "send"]

        with pytest.raises(trio.ClosedResourceError):
            await sock.send_multipart([b"x"])
        with pytest.raises(trio.ClosedResourceError):
            sock.send_multipart_nowait([b"x"])
        with pytest.raises(trio.ClosedResourceError):
            await sock.receive_multipart()
        with pytest.raises(trio.ClosedResourceError):
            await sock.receive_batch()


async def test_a_receiver_and_a_sender_blocked_at_the_hwm_share_one_socket() -> None:
    count, size = 200, 64 * 1024
    sent = 0
    replies: list[bytes] = []
    router_may_read = trio.Event()

    async def send_all() -> None:
        nonlocal sent
        for n in range(count):
            await sock.send_multipart([b"%d" % n, b"x" * size])
            sent += 1

    async def receive_all() -> None:
        while len(replies) < count:
            for frames in await sock.receive_batch():
                replies.append(frames[0])

    async def echo_when_allowed() -> None:
        await router_may_read.wait()
        while True:
            for identity, number, _ in await router.receive_batch():
                await router.send_multipart([identity, number])

    with short_tempdir() as workdir, zmq_context() as ctx:
        endpoint = f"ipc://{workdir}/router.sock"
        raw = ctx.socket(zmq.ROUTER)
        raw.setsockopt(zmq.RCVHWM, 1)
        raw.bind(endpoint)
        async with ZSocket(raw) as router, dealer(ctx, endpoint, b"both", hwm=1) as sock:
            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(echo_when_allowed)
                    async with trio.open_nursery() as both:
                        both.start_soon(receive_all)
                        both.start_soon(send_all)
                        await trio.testing.wait_all_tasks_blocked(cushion=0.1)
                        # Both tasks now wait on the same socket: the reader for a reply, the
                        # writer for room. trio allows one waiter per fd; the other must park.
                        assert 0 < sent < count
                        assert replies == []
                        router_may_read.set()
                    nursery.cancel_scope.cancel()

    assert sent == count
    assert replies == [b"%d" % n for n in range(count)]


@pytest.mark.parametrize("queue_full", [True, False], ids=["send-waits", "send-goes-through"])
async def test_a_sender_that_takes_the_read_edge_wakes_the_receiver(queue_full: bool) -> None:
    big = [b"x" * 65536]
    received = trio.Event()
    with short_tempdir() as workdir, zmq_context() as ctx:
        endpoint = f"ipc://{workdir}/router.sock"
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.RCVHWM, 1)
        router.bind(endpoint)
        # With a high-water mark of 1 every message ZeroMQ moves would signal the fd again, and
        # that fresh edge would hide a lost one; only the full queue needs the small mark.
        async with dealer(ctx, endpoint, b"d", hwm=1 if queue_full else 0) as sock:
            await sock.send_multipart([b"hello"])  # the router knows `d` once this arrives
            assert router.poll(5000)
            assert router.recv_multipart() == [b"d", b"hello"]
            if queue_full:
                fill_send_queue(sock, big)  # the router never reads: every send now has to wait

            with trio.move_on_after(5):
                async with trio.open_nursery() as nursery:

                    async def receive_then_stop_sender() -> None:
                        assert await sock.receive_multipart() == [b"reply"]
                        received.set()
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(receive_then_stop_sender)
                    await trio.testing.wait_all_tasks_blocked()  # the receiver sleeps on the fd
                    router.send_multipart([b"d", b"reply"])
                    assert zmq_fd_readable(sock, timeout=5)
                    # A send looks at pending commands only if it has not done so for a while.
                    select.select([], [], [], 0.02)
                    # Without a checkpoint in between, this task's send processes the pending
                    # commands: that takes the edge the receiver is sleeping on.
                    await sock.send_multipart(big if queue_full else [b"ping"])
                    await trio.sleep_forever()  # the receiver cancels this once it got its message
        router.close(linger=0)
    assert received.is_set(), "the receiver slept through its message"


@pytest.mark.parametrize("message_waiting", [False, True], ids=["receive-waits", "receive-gets-one"])
async def test_a_receiver_that_takes_the_write_edge_wakes_the_sender(message_waiting: bool) -> None:
    big = [b"x" * 65536]
    sent = trio.Event()
    with short_tempdir() as workdir, zmq_context() as ctx:
        endpoint = f"ipc://{workdir}/router.sock"
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.RCVHWM, 1)
        router.bind(endpoint)
        async with dealer(ctx, endpoint, b"d", hwm=1) as sock:
            fill_send_queue(sock, big)

            with trio.move_on_after(5):
                async with trio.open_nursery() as nursery:

                    async def send_then_stop_receiver() -> None:
                        await sock.send_multipart([b"last"])
                        sent.set()
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(send_then_stop_receiver)
                    await trio.testing.wait_all_tasks_blocked()  # the sender sleeps on the fd
                    # Make room: the router reads until the dealer signals it can send again.
                    while True:
                        with contextlib.suppress(zmq.Again):
                            while True:
                                router.recv_multipart(zmq.NOBLOCK)
                        if zmq_fd_readable(sock, timeout=0.05):
                            break
                    if message_waiting:
                        router.send_multipart([b"d", b"hello"])
                        select.select([], [], [], 0.05)  # let it land, without a checkpoint
                    # Without a checkpoint in between, this task's receive processes the pending
                    # commands: that takes the edge the sender is sleeping on.
                    if message_waiting:
                        assert await sock.receive_multipart() == [b"hello"]
                        await trio.sleep_forever()  # the sender cancels this once it got through
                    else:
                        await sock.receive_multipart()
        router.close(linger=0)
    assert sent.is_set(), "the sender slept through the room it was waiting for"
