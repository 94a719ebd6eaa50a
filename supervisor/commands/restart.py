"""`restart NAME...|all`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcpvisor.supervisor.commands import command
from mcpvisor.supervisor.commands.start import outcomes_exit, render_outcomes

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


@command("restart", usage="restart NAME...|all", render=render_outcomes, exit_code=outcomes_exit)
async def restart(sup: Supervisor, args: list[str], data: Any) -> list[dict[str, Any]]:
    """Stop, then start processes (a new worker process, so a new upstream session)."""
    programs = sup.resolve(args)
    await sup.stop_programs(programs)
    await sup.start_programs(programs)
    rows = []
    for program in programs:
        ok = program.state.value == "RUNNING"
        outcome = "restarted" if ok else f"ERROR ({program.state}: {program.description() or 'see its log'})"
        rows.append({"name": sup.display_name(program), "outcome": outcome, "state": str(program.state)})
    return rows
