"""A call at the door, before it reaches a worker: the policies decide, the limits count, an operator approves.

`admit` is the one check the door makes for every tools/call, resources/read and prompts/get, on
every path. It returns a `Pass` (the decision to record, and what to call when the call ends), or
raises `Stopped` with the answer to give: the policies refused it, a limit did, an operator denied
it, or no operator decided in time. A call a policy holds for approval waits here: its client gets
a progress notification every few seconds that says it waits for an operator (never how to
approve), and each verdict is recorded in the activity log.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from mcpvisor.frontend.gate.activity import ActivityLog, stored_text
from mcpvisor.frontend.gate.policy_gate import PolicyGate, refusal_meta, refusal_text
from mcpvisor.frontend.gate.tool_limits import META_RETRY_AFTER, ToolLimits
from mcpvisor.frontend.gate.waiting_calls import WaitingCalls, new_row
from mcpvisor.frontend.tool_args import error_result
from mcpvisor.runtime.policies import Decision
from mcpvisor.runtime.policy_vocabulary import Kind, principal_of
from mcpvisor.wire.policy_sources import PolicyBundle

log = logging.getLogger(__name__)

# Sends one progress notification to the waiting client: (seconds waited, message).
Progress = Callable[[float, str], Awaitable[None]]


@dataclass
class Pass:
    """The call may go on: what to record with it, and `done` once it has ended."""

    decision: str = ""  # as the activity log keeps it ("" without policies)
    policies: tuple[str, ...] = ()
    done: Callable[[], None] = field(default=lambda: None)


class Stopped(Exception):
    """The call must not run; `answer` is the result (isError) to give, the rest is for the record."""

    def __init__(self, answer: dict[str, Any], decision: str = "", policies: tuple[str, ...] = ()) -> None:
        super().__init__(answer["content"][0]["text"])
        self.answer = answer
        self.message = answer["content"][0]["text"]
        self.decision = decision
        self.policies = policies


@dataclass
class CallGate:
    """Policies, per-tool limits and the waiting calls, shared by every tenant's door."""

    policy: PolicyGate = field(default_factory=PolicyGate)
    limits: ToolLimits = field(default_factory=ToolLimits)
    waiting: WaitingCalls = field(default_factory=WaitingCalls)

    async def reload(self, bundle: PolicyBundle | None) -> None:
        """The supervisor sent the policies again: decide with them, and decide the waiting calls again."""
        if self.policy.reload(bundle):
            self.limits.configure(self.policy.config.limits)
            await self.waiting.policies_reloaded()

    async def admit(
        self,
        *,
        tenant: str,
        kind: Kind,
        server: str,
        item: Mapping[str, Any],
        name: str,
        arguments: Any,
        endpoint: str,
        via: str,
        client: str = "",
        progress: Progress | None = None,
        activity: ActivityLog | None = None,
    ) -> Pass:
        """Decide one call of `name` (`server:tool`, `server:uri`, `server:prompt`); Stopped when it must not run."""
        policy = self.policy

        def decide() -> Decision:
            return policy.decide(tenant, kind, server, item, arguments, endpoint=endpoint, via=via)

        decision = decide()
        recorded = policy.recorded(decision)
        if decision.effect == "deny" and policy.enforcing:
            answer = error_result(refusal_text(kind, name, decision))
            answer["_meta"] = refusal_meta(decision)
            raise Stopped(answer, recorded, decision.policies)
        over, done = self.limits.admit(tenant, name) if kind == "tool" else (None, _nothing)
        if over is not None:
            answer = error_result(over.message)
            answer["_meta"] = {META_RETRY_AFTER: over.retry_after}
            raise Stopped(answer, recorded, decision.policies)
        if decision.effect != "approval" or not policy.enforcing:
            return Pass(recorded, decision.policies, done)
        try:
            await self._approval(
                decision, decide, tenant, kind, server, name, arguments, endpoint, client, progress, activity
            )
        except BaseException:
            done()
            raise
        return Pass(recorded, decision.policies, done)

    async def _approval(
        self,
        decision: Decision,
        decide: Callable[[], Decision],
        tenant: str,
        kind: Kind,
        server: str,
        name: str,
        arguments: Any,
        endpoint: str,
        client: str,
        progress: Progress | None,
        activity: ActivityLog | None,
    ) -> None:
        """Hold the call until an operator allows it (returns) or denies it, or the time is up (Stopped)."""
        timeout = self.policy.config.approval_timeout
        row = new_row(
            call_id=self.waiting.new_id(),
            tenant=principal_of(tenant),
            tool=name,
            arguments=stored_text(arguments if arguments is not None else {}) or "{}",
            policies=decision.policies,
            timeout=timeout,
            endpoint=endpoint,
            client=client,
        )
        held = await self.waiting.hold(row, redecide=decide)
        named = ", ".join(f"'{policy}'" for policy in decision.policies)
        log.info("call %s: %s for %s waits for an operator (%s)", row.id, name, row.tenant, named)

        async def tick(waited: float) -> None:
            if progress is not None:
                message = (
                    f"Waiting for an operator's approval of {name} (call {row.id}, policy {named}):"
                    f" {waited:.0f} s so far, refused after {timeout:g} s"
                )
                await progress(waited, message)

        try:
            if progress is not None:
                await progress(0.0, f"Waiting for an operator's approval of {name} (call {row.id}, policy {named})")
            await self.waiting.wait(held, timeout, tick)
        finally:
            await self.waiting.release(held)
            if activity is not None and held.verdict is not None:
                where, _, what = name.partition(":")
                activity.record(
                    server=where,
                    tool=what,
                    variant=held.verdict,
                    intent=None,
                    outcome="ok" if held.verdict == "allow" else "blocked",
                    duration=0.0,
                    request_id=row.id,
                    client=held.decided_by,
                    endpoint=endpoint,
                    kind="approval",
                    tenant=tenant,
                    decision="approval",
                    policies=decision.policies,
                )
        log.info("call %s: %s by %s (%s)", row.id, held.verdict, held.decided_by, held.reason or "no reason given")
        if held.verdict == "allow":
            return
        noun = kind.title()
        if held.verdict == "timeout":
            waited = f"it waited for an operator's approval (policy {named})"
            text = f"{noun} '{name}' was not run: {waited} and {held.reason}."
        elif held.decided_by == "policies":
            text = f"{noun} '{name}' was not run: {held.reason}."
        else:
            because = f": {held.reason}" if held.reason else ""
            text = f"{noun} '{name}' was not run: an operator denied it (call {row.id}){because}."
        answer = error_result(text)
        answer["_meta"] = {**refusal_meta(decision), "io.mcpvisor/verdict": held.verdict}
        raise Stopped(answer, "approval", decision.policies)


def _nothing() -> None:
    return None


def progress_payload(waited: float, message: str) -> bytes:
    """A `notifications/progress` payload, as an upstream's progress reaches the door."""
    return msgspec.json.encode({"progress": waited, "message": message})
