"""2026-07-28 calls carried over rounds: questions out as input requests, answers back in."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.lowlevel

from mcpvisor.frontend.door.calls import AskFailed
from mcpvisor.frontend.door.rounds import Rounds
from mcpvisor.wire.errors import ErrorCode, WireError


class Call:
    """Stands for a ClientCall: what Rounds touches of it."""

    def __init__(self, request: str = "round 1") -> None:
        self.request = request
        self.rounds: Any = None


async def test_each_question_is_a_round_and_the_answers_reach_the_upstream(nursery: trio.Nursery) -> None:
    rounds = Rounds(ttl=60)
    await nursery.start(rounds.serve)
    await trio.lowlevel.checkpoint()
    answers: list[bytes] = []
    seen_ctx: list[str] = []

    async def request(params: dict[str, Any], call: Call) -> bytes:
        assert params == {"name": "t"}
        answers.append(await call.rounds.ask("elicitation/create", {"message": "colour?"}))
        answers.append(await call.rounds.ask("sampling/createMessage", {"messages": []}))
        seen_ctx.append(call.request)
        return b'{"content": []}'

    first = await rounds.forward(request, "ev", "tools/call", {"name": "t"}, Call())
    assert isinstance(first, dict) and first["resultType"] == "input_required"
    assert first["inputRequests"] == {
        "elicitation-1": {"method": "elicitation/create", "params": {"message": "colour?"}}
    }
    state = first["requestState"]
    second = await rounds.forward(
        request,
        "ev",
        "tools/call",
        {"name": "t", "requestState": state, "inputResponses": {"elicitation-1": {"action": "accept"}}},
        Call("round 2"),
    )
    assert isinstance(second, dict) and list(second["inputRequests"]) == ["sampling-2"]
    assert second["requestState"] == state
    last = await rounds.forward(
        request,
        "ev",
        "tools/call",
        {"name": "t", "requestState": state, "inputResponses": {"sampling-2": {"role": "assistant"}}},
        Call("round 3"),
    )
    assert last == b'{"content": []}'
    assert answers == [b'{"action":"accept"}', b'{"role":"assistant"}']
    assert seen_ctx == ["round 3"]  # progress and logs ride the newest round's request
    assert len(rounds) == 0


async def test_a_call_without_questions_is_one_round(nursery: trio.Nursery) -> None:
    rounds = Rounds(ttl=60)
    await nursery.start(rounds.serve)
    await trio.lowlevel.checkpoint()

    async def request(params: dict[str, Any], call: Call) -> bytes:
        raise WireError(ErrorCode.TIMEOUT, "no answer from server 'ev' within 1s")

    with pytest.raises(WireError, match="within 1s"):
        await rounds.forward(request, "ev", "tools/call", {"name": "t"}, Call())
    assert len(rounds) == 0


async def test_a_call_nobody_comes_back_to_is_cancelled_after_the_ttl(nursery: trio.Nursery, autojump_clock) -> None:
    rounds = Rounds(ttl=30)
    await nursery.start(rounds.serve)
    await trio.lowlevel.checkpoint()
    failures: list[str] = []
    stopped = trio.Event()

    async def request(params: dict[str, Any], call: Call) -> bytes:
        try:
            await call.rounds.ask("elicitation/create", {})
        except AskFailed as exc:
            failures.append(exc.message)
        try:
            await trio.sleep_forever()
        finally:
            stopped.set()
        raise AssertionError("unreachable")

    first = await rounds.forward(request, "ev", "tools/call", {"name": "t"}, Call())
    assert isinstance(first, dict)
    start = trio.current_time()
    await stopped.wait()
    assert trio.current_time() - start == pytest.approx(30)
    assert failures == ["the client did not come back with input within 30s"]
    assert len(rounds) == 0
    with pytest.raises(WireError, match="requestState names no call") as caught:
        await rounds.forward(request, "ev", "tools/call", {"name": "t", "requestState": first["requestState"]}, Call())
    assert caught.value.code is ErrorCode.BAD_REQUEST


async def test_answers_must_match_the_questions(nursery: trio.Nursery) -> None:
    rounds = Rounds(ttl=60)
    await nursery.start(rounds.serve)
    await trio.lowlevel.checkpoint()
    outcome: list[str] = []

    async def request(params: dict[str, Any], call: Call) -> bytes:
        try:
            await call.rounds.ask("roots/list", {})
        except AskFailed as exc:
            outcome.append(exc.message)
        return b"{}"

    with pytest.raises(WireError, match="without the requestState"):
        await rounds.forward(request, "ev", "tools/call", {"name": "t", "inputResponses": {"x": {}}}, Call())
    first = await rounds.forward(request, "ev", "tools/call", {"name": "t"}, Call())
    assert isinstance(first, dict)
    state = first["requestState"]
    with pytest.raises(WireError, match="answers nothing that was asked: nope"):
        await rounds.forward(
            request, "ev", "tools/call", {"name": "t", "requestState": state, "inputResponses": {"nope": {}}}, Call()
        )
    with pytest.raises(WireError, match="requestState names no call"):  # another server's call
        await rounds.forward(request, "other", "tools/call", {"name": "t", "requestState": state}, Call())
    # Coming back without an answer fails that question at the upstream, which then finishes.
    assert await rounds.forward(request, "ev", "tools/call", {"name": "t", "requestState": state}, Call()) == b"{}"
    assert outcome == ["the client did not answer roots/list"]


async def test_a_client_that_gives_up_on_a_round_stops_the_call(nursery: trio.Nursery) -> None:
    rounds = Rounds(ttl=60)
    await nursery.start(rounds.serve)
    await trio.lowlevel.checkpoint()
    stopped = trio.Event()

    async def request(params: dict[str, Any], call: Call) -> bytes:
        try:
            await trio.sleep_forever()
        finally:
            stopped.set()
        raise AssertionError("unreachable")

    with trio.move_on_after(0.1):
        await rounds.forward(request, "ev", "tools/call", {"name": "t"}, Call())
    with trio.fail_after(1):
        await stopped.wait()
    assert len(rounds) == 0
