"""`server.remove NAME` (for the frontend's upstream_servers tool)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcpvisor.supervisor.commands import EXIT_UNKNOWN, CommandError, command

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


@command("server.remove", ctl=False)
async def server_remove(sup: Supervisor, args: list[str], data: Any) -> dict[str, Any]:
    """Remove a server: stop its worker and delete its table from the config file."""
    if len(args) != 1:
        raise CommandError("usage: server.remove NAME")
    name = args[0]
    if name not in sup.config.servers:
        raise CommandError(f"{name}: no such server", EXIT_UNKNOWN)
    await sup.change_server(name, None)
    return {"name": name, "removed": True}
