"""Whether a call may run: the door's one decision point, and the calls held for an operator.

Every call of an upstream tool, on every path (the endpoints, `call_tool_*`, `proxy`,
`code_execution`), is decided here after the gate (quarantine, pins) and before routing: the
`Decider` answers `Allow`, `Deny` (with the reason and the ids of the rules that decided) or
`Approval` (the call waits until an operator allows or denies it, or its time runs out). The
same decider says which tools are listed at all. Policies plug in as a `Decider`; until they do,
every call is allowed, except that the operator may hold tools for approval by name with
`MCPVISOR_HOLD_FOR_APPROVAL` (comma-separated `server:tool` patterns) in mcpvisor's environment.

A held call is visible in `HeldCalls` with its id, caller, tool and waiting time; only operator
code calls `allow` or `deny`. While it waits, a client that asked for progress hears every few
seconds that it waits, so it does not give up.
"""

from __future__ import annotations

import fnmatch
import itertools
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol

import trio

from mcpvisor.frontend.door.calls import Caller

HOLD_VARIABLE: Final = "MCPVISOR_HOLD_FOR_APPROVAL"
APPROVAL_TIMEOUT_VARIABLE: Final = "MCPVISOR_APPROVAL_TIMEOUT"
APPROVAL_TIMEOUT: Final = 300.0
WAITING_NOTICE: Final = 5.0  # seconds between a held call's "still waiting" progress notices

Kind = Literal["tool", "resource", "prompt"]


@dataclass(frozen=True, slots=True)
class Proposed:
    """A call about to be routed: who asks for what, and how."""

    caller: Caller
    server: str
    name: str  # the tool's (or prompt's) name at its server, or the resource's URI
    kind: Kind
    definition: dict[str, Any]
    arguments: Any  # as the client sent them (raw JSON or decoded); never logged by the door
    via: str


@dataclass(frozen=True, slots=True)
class Allow:
    pass


@dataclass(frozen=True, slots=True)
class Deny:
    reason: str
    rules: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Approval:
    """The call runs only once an operator allows it."""

    reason: str
    rules: tuple[str, ...] = ()
    timeout: float = APPROVAL_TIMEOUT


Decision = Allow | Deny | Approval
ALLOW: Final = Allow()


class Decider(Protocol):
    def listed(self, caller: Caller | None, server: str, tool: dict[str, Any]) -> bool:
        """Whether the tool is shown at all (on every list and search)."""
        ...

    def decide(self, proposed: Proposed) -> Decision:
        """Allow, deny or hold one call; quick (it runs on every call) and without I/O."""
        ...


class AllowAll:
    """Without policies: everything the gate lets through."""

    def listed(self, caller: Caller | None, server: str, tool: dict[str, Any]) -> bool:
        return True

    def decide(self, proposed: Proposed) -> Decision:
        return ALLOW


class HoldMatching(AllowAll):
    """Tools whose `server:tool` matches one of the operator's patterns wait for approval."""

    def __init__(self, patterns: list[str], timeout: float = APPROVAL_TIMEOUT) -> None:
        self.patterns = [p for p in patterns if p]
        self.timeout = timeout

    def decide(self, proposed: Proposed) -> Decision:
        name = f"{proposed.server}:{proposed.name}"
        for pattern in self.patterns:
            if fnmatch.fnmatchcase(name, pattern):
                return Approval(
                    f"the operator holds {pattern} for approval", (f"{HOLD_VARIABLE}={pattern}",), self.timeout
                )
        return ALLOW

    @classmethod
    def from_environment(cls, environ: dict[str, str] | os._Environ[str] = os.environ) -> Decider:
        patterns = [p.strip() for p in environ.get(HOLD_VARIABLE, "").split(",") if p.strip()]
        if not patterns:
            return AllowAll()
        try:
            timeout = float(environ.get(APPROVAL_TIMEOUT_VARIABLE, APPROVAL_TIMEOUT))
        except ValueError:
            timeout = APPROVAL_TIMEOUT
        return cls(patterns, timeout)


Verdict = Literal["allowed", "denied", "expired"]


@dataclass(eq=False)
class Held:
    """A call waiting for an operator."""

    id: str
    proposed: Proposed
    approval: Approval
    since: float = field(default_factory=time.time)
    verdict: Verdict | None = None
    reason: str = ""
    decided: trio.Event = field(default_factory=trio.Event)


class HeldCalls:
    """The calls of this frontend that wait for an operator's approval."""

    def __init__(self) -> None:
        self._held: dict[str, Held] = {}
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._held)

    def pending(self) -> list[Held]:
        return list(self._held.values())

    def allow(self, held_id: str) -> bool:
        return self._decide(held_id, "allowed", "")

    def deny(self, held_id: str, reason: str = "") -> bool:
        return self._decide(held_id, "denied", reason)

    def _decide(self, held_id: str, verdict: Verdict, reason: str) -> bool:
        held = self._held.get(held_id)
        if held is None or held.decided.is_set():
            return False
        held.verdict, held.reason = verdict, reason
        held.decided.set()
        return True

    async def wait(
        self, proposed: Proposed, approval: Approval, waiting: Callable[[Held, float], Awaitable[None]]
    ) -> Held:
        """Hold the call until it is decided or its time runs out; `waiting(held, seconds)` is
        called every few seconds meanwhile (to tell the client)."""
        held = Held(f"call-{next(self._ids)}", proposed, approval)
        self._held[held.id] = held
        try:
            with trio.move_on_after(approval.timeout):
                while not held.decided.is_set():
                    await waiting(held, time.time() - held.since)
                    with trio.move_on_after(WAITING_NOTICE):
                        await held.decided.wait()
            if held.verdict is None:
                held.verdict = "expired"
        finally:
            del self._held[held.id]
        return held
