"""`server.add`, `server.update` and `server.remove`: the operator's own changes to the servers.

The admin API (frontend/endpoints/admin_api.py) sends these on behalf of an operator it has
authenticated; unlike a client's `server.propose`, they apply at once, through the same path as
`ctl enable` and an approved proposal: the config file is written back, then the running set
follows it. An operator may write what a client may not (a command, secret references,
`quarantined`), so the table is checked only as the config file itself would be.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcpvisor.supervisor import configstore
from mcpvisor.supervisor.commands import EXIT_UNKNOWN, EXIT_USAGE, Args, CommandError, command
from mcpvisor.supervisor.commands.server_propose import check_name, redacted
from mcpvisor.wire.merge import deep_merge

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


class AddArgs(Args):
    name: str
    config: dict[str, Any]


class UpdateArgs(Args):
    name: str
    patch: dict[str, Any]


class RemoveArgs(Args):
    name: str


@command("server.add", args=AddArgs, ctl=False)
async def server_add(sup: Supervisor, args: AddArgs) -> dict[str, Any]:
    """Add a server as an operator (data: {name, config}); written to the config file and started."""
    check_name(args.name)
    if args.name in sup.config.servers:
        raise CommandError(f"server {args.name!r} already exists (change it with an update)")
    server = configstore.server_from_table(args.name, args.config, source=f"server {args.name!r}")
    await sup.change_server(args.name, server)
    await sup.on_proposals(sup.proposals.pop, args.name)  # a client's proposal for this name is moot now
    return {"name": args.name, "action": "add", "config": redacted(configstore.server_table(server))}


@command("server.update", args=UpdateArgs, ctl=False)
async def server_update(sup: Supervisor, args: UpdateArgs) -> dict[str, Any]:
    """Change a server as an operator (data: {name, patch}): a deep merge, `null` removes a key."""
    current = sup.config.servers.get(args.name)
    if current is None:
        raise CommandError(f"{args.name}: no such server", EXIT_UNKNOWN)
    if not args.patch:
        raise CommandError(f"server {args.name!r}: an update needs the fields to change", EXIT_USAGE)
    merged = deep_merge(configstore.server_table(current), args.patch)
    server = configstore.server_from_table(args.name, merged, source=f"server {args.name!r}")
    changed = server != current
    if changed:
        await sup.change_server(args.name, server)
    return {
        "name": args.name,
        "action": "update",
        "changed": changed,
        "config": redacted(configstore.server_table(server)),
    }


@command("server.remove", args=RemoveArgs, ctl=False)
async def server_remove(sup: Supervisor, args: RemoveArgs) -> dict[str, Any]:
    """Remove a server as an operator (data: {name}); its worker stops and its table leaves the file."""
    if args.name not in sup.config.servers:
        raise CommandError(f"{args.name}: no such server", EXIT_UNKNOWN)
    await sup.change_server(args.name, None)
    await sup.on_proposals(sup.proposals.pop, args.name)
    return {"name": args.name, "action": "remove"}
