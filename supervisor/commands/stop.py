"""`stop NAME...|all`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcpvisor.supervisor.commands import Names, command
from mcpvisor.supervisor.commands.start import outcomes_exit, render_outcomes

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


@command("stop", args=Names, usage="stop NAME...|all", render=render_outcomes, exit_code=outcomes_exit)
async def stop(sup: Supervisor, args: Names) -> list[dict[str, Any]]:
    """Stop processes: stopsignal to the process group, stopwaitsecs, then SIGKILL.

    A stopped server stays configured and enabled; `start` brings it back, a restart of mcpvisor
    starts it again (use `disable` to keep it off).
    """
    programs = sup.resolve(args.names)
    await sup.stop_programs(programs)
    return [{"name": sup.display_name(p), "outcome": "stopped", "state": str(p.state)} for p in programs]
