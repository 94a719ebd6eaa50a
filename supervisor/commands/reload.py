"""`reload`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mcpvisor.supervisor import config as config_mod
from mcpvisor.supervisor.commands import Args, command

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


@command("reload", usage="reload", render=lambda _r: "Restarted every process with the config file")
async def reload(sup: Supervisor, args: Args) -> None:
    """Restart every process with the config file as it is now (update touches only what changed).

    A broken file changes nothing.
    """
    new = config_mod.load(sup.config_path)
    await sup.reload(new)
