"""The worker's side of `ctl login` / `ctl logout` and of the redirect that reaches `/oauth/callback`.

A login is started only by the supervisor on an operator's command (the control socket); the
frontend can only hand in a redirect, which completes a login solely when its `state` is the one
this worker put in the authorization URL it gave the operator.
"""

from __future__ import annotations

import itertools
import logging
import secrets
from collections.abc import Callable
from typing import Any

import httpx2
import msgspec
import trio
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.auth import AuthorizationCodeResult

from mcpvisor.store.oauth_store import LOGIN_AFTER_OPENING
from mcpvisor.workers.oauth import LoginError, UpstreamAuth

log = logging.getLogger(__name__)

LOGIN_TIMEOUT = 600.0  # how long an operator's authorization URL waits for its redirect
URL_TIMEOUT = 30.0  # discovery and registration, before the URL can be shown
COMPLETE_TIMEOUT = 30.0  # the token exchange after the redirect
REPLACED = "replaced by a newer login"


class CallbackParams(msgspec.Struct, kw_only=True):
    """What the authorization server put on the redirect (RFC 6749 §4.1.2, RFC 9207)."""

    state: str = ""
    code: str = ""
    iss: str | None = None
    error: str = ""
    error_description: str = ""
    # Set by the frontend, never from the query: a hash of the login cookie the browser presented
    # (the one the tenant's login link set), "" without one.
    binding: str = ""


class LoginDesk:
    """At most one login in flight for this worker's upstream."""

    def __init__(
        self,
        name: str,
        auth: UpstreamAuth,
        on_login: Callable[[], None],
        on_failure: Callable[[str], None],
        http: Callable[[], httpx2.AsyncClient] = create_mcp_http_client,
    ) -> None:
        self.name = name
        self._http = http
        self.auth = auth
        self._on_login = on_login
        self._on_failure = on_failure
        self._scope: trio.CancelScope | None = None
        self._done = trio.Event()
        self.error = ""  # why the last login failed
        # How each recent login ended ("" when it succeeded), by its number: a caller reports its own
        # login's end, not that of a newer one started meanwhile (which resets `error`).
        self._runs = itertools.count(1)
        self._run = 0
        self._ended: dict[int, str] = {}
        # A tenant's login is bound to the browser that opened its link: the hash of that link's
        # cookie. An operator's (`ctl login`) has none.
        self.binding = ""

    @property
    def pending(self) -> bool:
        return self._scope is not None

    async def start(
        self, redirect_uri: str, nursery: trio.Nursery, *, binding: str = "", link_ttl: float = 0.0
    ) -> dict[str, Any]:
        """Begin a login (or return the one in flight): the authorization URL for the operator.

        A tenant's login (`binding`) always starts afresh, so only the newest link works, and an
        operator's does not join a tenant's. It waits as long as its link (`link_ttl`) can be
        opened, then as long as the browser has to log in once it is.
        """
        if self._scope is not None and (binding or self.binding):
            self.error = REPLACED
            self.cancel()
            await self._done.wait()
        if self._scope is None:
            self.binding = binding
            self.error = ""
            self._done = trio.Event()
            wait = link_ttl + LOGIN_AFTER_OPENING if binding else LOGIN_TIMEOUT
            self._scope = trio.CancelScope(deadline=trio.current_time() + wait)
            self._run = next(self._runs)
            self.auth.begin_login()
            nursery.start_soon(self._login, redirect_uri, self._scope, self._done, self._run)
        done, run = self._done, self._run
        with trio.move_on_after(URL_TIMEOUT):
            async with trio.open_nursery() as race:

                async def url() -> None:
                    await self.auth.wait_for_url()
                    race.cancel_scope.cancel()

                async def finished() -> None:
                    await done.wait()
                    race.cancel_scope.cancel()

                race.start_soon(url)
                race.start_soon(finished)
        if self.auth.authorization_url and not done.is_set():
            return {"name": self.name, "url": self.auth.authorization_url, "redirect_uri": redirect_uri}
        error = self._ended.get(run, self.error) if done.is_set() else self.error
        if done.is_set() and not error:
            return {"name": self.name, "url": "", "done": True}
        raise LoginError(error or f"no authorization URL within {URL_TIMEOUT:g}s")

    async def _login(self, redirect_uri: str, scope: trio.CancelScope, done: trio.Event, run: int) -> None:
        try:
            with scope:
                async with self._http() as http:
                    await self.auth.login(redirect_uri, http)
                log.info("upstream %s: logged in", self.name)
                self._on_login()
            if scope.cancelled_caught and not self.error:
                self.error = "the login was not completed in time; start it again"
        except LoginError as exc:
            self.error = str(exc)
            log.warning("upstream %s: login failed: %s", self.name, self.error)
        except Exception as exc:  # the login's boundary: whatever it raised, the worker lives
            # Only the exception's type: its message may quote what a remote server sent.
            self.error = f"the login failed ({type(exc).__name__}); start it again"
            log.error("upstream %s: login failed: %s", self.name, type(exc).__name__)
        finally:
            if self._scope is scope:
                self._scope = None
            if self.error and self.error != REPLACED:
                self._on_failure(self.error)
            self._ended[run] = self.error
            for old in [key for key in self._ended if key < run - 16]:
                del self._ended[old]
            done.set()

    async def callback(self, params: CallbackParams) -> dict[str, Any]:
        """A redirect: `mine` tells the frontend whether this worker started that login."""
        state = self.auth.state
        if self._scope is None or not state or not secrets.compare_digest(params.state.encode(), state.encode()):
            return {"mine": False}
        if self.binding and not secrets.compare_digest(params.binding.encode(), self.binding.encode()):
            # Another browser than the one that opened the tenant's link: nothing is bound, and the
            # login stays waiting for its own browser.
            log.warning("upstream %s: a redirect came from a browser that did not open the login link", self.name)
            return {"mine": True, "ok": False, "name": self.name, "error": "this login was started in another browser"}
        done = self._done
        if params.error:
            self.error = f"the authorization server answered {params.error!r}" + (
                f": {params.error_description[:200]}" if params.error_description else ""
            )
            self.cancel()
            return {"mine": True, "ok": False, "name": self.name, "error": self.error}
        self.auth.deliver(AuthorizationCodeResult(code=params.code, state=params.state, iss=params.iss))
        with trio.move_on_after(COMPLETE_TIMEOUT):
            await done.wait()
        if not done.is_set():
            return {"mine": True, "ok": False, "name": self.name, "error": "the token exchange did not finish in time"}
        if self.error:
            return {"mine": True, "ok": False, "name": self.name, "error": self.error}
        return {"mine": True, "ok": True, "name": self.name}

    def cancel(self) -> None:
        if self._scope is not None:
            self._scope.cancel()
