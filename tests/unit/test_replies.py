"""One-shot reply slots and the receive-and-decode loop (wire/replies.py, wire/inbox.py)."""

from __future__ import annotations

import msgspec
import pytest
import trio
import zmq

from mcpvisor.runtime.replies import PendingReplies
from mcpvisor.wire import codec
from mcpvisor.wire.inbox import serve_messages
from mcpvisor.wire.messages import Command, ControlMessage, Reply
from mcpvisor.wire.zsocket import ZSocket


async def test_an_answer_reaches_the_one_waiting_for_its_id() -> None:
    pending: PendingReplies[int, str] = PendingReplies()
    with pending.expect(1) as first, pending.expect(2) as second:
        assert pending.deliver(2, "two") and pending.deliver(1, "one")
        assert not pending.deliver(1, "again"), "the first answer wins"
        assert await first.wait(1) == "one"
        assert await second.wait(1) == "two"
    assert len(pending) == 0
    assert not pending.deliver(1, "late"), "nobody waits any more"


async def test_waiting_times_out_and_forgets_the_slot(autojump_clock: trio.testing.MockClock) -> None:
    pending: PendingReplies[int, str] = PendingReplies()
    with pytest.raises(trio.TooSlowError), pending.expect(7) as slot:
        await slot.wait(5)
    assert 7 not in pending
    with pending.expect(7), pytest.raises(ValueError, match="already waiting"), pending.expect(7):
        pass


async def test_deliver_all_answers_everyone_still_waiting() -> None:
    pending: PendingReplies[str, str] = PendingReplies()
    with pending.expect("a") as a, pending.expect("b") as b:
        pending.deliver("a", "ok")
        pending.deliver_all("gone")
        assert (await a.wait(1), await b.wait(1)) == ("ok", "gone")


async def test_the_loop_decodes_each_message_and_survives_garbage() -> None:
    ctx = zmq.Context()
    router_raw, dealer_raw = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    router_raw.bind("inproc://inbox-test")
    dealer_raw.connect("inproc://inbox-test")
    router, dealer = ZSocket(router_raw), ZSocket(dealer_raw)
    received: list[tuple[bytes, ControlMessage]] = []
    bad: list[Exception] = []
    done = trio.Event()

    async def handle(envelope: list[bytes], msg: ControlMessage, _payload: bytes | None) -> None:
        received.append((envelope[0], msg))
        if isinstance(msg, Reply):
            done.set()

    async def undecodable(_envelope: list[bytes], _frames: list[bytes], exc: Exception) -> None:
        bad.append(exc)

    deep = b"\x91" * 100_000 + b"\xc0"  # nested deeper than any stack
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                lambda: serve_messages(router, codec.control, handle, envelope=1, undecodable=undecodable)
            )
            await dealer.send_multipart(codec.control.encode(Command(id=1, name="status")))
            for garbage in (b"", b"\xff\xfe", b"\xa3\xbe\xbe\xbe", msgspec.msgpack.encode({"t": "cmd"}), deep):
                await dealer.send_multipart([garbage])
            await dealer.send_multipart(codec.control.encode(Reply(id=1, ok=True)))
            with trio.fail_after(5):
                await done.wait()
            nursery.cancel_scope.cancel()
    finally:
        router.close()
        dealer.close()
        ctx.term()
    assert [type(msg) for _, msg in received] == [Command, Reply]
    assert len({identity for identity, _ in received}) == 1
    assert len(bad) == 5
