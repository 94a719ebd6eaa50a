"""`pending`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from mcpvisor.supervisor.commands import Args, command
from mcpvisor.supervisor.commands.server_propose import listing

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


def render(result: dict[str, Any]) -> str:
    rows, proposals = result["servers"], result.get("proposals", [])
    if not rows and not proposals:
        return "Nothing is pending"
    lines = []
    if proposals:
        width = max(len(row["name"]) for row in proposals) + 2
        for proposal in proposals:
            line = f"{proposal['name']:<{width}}proposed {proposal['action']:<9}{proposal['proposed_at']}"
            if "fields" in proposal:
                line += f"  (fields: {', '.join(proposal['fields'])})"
            lines.append(line)
    if not rows:
        return "\n".join(lines)
    width = max(len(row["name"]) for row in rows) + 2
    state_width = max(len(row["state"]) for row in rows) + 2
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
    """List what waits for an operator: client proposals, quarantined servers, changed tools.

    A proposal is a change an MCP client asked for (add, patch, remove, enable, disable a server):
    nothing of it runs until approved. A changed tool is one whose definition changed since its
    approval.

    Review one with `inspect NAME`, then `approve NAME` or `block NAME`.
    """
    result = msgspec.to_builtins(await sup.ask_frontend("pending"))
    result["proposals"] = [listing(proposal) for proposal in sup.proposals]
    return result
