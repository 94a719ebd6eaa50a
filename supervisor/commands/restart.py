"""`restart NAME...|all`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcpvisor.supervisor.commands import Names, command
from mcpvisor.supervisor.commands.start import outcomes_exit, render_outcomes, started_rows

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


@command("restart", args=Names, usage="restart NAME...|all", render=render_outcomes, exit_code=outcomes_exit)
async def restart(sup: Supervisor, args: Names) -> list[dict[str, Any]]:
    """Stop, then start processes (a new worker process, so a new upstream session)."""
    programs = sup.resolve(args.names)
    await sup.stop_programs(programs)
    await sup.start_programs(programs)
    return started_rows(sup, programs, "restarted")
