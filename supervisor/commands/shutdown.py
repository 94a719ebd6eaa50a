"""`shutdown`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mcpvisor.supervisor.commands import Args, command

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


@command("shutdown", usage="shutdown", render=lambda _result: "Shut down")
async def shutdown(sup: Supervisor, args: Args) -> None:
    """Stop every process gracefully and exit the supervisor (as SIGTERM does)."""
    sup.shutdown_requested.set()
