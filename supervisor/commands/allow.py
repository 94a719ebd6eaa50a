"""`allow ID`: run a call that waits for an operator's approval."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from mcpvisor.supervisor.commands import Args, command

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


class CallId(Args):
    id: str


class Refusal(Args):
    id: str
    reason: str = ""


def render(result: dict[str, Any]) -> str:
    done = "allowed: it runs now" if result["verdict"] == "allow" else "denied: the client is told it was refused"
    because = f" ({result['reason']})" if result.get("reason") else ""
    return f"{result['id']}: {result['tool']} for {result['tenant']} {done}{because}"


@command("allow", args=CallId, usage="allow ID", render=render, operator_only=True)
async def allow(sup: Supervisor, args: CallId) -> dict[str, Any]:
    """Allow a call that waits for approval (see `calls`): it runs now, and its client gets the result.

    Exits 4 when no call with this id waits (decided already, timed out, or its client went away).
    The verdict is recorded in the activity log. With `state_url`, a call held by any replica.
    """
    return msgspec.to_builtins(await sup.ask_frontend("allow", args.id))
