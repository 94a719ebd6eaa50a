"""`pid [NAME|all]`."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from mcpvisor.supervisor.commands import Names, command

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


def render(result: dict[str, int]) -> str:
    if list(result) == ["mcpvisor"]:
        return str(result["mcpvisor"])
    if len(result) == 1:
        return str(next(iter(result.values())))
    return "\n".join(f"{name} {pid}" for name, pid in result.items())


@command("pid", args=Names, usage="pid [NAME|all]", render=render)
async def pid(sup: Supervisor, args: Names) -> dict[str, int]:
    """The supervisor's pid; with NAME that process's pid (0 when not running); `all` for every one."""
    if not args.names:
        return {"mcpvisor": os.getpid()}
    return {sup.display_name(program): program.pid for program in sup.resolve(args.names)}
