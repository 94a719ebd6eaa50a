"""`disable NAME`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcpvisor.supervisor.commands import command
from mcpvisor.supervisor.commands.enable import render, set_enabled

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


@command("disable", usage="disable NAME", render=render)
async def disable(sup: Supervisor, args: list[str], data: Any) -> dict[str, Any]:
    """Disable a server: stop its worker, hide its tools and write `enabled = false` to the config file."""
    return await set_enabled(sup, args, False)
