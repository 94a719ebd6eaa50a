"""Operator changes into the activity log: the frontend writes the log (and its hash chain), so the
supervisor tells it, after the fact, which command changed what.

Only commands that change what runs or what clients may use are told (a `status` is not an
event). A command the frontend sent (the admin API on an operator's behalf, or a tenant's
`upstream_servers restart`) is recorded as by "frontend"; one from the control socket as by "ctl".
Telling never holds a command up: it is sent once the command has answered, and a frontend that
is not running misses it (the supervisor's log has every command either way).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from mcpvisor.supervisor.commands import CommandError
from mcpvisor.wire.messages import Command

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor

log = logging.getLogger(__name__)

AUDITED: Final = frozenset(
    {
        "start",
        "stop",
        "restart",
        "enable",
        "disable",
        "update",
        "reload",
        "approve",
        "block",
        "server.add",
        "server.patch",
        "server.remove",
        "server.quarantine",
    }
)


async def tell_frontend(sup: Supervisor, command: Command, by: str) -> None:
    """Record a command that succeeded as an operator change (kind "operator") in the activity log."""
    target = " ".join(command.args)
    if not target and isinstance(command.data, dict):
        target = str(command.data.get("name", ""))
    try:
        await sup.ask_frontend("operator", name=target[:200], tools=[command.name], reason=by)
    except CommandError as exc:
        log.debug("operator change %s not recorded: %s", command.name, exc.message)
