"""`server.add` (for the frontend's upstream_servers tool)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcpvisor.supervisor import configstore
from mcpvisor.supervisor.commands import Args, CommandError, command
from mcpvisor.wire.config import SERVER_NAME
from mcpvisor.wire.secrets import redact_table

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


def redacted(table: dict[str, Any]) -> dict[str, Any]:
    """A server table safe to show: env and header values redacted."""
    shown = dict(table)
    for key in ("env", "headers"):
        if isinstance(shown.get(key), dict):
            shown[key] = redact_table(shown[key])
    return shown


class AddArgs(Args):
    name: str
    config: dict[str, Any] = {}


@command("server.add", args=AddArgs, ctl=False)
async def server_add(sup: Supervisor, args: AddArgs) -> dict[str, Any]:
    """Add a server (data: {name, config}); it starts quarantined, and the config file is updated."""
    name = args.name
    if not SERVER_NAME.match(name) or name == "frontend":
        raise CommandError(f"invalid server name {name!r}: letters, digits, '_', '-', '.', at most 63 characters")
    if name in sup.config.servers:
        raise CommandError(f"server {name!r} already exists (use patch to change it)")
    table = dict(args.config)
    # Tools of a server nobody has reviewed yet are not shown to models until an operator approves.
    table["quarantined"] = True
    server = configstore.server_from_table(name, table, source=f"server {name!r}")
    await sup.change_server(name, server)
    return {"name": name, "quarantined": True, "config": redacted(configstore.server_table(server))}
