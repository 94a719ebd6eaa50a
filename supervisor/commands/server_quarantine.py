"""`server.quarantine` (for the frontend's quarantine_security tool)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from mcpvisor.supervisor.commands import EXIT_UNKNOWN, CommandError, command

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


@command("server.quarantine", ctl=False)
async def server_quarantine(sup: Supervisor, args: list[str], data: Any) -> dict[str, Any]:
    """Quarantine (true) or approve (false) a server (data: {name, quarantined}); persisted."""
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("name"), str)
        or not isinstance(data.get("quarantined"), bool)
    ):
        raise CommandError("server.quarantine needs data {name: str, quarantined: bool}")
    name = data["name"]
    server = sup.config.servers.get(name)
    if server is None:
        raise CommandError(f"{name}: no such server", EXIT_UNKNOWN)
    if server.quarantined != data["quarantined"]:
        # Only the flag changes: the worker and its upstream session stay as they are.
        await sup.change_server(name, msgspec.structs.replace(server, quarantined=data["quarantined"]))
    return {"name": name, "quarantined": data["quarantined"]}
