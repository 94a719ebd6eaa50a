"""`calls`: the calls waiting for an operator's approval."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import msgspec

from mcpvisor.supervisor.commands import Args, command
from mcpvisor.wire.operator import WaitingCalls

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor

ARGUMENTS_SHOWN = 80  # characters of the redacted arguments in the table; --json gives them whole


def waited(seconds: float) -> str:
    seconds = max(0, int(seconds))
    minutes, seconds = divmod(seconds, 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


def render(result: list[dict[str, Any]]) -> str:
    if not result:
        return "No calls are waiting for approval"
    now = time.time()
    rows = [
        (
            call["id"],
            call["tenant"],
            call["tool"],
            waited(now - call["since"]),
            waited(call["expires"] - now),
            ", ".join(call["policies"]),
            call["arguments"] if len(call["arguments"]) <= ARGUMENTS_SHOWN else call["arguments"][:77] + "...",
        )
        for call in result
    ]
    header = ("ID", "TENANT", "TOOL", "WAITING", "LEFT", "POLICIES", "ARGUMENTS")
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header) - 1)]
    lines = []
    for row in [header, *rows]:
        cells = "  ".join(f"{value!s:<{width}}" for value, width in zip(row, widths, strict=False))
        lines.append(f"{cells}  {row[-1]}".rstrip())
    return "\n".join(lines)


@command("calls", usage="calls", render=render)
async def calls(sup: Supervisor, args: Args) -> list[dict[str, Any]]:
    """List the calls waiting for an operator's approval, oldest first.

    A call waits when an `@approval("operator")` policy permits it. Each row: its id, tenant
    ("local" without tenants), `server:tool`, how long it has waited and has left before
    `approval_timeout` refuses it, the policies that hold it, and its arguments, redacted as the
    activity log redacts them. With `state_url`, every replica's waiting calls.

    Decide with `allow ID` or `deny ID [--reason TEXT]`.
    """
    result = await sup.ask_frontend("calls")
    assert isinstance(result, WaitingCalls)
    return [msgspec.to_builtins(call) for call in result.calls]
