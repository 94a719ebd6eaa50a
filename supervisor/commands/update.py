"""`update`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcpvisor.supervisor.commands import Args, command
from mcpvisor.supervisor.commands.reread import TELEMETRY_LATER, diff_result

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


def render(result: dict[str, Any]) -> str:
    lines = [f"{name}: added process group" for name in result["added"]]
    lines += [f"{name}: updated process group" for name in result["changed"]]
    lines += [f"{name}: removed process group" for name in result["removed"]]
    if result["settings_changed"]:
        lines.append("frontend: restarted with the new [mcpvisor] settings")
    if result.get("telemetry_changed"):
        lines.append(TELEMETRY_LATER)
    return "\n".join(lines) or "No config updates to processes"


@command("update", usage="update", render=render)
async def update(sup: Supervisor, args: Args) -> dict[str, Any]:
    """Apply the config file: start added servers, restart changed ones, stop removed ones.

    Unchanged workers keep running with their upstream session. A broken file changes nothing.
    SIGHUP does the same.
    """
    return diff_result(await sup.update())
