"""`approve NAME [TOOL...]`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from mcpvisor.supervisor.commands import Args, command
from mcpvisor.supervisor.commands.server_propose import apply_proposal

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


class ServerTools(Args):
    name: str
    tools: list[str] = []


def render(result: dict[str, Any]) -> str:
    if result.get("kind") == "proposal":
        done = "approved and applied" if result["action"] == "approve" else "rejected"
        return f"{result['name']}: proposed {result['proposal']} {done}"
    if result["action"] == "approve":
        what = f"tools {', '.join(result['tools'])} approved" if result["tools"] else "approved"
        approved = ", ".join(result["approved_tools"]) or "none"
        return f"{result['name']}: {what} (approved tools: {approved})"
    if result["tools"]:
        return f"{result['name']}: tools {', '.join(result['tools'])} blocked"
    return f"{result['name']}: blocked (quarantined)"


@command("approve", args=ServerTools, usage="approve NAME [TOOL...]", render=render)
async def approve(sup: Supervisor, args: ServerTools) -> dict[str, Any]:
    """Approve a server: take it out of quarantine and pin its tools as they are now.

    When an MCP client proposed a change to NAME (see `pending`), approving NAME applies that
    change instead (an added server runs, unquarantined) and writes the config file; approve
    again for its tools.

    With TOOL..., approve only those tools (a changed tool, or some tools of a quarantined server);
    the others stay withheld. The server must be connected so its tools are known. Clients see the
    approved tools at once; the config file records `quarantined = false`. Review first with
    `inspect NAME`. Exits 4 for an unknown server or tool.
    """
    proposal = sup.proposals.get(args.name)
    if proposal is not None and not args.tools:
        return await apply_proposal(sup, proposal)
    return msgspec.to_builtins(await sup.ask_frontend("approve", args.name, args.tools))
