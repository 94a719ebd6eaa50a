"""`approve NAME [TOOL...]`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from mcpvisor.supervisor.commands import Args, command

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


class ServerTools(Args):
    name: str
    tools: list[str] = []


def render(result: dict[str, Any]) -> str:
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

    With TOOL..., approve only those tools (a changed tool, or some tools of a quarantined server);
    the others stay withheld. The server must be connected so its tools are known. Clients see the
    approved tools at once; the config file records `quarantined = false`. Review first with
    `inspect NAME`. Exits 4 for an unknown server or tool.
    """
    return msgspec.to_builtins(await sup.ask_frontend("approve", args.name, args.tools))
