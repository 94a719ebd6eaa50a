"""`login NAME`, `logout NAME` and `logins`: the OAuth logins to remote upstreams, as the operator sees them."""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

from mcpvisor.store import oauth_store
from mcpvisor.supervisor.commands import EXIT_UNKNOWN, Args, CommandError, Name, command

if TYPE_CHECKING:
    from mcpvisor.supervisor.process import Program
    from mcpvisor.supervisor.supervisor import Supervisor

LOGIN_ANSWER_TIMEOUT = 45.0  # discovery and registration happen before the worker has a URL


def _worker(sup: Supervisor, name: str) -> Program:
    if name == "frontend":
        raise CommandError("frontend: name a remote server")
    return sup.resolve([name], allow_all=False)[0]


def render_login(result: dict[str, Any]) -> str:
    if not result.get("url"):
        return f"{result['name']}: already logged in"
    return (
        f"To log in to {result['name']}, open this URL in a browser:\n\n  {result['url']}\n\n"
        f"The authorization server sends the browser back to {result['redirect_uri']}."
    )


@command("login", args=Name, usage="login NAME", render=render_login)
async def login(sup: Supervisor, args: Name) -> dict[str, Any]:
    """Log in to a remote server that asks for OAuth: print the authorization URL to open.

    The server's state is `authenticating` until the login completes: the authorization server
    sends the browser back to mcpvisor's listener at /oauth/callback, the worker exchanges the code
    for tokens (kept in the data dir, mode 0600) and connects. `ctl status NAME` then shows
    `ready` and when the token expires; it is refreshed before then. A tenant's worker is named
    TENANT/SERVER and logs in on its own. Exits 4 for an unknown server.
    """
    program = _worker(sup, args.name)
    # The browser comes back to the frontend: no URL before it can take the redirect.
    if not await sup.wait_frontend():
        raise CommandError(
            f"the frontend, which takes the login's redirect at /oauth/callback, is not serving"
            f" ({sup.frontend_state()}); try again once `mcpvisor ctl status frontend` says RUNNING"
        )
    settings = sup.config.mcpvisor
    uri = oauth_store.redirect_uri(settings.listen, settings.public_url)
    return await sup.ask_worker(program, "oauth_login", {"redirect_uri": uri}, timeout=LOGIN_ANSWER_TIMEOUT)


@command("logout", args=Name, usage="logout NAME", render=lambda result: f"{result['name']}: logged out")
async def logout(sup: Supervisor, args: Name) -> dict[str, Any]:
    """Forget a remote server's tokens; it waits in `authenticating` for the next `login`.

    TENANT/SERVER disconnects that tenant's own account (the tenant logs in again with the
    server's login tool). Exits 4 for an unknown server.
    """
    tenant, _, server = args.name.rpartition("/")
    config = sup.config.servers.get(server)
    if config is None or (
        tenant and (tenant not in sup.config.tenants or server not in sup.config.tenants[tenant].servers)
    ):
        # A tenant or server removed from the config leaves its stored login behind, still listed
        # by `logins`: it can always be revoked.
        if args.name not in await sup.stored_logins():
            raise CommandError(f"{args.name}: no such server", EXIT_UNKNOWN)
        return await _forget(sup, args.name)
    if tenant and config.oauth is not None and config.oauth.shared:
        raise CommandError(f"{args.name}: its login is shared by every tenant: `mcpvisor ctl logout {server}`")
    program = sup.programs.get(f"worker:{args.name}")
    if program is None or program.pid is None or not config.enabled:
        # No worker runs it (disabled, or a tenant's idle one): forget the stored tokens directly.
        return await _forget(sup, args.name)
    return await sup.ask_worker(program, "oauth_logout")


async def _forget(sup: Supervisor, name: str) -> dict[str, Any]:
    had = await sup.remove_login(name)
    if had:
        with contextlib.suppress(CommandError):  # the activity log is the frontend's; it may be down
            await sup.ask_frontend("account", name, ["logout"])
    return {"name": name, "connected": had}


def render_logins(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no upstream logins kept"
    lines = []
    for row in rows:
        expires = row.get("expires")
        left = f"token expires in {max(0, round((expires - time.time()) / 60))} min" if expires else "no expiry known"
        lines.append(f"{row['name']:<32} {left}{' (shared by every tenant)' if row.get('shared') else ''}")
    return "\n".join(lines)


@command("logins", args=Args, usage="logins", render=render_logins)
async def logins(sup: Supervisor, args: Args) -> list[dict[str, Any]]:
    """The upstream logins kept (the operator's and each tenant's own): never a token.

    Each row names the worker (SERVER or TENANT/SERVER) and when its access token expires;
    `mcpvisor ctl logout NAME` disconnects one.
    """
    rows = []
    for worker, expires in (await sup.stored_logins()).items():
        tenant, _, server = worker.rpartition("/")
        config = sup.config.servers.get(server)
        shared = not tenant and config is not None and config.oauth is not None and config.oauth.shared
        rows.append({"name": worker, "tenant": tenant, "server": server, "expires": expires, "shared": shared})
    return rows
