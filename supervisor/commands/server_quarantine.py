"""`server.quarantine` (for the frontend's quarantine_security tool)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from mcpvisor.supervisor.commands import EXIT_UNKNOWN, Args, CommandError, command

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


class QuarantineArgs(Args):
    name: str
    quarantined: bool


@command("server.quarantine", args=QuarantineArgs, ctl=False)
async def server_quarantine(sup: Supervisor, args: QuarantineArgs) -> dict[str, Any]:
    """Quarantine (true) or approve (false) a server (data: {name, quarantined}); persisted."""
    name, quarantined = args.name, args.quarantined
    server = sup.config.servers.get(name)
    if server is None:
        raise CommandError(f"{name}: no such server", EXIT_UNKNOWN)
    if server.quarantined != quarantined:
        # Only the flag changes: the worker and its upstream session stay as they are.
        await sup.change_server(name, msgspec.structs.replace(server, quarantined=quarantined))
    return {"name": name, "quarantined": quarantined}
