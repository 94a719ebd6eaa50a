"""`start NAME...|all`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcpvisor.supervisor.commands import EXIT_ERROR, EXIT_OK, command

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


def render_outcomes(rows: list[dict[str, Any]]) -> str:
    return "\n".join(f"{row['name']}: {row['outcome']}" for row in rows)


def outcomes_exit(rows: list[dict[str, Any]]) -> int:
    return EXIT_OK if all(not row["outcome"].startswith("ERROR") for row in rows) else EXIT_ERROR


@command("start", usage="start NAME...|all", render=render_outcomes, exit_code=outcomes_exit)
async def start(sup: Supervisor, args: list[str], data: Any) -> list[dict[str, Any]]:
    """Start processes and wait until each is RUNNING; also the only way out of FATAL."""
    programs = sup.resolve(args)
    await sup.start_programs(programs)
    rows = []
    for program in programs:
        ok = program.state.value == "RUNNING"
        outcome = "started" if ok else f"ERROR ({program.state}: {program.description() or 'see its log'})"
        rows.append({"name": sup.display_name(program), "outcome": outcome, "state": str(program.state)})
    return rows
