"""`server.remove NAME` (for the frontend's upstream_servers tool)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcpvisor.supervisor.commands import EXIT_UNKNOWN, CommandError, Name, command

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


@command("server.remove", args=Name, usage="server.remove NAME", ctl=False)
async def server_remove(sup: Supervisor, args: Name) -> dict[str, Any]:
    """Remove a server: stop its worker and delete its table from the config file."""
    name = args.name
    if name not in sup.config.servers:
        raise CommandError(f"{name}: no such server", EXIT_UNKNOWN)
    await sup.change_server(name, None)
    return {"name": name, "removed": True}
