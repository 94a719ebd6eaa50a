"""`start NAME...|all`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcpvisor.supervisor.commands import EXIT_ERROR, EXIT_OK, Names, command
from mcpvisor.wire.states import ProcessState

if TYPE_CHECKING:
    from mcpvisor.supervisor.process import Program
    from mcpvisor.supervisor.supervisor import Supervisor


def render_outcomes(rows: list[dict[str, Any]]) -> str:
    return "\n".join(f"{row['name']}: {row['outcome']}" for row in rows)


def outcomes_exit(rows: list[dict[str, Any]]) -> int:
    return EXIT_OK if all(not row["outcome"].startswith("ERROR") for row in rows) else EXIT_ERROR


def started_rows(sup: Supervisor, programs: list[Program], done: str) -> list[dict[str, Any]]:
    """One row per program: `done` when it reached RUNNING, else the error and why."""
    rows = []
    for program in programs:
        ok = program.state is ProcessState.RUNNING
        outcome = done if ok else f"ERROR ({program.state}: {program.description() or 'see its log'})"
        rows.append({"name": sup.display_name(program), "outcome": outcome, "state": str(program.state)})
    return rows


@command("start", args=Names, usage="start NAME...|all", render=render_outcomes, exit_code=outcomes_exit)
async def start(sup: Supervisor, args: Names) -> list[dict[str, Any]]:
    """Start processes and wait until each is RUNNING; also the only way out of FATAL."""
    programs = sup.resolve(args.names)
    await sup.start_programs(programs)
    return started_rows(sup, programs, "started")
