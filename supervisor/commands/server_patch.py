"""`server.patch` (for the frontend's upstream_servers tool)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcpvisor.supervisor import configstore
from mcpvisor.supervisor.commands import EXIT_UNKNOWN, Args, CommandError, command
from mcpvisor.supervisor.commands.server_add import redacted
from mcpvisor.wire.merge import deep_merge

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


class PatchArgs(Args):
    name: str
    patch: dict[str, Any]


@command("server.patch", args=PatchArgs, ctl=False)
async def server_patch(sup: Supervisor, args: PatchArgs) -> dict[str, Any]:
    """Change a server by deep merge (data: {name, patch}): scalars replace, maps merge, null removes."""
    name = args.name
    current = sup.config.servers.get(name)
    if current is None:
        raise CommandError(f"{name}: no such server", EXIT_UNKNOWN)
    merged = deep_merge(configstore.server_table(current), args.patch)
    server = configstore.server_from_table(name, merged, source=f"server {name!r}")
    if server != current:
        await sup.change_server(name, server)
    return {"name": name, "config": redacted(configstore.server_table(server))}
