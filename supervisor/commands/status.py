"""`status [NAME...]`."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from mcpvisor.supervisor.commands import EXIT_NOT_RUNNING, EXIT_OK, EXIT_UNKNOWN, Args, CommandError, command

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


def render(rows: list[dict[str, Any]]) -> str:
    """supervisorctl's layout, then the upstream's state and tool count for workers."""
    if not rows:
        return "no processes"
    name_width = max(len(row["name"]) for row in rows) + 2
    desc_width = max(len(row["description"]) for row in rows) + 3
    # `connecting` and `authenticating` are longer than `ready`: the column fits the longest shown.
    upstream_width = max([len(row.get("upstream") or "") for row in rows] + [6]) + 2
    lines = []
    for row in rows:
        line = f"{row['name']:<{name_width}}{row['state']:<10}{row['description']:<{desc_width}}"
        if row.get("upstream"):
            line += f"{row['upstream']:<{upstream_width}}{row['tools']} tool{'s' if row['tools'] != 1 else ''}"
            if row.get("error") and row["upstream"] != "ready":
                line += f"  ({row['error']})"
            if row.get("token_expires"):
                line += f"  {describe_expiry(row['token_expires'])}"
        lines.append(line.rstrip())
    return "\n".join(lines)


def describe_expiry(expires: float, now: float | None = None) -> str:
    """`token expires in 59m` (or `token expired 3m ago`) for an upstream's login."""
    left = int(expires - (time.time() if now is None else now))
    span = abs(left)
    text = (
        f"{span // 3600}h{span % 3600 // 60:02d}m" if span >= 3600 else f"{span // 60}m" if span >= 60 else f"{span}s"
    )
    return f"token expires in {text}" if left >= 0 else f"token expired {text} ago"


def exit_code(rows: list[dict[str, Any]]) -> int:
    """LSB: 3 when anything listed is not running."""
    return EXIT_OK if all(row["state"] == "RUNNING" for row in rows) else EXIT_NOT_RUNNING


class StatusArgs(Args):
    names: list[str] = []
    tenant: str | None = None


@command(
    "status",
    args=StatusArgs,
    options={"--tenant": "tenant"},
    usage="status [--tenant TENANT] [NAME...]",
    render=render,
    exit_code=exit_code,
)
async def status(sup: Supervisor, args: StatusArgs) -> list[dict[str, Any]]:
    """Show every process (or NAME...): state, pid and uptime, and each upstream's state and tools.

    A tenant's workers are named TENANT/SERVER; --tenant shows only that tenant's. Disabled
    servers are listed as STOPPED, a tenant's workers that are not in use as STOPPED (idle).
    Exits 3 when something is not running, 4 for an unknown name or tenant.
    """
    if args.tenant is not None:
        if args.tenant not in sup.config.tenants:
            raise CommandError(f"{args.tenant}: no such tenant", EXIT_UNKNOWN)
        prefix = f"{args.tenant}/"
        logins = await sup.stored_logins()
        rows = [sup.status_row(p, logins) for p in sup.programs.values() if sup.display_name(p).startswith(prefix)]
        return sorted(rows, key=lambda row: row["name"])
    if args.names:
        programs = sup.resolve(args.names, allow_all=True)
        logins = await sup.stored_logins()
        return [sup.status_row(program, logins) for program in programs]
    logins = await sup.stored_logins()
    rows = [sup.status_row(program, logins) for program in sup.programs.values()]
    for name, server in sup.config.servers.items():
        if not server.enabled:
            rows.append({"name": name, "state": "STOPPED", "description": "disabled", "pid": 0, "uptime": 0})
    return sorted(rows, key=lambda row: (row["name"] != "frontend", row["name"]))
