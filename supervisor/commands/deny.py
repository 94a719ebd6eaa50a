"""`deny ID [--reason TEXT]`: refuse a call that waits for an operator's approval."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from mcpvisor.supervisor.commands import command
from mcpvisor.supervisor.commands.allow import Refusal, render

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


@command(
    "deny",
    args=Refusal,
    options={"--reason": "reason"},
    usage="deny ID [--reason TEXT]",
    render=render,
    operator_only=True,
)
async def deny(sup: Supervisor, args: Refusal) -> dict[str, Any]:
    """Refuse a call that waits for approval (see `calls`); its client is told, with the reason if given.

    Exits 4 when no call with this id waits (decided already, timed out, or its client went away).
    The verdict is recorded in the activity log. With `state_url`, a call held by any replica.
    """
    return msgspec.to_builtins(await sup.ask_frontend("deny", args.id, reason=args.reason))
