"""`block NAME [TOOL...]`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from mcpvisor.supervisor.commands import command
from mcpvisor.supervisor.commands.approve import ServerTools, render
from mcpvisor.supervisor.commands.server_propose import reject_proposal

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


@command("block", args=ServerTools, usage="block NAME [TOOL...]", render=render)
async def block(sup: Supervisor, args: ServerTools) -> dict[str, Any]:
    """Block a server: put it in quarantine, so clients no longer see or call its tools.

    With TOOL..., withhold only those tools until they are approved again. The config file records
    `quarantined = true`; the worker keeps running. Exits 4 for an unknown server or tool.
    When an MCP client proposed a change to NAME (see `pending`), blocking NAME rejects it.
    """
    proposal = sup.proposals.get(args.name)
    if proposal is not None and not args.tools:
        return await reject_proposal(sup, proposal)
    return msgspec.to_builtins(await sup.ask_frontend("block", args.name, args.tools))
