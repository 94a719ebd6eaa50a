"""`pending`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from mcpvisor.supervisor.commands import Args, command

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


def render(result: dict[str, Any]) -> str:
    rows = result["servers"]
    if not rows:
        return "Nothing is pending"
    width = max(len(row["name"]) for row in rows) + 2
    state_width = max(len(row["state"]) for row in rows) + 2
    lines = []
    for row in rows:
        line = f"{row['name']:<{width}}{row['reason']:<13}{row['state']:<{state_width}}"
        line += f"{row['tools']} tool{'s' if row['tools'] != 1 else ''}, risk {row['risk']}"
        changes = [f"{what}: {', '.join(row[what])}" for what in ("changed", "added", "removed") if row[what]]
        if changes:
            line += f"  ({'; '.join(changes)})"
        lines.append(line)
    return "\n".join(lines)


@command("pending", usage="pending", render=render)
async def pending(sup: Supervisor, args: Args) -> dict[str, Any]:
    """List what waits for an operator: quarantined servers, and tools changed since their approval.

    Review one with `inspect NAME`, then `approve NAME` or `block NAME`.
    """
    return msgspec.to_builtins(await sup.ask_frontend("pending"))
