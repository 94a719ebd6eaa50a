"""`disable NAME`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcpvisor.supervisor.commands import Name, command
from mcpvisor.supervisor.commands.enable import render, set_enabled

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


@command("disable", args=Name, usage="disable NAME", render=render)
async def disable(sup: Supervisor, args: Name) -> dict[str, Any]:
    """Disable a server: stop its worker, hide its tools and write `enabled = false` to the config file."""
    return await set_enabled(sup, args.name, False)
