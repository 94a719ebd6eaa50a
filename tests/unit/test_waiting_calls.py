"""The registry of calls that wait for an operator, on one host: hold, list, allow, deny, time out, reload.

Given a call held for approval, an operator's verdict ends its wait; the first verdict wins; a
verdict for a call no longer waiting is a clear error; a reload of the policies decides the held
calls again; progress ticks reach the waiting client while it waits.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from mcpvisor.frontend.gate.waiting_calls import Held, UnknownCall, WaitingCalls, new_row
from mcpvisor.runtime.policies import Decision


def a_row(registry: WaitingCalls, timeout: float = 300.0) -> object:
    return new_row(
        call_id=registry.new_id(),
        tenant="alice",
        tool="github:delete_repository",
        arguments='{"repo":"acme/x"}',
        policies=("destructive-waits",),
        timeout=timeout,
        endpoint="/mcp/direct",
    )


async def test_an_allowed_call_stops_waiting_and_is_no_longer_listed(autojump_clock: trio.testing.MockClock) -> None:
    registry = WaitingCalls()
    held = await registry.hold(a_row(registry))  # type: ignore[arg-type]
    assert [row.id for row in await registry.listing()] == [held.row.id]
    ticks: list[float] = []

    async def tick(waited: float) -> None:
        ticks.append(waited)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(registry.wait, held, 300.0, tick)
        await trio.sleep(12)
        row = await registry.decide(held.row.id, "allow", "", "ctl")
        assert row.tool == "github:delete_repository"
    assert (held.verdict, held.decided_by) == ("allow", "ctl")
    assert ticks == [5.0, 10.0]  # progress while it waited
    assert await registry.listing() == []
    await registry.release(held)
    with pytest.raises(UnknownCall, match="is waiting for approval: it was decided already"):
        await registry.decide(held.row.id, "deny", "too late", "ctl")


async def test_the_first_verdict_wins(autojump_clock: trio.testing.MockClock) -> None:
    registry = WaitingCalls()
    held = await registry.hold(a_row(registry))  # type: ignore[arg-type]
    await registry.decide(held.row.id, "deny", "not today", "api:ops")
    with pytest.raises(UnknownCall):
        await registry.decide(held.row.id, "allow", "", "ctl")
    await registry.wait(held, 300.0)
    assert (held.verdict, held.reason, held.decided_by) == ("deny", "not today", "api:ops")


async def test_no_verdict_within_the_timeout_refuses(autojump_clock: trio.testing.MockClock) -> None:
    registry = WaitingCalls()
    held = await registry.hold(a_row(registry, timeout=60))  # type: ignore[arg-type]
    start = trio.current_time()
    await registry.wait(held, 60.0)
    assert trio.current_time() - start == pytest.approx(60.0)
    assert held.verdict == "timeout"
    assert held.reason == "no operator decided within 60 s (approval_timeout)"
    await registry.release(held)
    with pytest.raises(UnknownCall):
        await registry.decide(held.row.id, "allow", "", "ctl")


async def test_an_unknown_id_is_a_clear_error() -> None:
    with pytest.raises(UnknownCall, match="no call 'nope' is waiting for approval"):
        await WaitingCalls().decide("nope", "allow", "", "ctl")


async def test_a_client_gone_releases_its_call(autojump_clock: trio.testing.MockClock) -> None:
    registry = WaitingCalls()
    held = await registry.hold(a_row(registry))  # type: ignore[arg-type]
    with trio.move_on_after(10):
        await registry.wait(held, 300.0)
    await registry.release(held)
    assert await registry.listing() == []
    with pytest.raises(UnknownCall):
        await registry.decide(held.row.id, "allow", "", "ctl")


@pytest.mark.parametrize(
    ("decision", "verdict"),
    [
        (Decision("deny", ("now-forbidden",), ("no more deletions",)), "deny"),
        (Decision("allow", ("now-allowed",)), "allow"),
        (Decision("approval", ("still-waits",)), None),
    ],
)
async def test_a_reload_decides_the_held_calls_again(decision: Decision, verdict: str | None) -> None:
    registry = WaitingCalls()
    held: Held = await registry.hold(a_row(registry), redecide=lambda: decision)  # type: ignore[arg-type]
    await registry.policies_reloaded()
    assert held.verdict == verdict
    if verdict is not None:
        assert held.decided_by == "policies"
        assert held.reason == f"the policies as reloaded: {decision.explanation}"
    else:
        assert [row.id for row in await registry.listing()] == [held.row.id]
