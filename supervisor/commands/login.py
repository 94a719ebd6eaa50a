"""`login NAME` and `logout NAME`: an operator's OAuth login to a remote upstream."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcpvisor.supervisor.commands import CommandError, Name, command
from mcpvisor.wire import oauth_store
from mcpvisor.wire.config import parse_listen

if TYPE_CHECKING:
    from mcpvisor.supervisor.process import Program
    from mcpvisor.supervisor.supervisor import Supervisor

CALLBACK_PATH = "/oauth/callback"
LOGIN_ANSWER_TIMEOUT = 45.0  # discovery and registration happen before the worker has a URL


def redirect_uri(listen: str) -> str:
    """The redirect URI at mcpvisor's own listener (a wildcard address is reached on loopback)."""
    host, port = parse_listen(listen)
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://{f'[{host}]' if ':' in host else host}:{port}{CALLBACK_PATH}"


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
    uri = redirect_uri(sup.config.mcpvisor.listen)
    return await sup.ask_worker(program, "oauth_login", {"redirect_uri": uri}, timeout=LOGIN_ANSWER_TIMEOUT)


@command("logout", args=Name, usage="logout NAME", render=lambda result: f"{result['name']}: logged out")
async def logout(sup: Supervisor, args: Name) -> dict[str, Any]:
    """Forget a remote server's tokens; it waits in `authenticating` for the next `login`.

    Exits 4 for an unknown server.
    """
    if args.name != "frontend" and args.name in sup.config.servers and not sup.config.servers[args.name].enabled:
        # No worker runs it: forget the stored tokens directly.
        oauth_store.remove(oauth_store.token_path(sup.data_dir, args.name))
        return {"name": args.name}
    program = _worker(sup, args.name)
    return await sup.ask_worker(program, "oauth_logout")
