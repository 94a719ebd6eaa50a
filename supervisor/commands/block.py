"""`block NAME [TOOL...]`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from mcpvisor.supervisor.commands import command
from mcpvisor.supervisor.commands.approve import ServerTools, render

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


@command("block", args=ServerTools, usage="block NAME [TOOL...]", render=render)
async def block(sup: Supervisor, args: ServerTools) -> dict[str, Any]:
    """Block a server: put it in quarantine, so clients no longer see or call its tools.

    With TOOL..., withhold only those tools until they are approved again. The config file records
    `quarantined = true`; the worker keeps running. Exits 4 for an unknown server or tool.
    """
    return msgspec.to_builtins(await sup.ask_frontend("block", args.name, args.tools))
