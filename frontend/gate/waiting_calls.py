"""Calls that wait for an operator's approval: held here until allowed, denied or timed out.

A call a `@approval("operator")` policy holds is listed (`ctl calls`, the admin API, the console)
with its id, tenant, tool, arguments redacted as the activity log redacts them, and since when it
waits. Only an operator decides: `ctl allow|deny` reach `decide` through the supervisor, the
admin API and console call it behind the operator door; nothing an MCP client sends reaches it.

With a shared store (`state_url`), the waiting calls of every replica are rows of one table
(store/held_calls.py): any replica lists them and records a verdict, and the replica holding the
call hears it through NOTIFY (with a periodic re-read as a safety net) and runs or refuses it.
A verdict for a call that is no longer waiting (decided already, timed out, its client gone) is an
error that says so.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import msgspec
import trio

from mcpvisor.runtime.policies import Decision
from mcpvisor.store import held_calls
from mcpvisor.store.held_calls import HeldRow
from mcpvisor.store.state_db import HELD_CALLS, STORE_ERRORS, is_shared
from mcpvisor.wire.operator import CallVerdict, WaitingCall
from mcpvisor.wire.operator import WaitingCalls as WaitingList

log = logging.getLogger(__name__)

Verdict = Literal["allow", "deny", "timeout"]
Tick = Callable[[float], Awaitable[None]]  # told the seconds waited so far, every TICK seconds

TICK: Final = 5.0  # seconds between progress notifications to a waiting client
PRUNE_EVERY: Final = 60.0


class UnknownCall(Exception):
    """No call with this id waits for approval; the message says so and is safe to show."""

    def __init__(self, call_id: str) -> None:
        super().__init__(
            f"no call {call_id!r} is waiting for approval: it was decided already, it timed out, or its client"
            " went away (see the waiting calls with `mcpvisor ctl calls`)"
        )


@dataclass
class Held:
    """One call this frontend holds, and its verdict once there is one."""

    row: HeldRow
    redecide: Callable[[], Decision] | None = None  # the policies' decision again (after a reload)
    decided: trio.Event = field(default_factory=trio.Event)
    verdict: Verdict | None = None
    reason: str = ""
    decided_by: str = ""

    def settle(self, verdict: str, reason: str, decided_by: str) -> bool:
        """Take the first verdict; False when one was taken already."""
        if self.verdict is not None or verdict not in ("allow", "deny", "timeout"):
            return False
        self.verdict, self.reason, self.decided_by = verdict, reason, decided_by  # type: ignore[assignment]
        self.decided.set()
        return True


class WaitingCalls:
    """The registry of waiting calls: this frontend's, and with a shared store every replica's."""

    def __init__(self, store: Any = None) -> None:
        self.store = store if store is not None and is_shared(store) else None
        self.replica = uuid.uuid4().hex  # this frontend, as the shared rows name their holder
        self._held: dict[str, Held] = {}

    def __len__(self) -> int:
        return len(self._held)

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex[:12]

    # -- the holder's side -----------------------------------------------------------------------

    async def hold(self, row: HeldRow, redecide: Callable[[], Decision] | None = None) -> Held:
        """Register a call that waits; listed at once (StateStoreError when the shared store cannot list it)."""
        held = Held(row, redecide)
        self._held[row.id] = held
        if self.store is not None:
            try:
                await trio.to_thread.run_sync(held_calls.insert, self.store, self.replica, row)
            except BaseException:
                self._held.pop(row.id, None)
                raise
        return held

    async def wait(self, held: Held, timeout: float, tick: Tick | None = None) -> Held:
        """Until an operator decides, or `timeout` seconds pass (the verdict is then "timeout")."""
        started = trio.current_time()
        with trio.move_on_after(timeout):
            while not held.decided.is_set():
                with trio.move_on_after(TICK):
                    await held.decided.wait()
                if not held.decided.is_set() and tick is not None:
                    await tick(trio.current_time() - started)
        if held.verdict is None:
            await self._time_out(held, timeout)
        return held

    async def _time_out(self, held: Held, timeout: float) -> None:
        reason = f"no operator decided within {timeout:g} s (approval_timeout)"
        if self.store is None:
            held.settle("timeout", reason, "timeout")
            return
        # The first verdict wins in the shared row too: an operator's that came in just now is kept.
        call_id = held.row.id
        try:
            row = await trio.to_thread.run_sync(held_calls.decide, self.store, call_id, "timeout", reason, "timeout")
            if row is None and (found := await trio.to_thread.run_sync(held_calls.verdict_of, self.store, call_id)):
                held.settle(found.verdict, found.reason, found.decided_by)
        except STORE_ERRORS as exc:
            log.warning("waiting call %s: cannot record its timeout: %s", held.row.id, exc)
        held.settle("timeout", reason, "timeout")

    async def release(self, held: Held) -> None:
        """The call is over (run, refused, or its client gone): no longer listed or decidable."""
        self._held.pop(held.row.id, None)
        if held.verdict is None:
            held.settle("deny", "the call ended before a verdict", "gone")
        if self.store is not None:
            with trio.CancelScope(shield=True), trio.move_on_after(5.0):
                try:
                    await trio.to_thread.run_sync(held_calls.remove, self.store, held.row.id)
                except STORE_ERRORS as exc:
                    log.warning("waiting call %s: cannot remove its row: %s", held.row.id, exc)

    # -- the operator's side ---------------------------------------------------------------------

    async def listing(self) -> list[HeldRow]:
        """Every waiting call, oldest first (every replica's, with a shared store)."""
        if self.store is not None:
            return await trio.to_thread.run_sync(held_calls.waiting, self.store)
        return sorted((held.row for held in self._held.values() if held.verdict is None), key=lambda row: row.since)

    async def decide(self, call_id: str, verdict: Literal["allow", "deny"], reason: str, decided_by: str) -> HeldRow:
        """An operator's verdict on a waiting call; UnknownCall when no such call waits."""
        held = self._held.get(call_id)
        if self.store is not None:
            row = await trio.to_thread.run_sync(held_calls.decide, self.store, call_id, verdict, reason, decided_by)
            if row is None:
                raise UnknownCall(call_id)
            if held is not None:  # held here: no need to wait for the notification
                held.settle(verdict, reason, decided_by)
            return row
        if held is None or not held.settle(verdict, reason, decided_by):
            raise UnknownCall(call_id)
        return held.row

    async def policies_reloaded(self) -> None:
        """Decide the calls held here again: refused or allowed by the new policies, they wait no more."""
        for held in list(self._held.values()):
            if held.verdict is not None or held.redecide is None:
                continue
            decision = held.redecide()
            if decision.effect == "approval":
                continue
            verdict: Literal["allow", "deny"] = "allow" if decision.effect == "allow" else "deny"
            reason = f"the policies as reloaded: {decision.explanation}"
            try:
                await self.decide(held.row.id, verdict, reason, "policies")
            except UnknownCall:
                continue  # decided meanwhile by an operator
            except STORE_ERRORS as exc:
                log.warning("waiting call %s: cannot record the reloaded policies' verdict: %s", held.row.id, exc)
                held.settle(verdict, reason, "policies")

    # -- replicas --------------------------------------------------------------------------------

    async def serve_following(self) -> None:
        """Apply verdicts other replicas recorded on calls held here (shared store only)."""
        if self.store is None:
            return
        from mcpvisor.store.state_pg import follow  # loads the driver

        async def on_change(_topics: frozenset[str]) -> None:
            if not self._held:
                return
            for found in await trio.to_thread.run_sync(held_calls.decided, self.store, self.replica):
                held = self._held.get(found.id)
                if held is not None:
                    held.settle(found.verdict, found.reason, found.decided_by)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._serve_pruning)
            await follow(self.store, frozenset({HELD_CALLS}), on_change, waiting="approvals of waiting calls")

    async def _serve_pruning(self) -> None:
        while True:
            try:
                await trio.to_thread.run_sync(held_calls.prune, self.store)
            except STORE_ERRORS as exc:
                log.warning("waiting calls: cannot prune rows of gone replicas: %s", exc)
            await trio.sleep(PRUNE_EVERY)


def new_row(
    *,
    call_id: str,
    tenant: str,
    tool: str,
    arguments: str,
    policies: tuple[str, ...],
    timeout: float,
    endpoint: str = "",
    client: str = "",
) -> HeldRow:
    now = time.time()
    return HeldRow(
        id=call_id,
        tenant=tenant,
        tool=tool,
        arguments=arguments,
        since=now,
        expires=now + timeout,
        policies=list(policies),
        endpoint=endpoint,
        client=client,
    )


async def operator_answer(
    registry: WaitingCalls, action: str, call_id: str, reason: str, decided_by: str
) -> WaitingList | CallVerdict:
    """`calls`, `allow ID` or `deny ID` for an operator (ctl, the admin API): the listing or the verdict."""
    if action == "calls":
        rows = await registry.listing()
        return WaitingList(calls=[msgspec.convert(msgspec.to_builtins(row), WaitingCall) for row in rows])
    verdict: Literal["allow", "deny"] = "allow" if action == "allow" else "deny"
    row = await registry.decide(call_id, verdict, reason, decided_by)
    return CallVerdict(id=row.id, verdict=verdict, tool=row.tool, tenant=row.tenant, reason=reason)
