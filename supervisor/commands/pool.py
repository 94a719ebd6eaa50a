"""`pool.start` and `pool.idle`: the frontend starts a tenant's workers on use and stops idle ones.

Frontend-only (not offered by `ctl`): the frontend sees every request, so it knows when a
tenant starts using mcpvisor and when it has stopped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mcpvisor.supervisor.commands import Args, CommandError, command

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


class PoolArgs(Args):
    tenant: str  # "" : the workers without a tenant (used by operators when tenants exist)


def _check(sup: Supervisor, tenant: str) -> None:
    if tenant and tenant not in sup.config.tenants:
        raise CommandError(f"{tenant}: no such tenant")


@command("pool.start", args=PoolArgs, ctl=False)
async def pool_start(sup: Supervisor, args: PoolArgs) -> list[str]:
    """Start a tenant's workers that are not running (its first request, or the first after idling)."""
    _check(sup, args.tenant)
    return await sup.start_pool(args.tenant)


@command("pool.idle", args=PoolArgs, ctl=False)
async def pool_idle(sup: Supervisor, args: PoolArgs) -> list[str]:
    """Stop a tenant's workers: it made no request for its idle time."""
    _check(sup, args.tenant)
    return await sup.stop_idle(args.tenant)
