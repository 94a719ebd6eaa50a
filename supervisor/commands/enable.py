"""`enable NAME`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from mcpvisor.supervisor.commands import EXIT_UNKNOWN, CommandError, Name, command

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


async def set_enabled(sup: Supervisor, name: str, enabled: bool) -> dict[str, Any]:
    server = sup.config.servers.get(name)
    if server is None:
        raise CommandError(f"{name}: no such server", EXIT_UNKNOWN)
    if server.enabled != enabled:
        await sup.change_server(name, msgspec.structs.replace(server, enabled=enabled))
    return {"name": name, "enabled": enabled}


def render(result: dict[str, Any]) -> str:
    return f"{result['name']}: {'enabled' if result['enabled'] else 'disabled'}"


@command("enable", args=Name, usage="enable NAME", render=render)
async def enable(sup: Supervisor, args: Name) -> dict[str, Any]:
    """Enable a server: start its worker and write `enabled = true` to the config file."""
    return await set_enabled(sup, args.name, True)
