"""OAuth 2.1 toward one remote upstream: tokens on every request, refresh, and the login flow.

The protocol is the MCP SDK's (`mcp.client.auth.OAuthClientProvider`): protected resource
metadata (RFC 9728), authorization server metadata (RFC 8414, OpenID fallback), a Client ID
Metadata Document or dynamic registration (RFC 7591), PKCE S256, `resource` (RFC 8707), the
issuer checks (RFC 9207) and scope selection with step-up. What mcpvisor changes is who starts a
login: the SDK logs in inline, inside whichever request met the 401; a worker cannot wait for a
person there. So requests only ever carry and refresh tokens here; a challenge they cannot answer
is recorded, and the upstream waits in `authenticating` until an operator runs `ctl login`, which
feeds that recorded challenge to the SDK's flow out of band (`login`), never resending the request.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Any, Literal, Union, cast

import httpx2
import trio
from mcp.client.auth import OAuthClientProvider, OAuthFlowError, OAuthRegistrationError, OAuthTokenError
from mcp.client.auth.oauth2 import OAuthContext
from mcp.client.auth.utils import extract_field_from_www_auth
from mcp.shared._httpx_utils import next_request_within_origin
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthMetadata,
    OAuthToken,
    ProtectedResourceMetadata,
)
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from pydantic import AnyUrl, ValidationError

from mcpvisor.runtime.addresses import Reach, resolve_reach
from mcpvisor.store import oauth_store
from mcpvisor.wire.config import UpstreamOAuth
from mcpvisor.wire.secrets import resolve

if TYPE_CHECKING:  # the database driver loads only with a shared store
    from mcpvisor.store.oauth_pg import RefreshHold, SharedRecord

log = logging.getLogger(__name__)
Record = Union[oauth_store.FileRecord, "SharedRecord"]

CLIENT_NAME = "mcpvisor"
REFRESH_AHEAD = 60.0  # refresh this long before the access token expires (a quarter of short lifetimes)
_MAX_REDIRECTS = 5
# A token lifetime beyond this is taken as this: the SDK adds `expires_in` to the clock as a float,
# and an absurd one (10**400) would raise OverflowError inside its handlers.
MAX_TOKEN_LIFETIME = 365 * 24 * 3600


def _without_tracebacks(record: logging.LogRecord) -> bool:
    """Drop the SDK's own traceback of a failed flow: its message can carry a response body.

    The login reports its failure itself, in words that name the status and the host only.
    """
    return record.exc_info is None


logging.getLogger("mcp.client.auth.oauth2").addFilter(_without_tracebacks)


class LoginError(Exception):
    """A login that could not be completed; the message is safe to show the operator."""


class _Storage:
    """The SDK's TokenStorage, kept in the worker's token file (store/oauth_store.py)."""

    def __init__(self, auth: UpstreamAuth) -> None:
        self.auth = auth

    async def get_tokens(self) -> OAuthToken | None:
        return self.auth.context.current_tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.auth.context.current_tokens = tokens
        await self.auth.save()

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.auth.context.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.auth.context.client_info = client_info
        await self.auth.save()


class _Context(OAuthContext):
    def update_token_expiry(self, token: OAuthToken) -> None:
        if token.expires_in is not None and token.expires_in > MAX_TOKEN_LIFETIME:
            token.expires_in = MAX_TOKEN_LIFETIME
        super().update_token_expiry(token)


class Challenge:
    """A 401 or 403 the worker could not answer with the tokens it has: what a login starts from."""

    def __init__(self, request: httpx2.Request, response: httpx2.Response) -> None:
        self.request = request
        self.status = response.status_code
        self.headers = httpx2.Headers(response.headers)
        self.scope = extract_field_from_www_auth(response, "scope")
        self.error = extract_field_from_www_auth(response, "error")

    @property
    def step_up(self) -> bool:
        return self.status == 403

    def response(self) -> httpx2.Response:
        return httpx2.Response(self.status, headers=self.headers, request=self.request)

    def reason(self) -> str:
        if self.step_up:
            return (
                f"the server asks for more permission (scope {self.scope!r})"
                if self.scope
                else ("the server asks for more permission")
            )
        if self.error == "invalid_token":
            return "the server refused the token"
        return "the server asks for a login"


class UpstreamAuth(OAuthClientProvider):
    """An httpx2 Auth for one upstream: tokens from the worker's login record, refreshed ahead of expiry.

    The record is a file (`oauth_store.FileRecord`) or, with a shared store, a row every replica
    reads (`oauth_pg.SharedRecord`); its calls block on the store, so they are made from threads.
    """

    def __init__(
        self,
        server_url: str,
        record: Record,
        settings: UpstreamOAuth | None,
        on_challenge: Callable[[Challenge], None],
        *,
        sse: bool = False,
    ) -> None:
        settings = settings or UpstreamOAuth()
        self.sse = sse  # a legacy SSE endpoint: probed with the GET that opens its stream
        metadata = OAuthClientMetadata(
            client_name=CLIENT_NAME,
            # Replaced by the listener's callback URL when a login starts (`login`).
            redirect_uris=["http://127.0.0.1/oauth/callback"],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
        )
        super().__init__(
            server_url,
            metadata,
            _Storage(self),
            redirect_handler=self._on_authorization_url,
            callback_handler=self._wait_for_callback,
            client_metadata_url=settings.client_metadata_url,
        )
        self.context = _Context(**vars(self.context))
        self.record = record
        self.settings = settings
        self._on_challenge = on_challenge
        self._refresh_lock = trio.Lock()
        self._seen_version: object | None = None  # the record as this worker last read or wrote it
        self.challenge: Challenge | None = None
        self.reason = ""  # why a login is needed, while one is
        # The login in progress: its URL is handed to the operator, the callback brings the code.
        self.authorization_url = ""
        self.state = ""
        self._url_ready = trio.Event()
        self._code: trio.MemorySendChannel[AuthorizationCodeResult] | None = None
        self._code_in: trio.MemoryReceiveChannel[AuthorizationCodeResult] | None = None

    # -- the login record ------------------------------------------------------------------------

    async def record_version(self) -> object | None:
        """What changes whenever the record is written: another worker (`oauth.shared`) or replica may have."""
        return await trio.to_thread.run_sync(self.record.version)

    @property
    def seen_version(self) -> object | None:
        return self._seen_version

    def reload(self) -> None:
        """Take the record as it is now at the next request (another worker refreshed or logged in)."""
        self._initialized = False

    async def _initialize(self) -> None:
        stored, version = await trio.to_thread.run_sync(self._read)
        self._adopt(stored, version)

    def _read(self) -> tuple[oauth_store.TokenFile, object | None]:
        version = self.record.version()
        return self.record.load(), version

    def _adopt(self, stored: oauth_store.TokenFile, version: object | None) -> None:
        """Take `stored` (as of `version`) as this worker's tokens, registration and metadata."""
        self._seen_version = version
        context = self.context
        try:
            context.current_tokens = OAuthToken.model_validate(stored.tokens) if stored.tokens else None
            context.client_info = OAuthClientInformationFull.model_validate(stored.client) if stored.client else None
            context.oauth_metadata = (
                OAuthMetadata.model_validate(stored.server_metadata) if stored.server_metadata else None
            )
            prm = stored.resource_metadata
            context.protected_resource_metadata = ProtectedResourceMetadata.model_validate(prm) if prm else None
        except ValidationError:
            log.warning("the stored login for %s cannot be read; a new login is needed", self.context.server_url)
            context.current_tokens = context.client_info = None
            context.oauth_metadata = context.protected_resource_metadata = None
        context.token_expiry_time = stored.expires_at
        if (
            context.protected_resource_metadata is not None
            and context.protected_resource_metadata.authorization_servers
        ):
            context.auth_server_url = str(context.protected_resource_metadata.authorization_servers[0])
        if self.settings.client_id:
            context.client_info = self._configured_client()
        self._initialized = True

    def _configured_client(self) -> OAuthClientInformationFull:
        secret = resolve(self.settings.client_secret) if self.settings.client_secret else None
        return OAuthClientInformationFull(
            client_id=self.settings.client_id or "",
            client_secret=secret,
            redirect_uris=self.context.client_metadata.redirect_uris,
            # RFC 6749 §2.3.1's default; `_perform_authorization_code_grant` follows the server's list.
            token_endpoint_auth_method="client_secret_basic" if secret else "none",
        )

    def _content(self) -> oauth_store.TokenFile:
        context = self.context
        tokens = context.current_tokens
        if tokens is not None and tokens.expires_in is not None and context.token_expiry_time is None:
            context.update_token_expiry(tokens)
        client = context.client_info
        return oauth_store.TokenFile(
            tokens=tokens.model_dump(mode="json", exclude_none=True) if tokens else None,
            expires_at=context.token_expiry_time if tokens else None,
            # A client the operator configured lives in the config; its secret is never copied here.
            client=client.model_dump(mode="json", exclude_none=True)
            if client and not self.settings.client_id
            else None,
            server_metadata=_dump(context.oauth_metadata),
            resource_metadata=_dump(context.protected_resource_metadata),
        )

    async def save(self) -> None:
        content = self._content()
        with trio.CancelScope(shield=True):  # a record half known to be written would be reread wrongly
            self._seen_version = await trio.to_thread.run_sync(self.record.save, content)

    async def _commit(self, hold: RefreshHold | None) -> None:
        """Store the tokens a refresh brought (or dropped): through its hold of the shared record, or plainly."""
        if hold is None:
            await self.save()
            return
        content = self._content()
        with trio.CancelScope(shield=True):
            self._seen_version = await trio.to_thread.run_sync(hold.commit, content)

    async def forget(self) -> None:
        """Drop the tokens (logout); the registration and the servers' metadata stay for the next login."""
        self.context.clear_tokens()
        await self.save()

    @property
    def expires_at(self) -> float | None:
        return self.context.token_expiry_time if self.context.current_tokens else None

    @property
    def has_tokens(self) -> bool:
        return bool(self.context.current_tokens and self.context.current_tokens.access_token)

    # -- every request ---------------------------------------------------------------------------

    def _refresh_due(self) -> bool:
        context = self.context
        if not context.can_refresh_token():
            return False
        expiry = context.token_expiry_time
        if expiry is None:
            return False
        lifetime = context.current_tokens.expires_in if context.current_tokens else None
        ahead = min(REFRESH_AHEAD, (lifetime or math.inf) / 4)
        return time.time() >= expiry - ahead

    async def _auth_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        """Attach the token, refresh it when due or refused once, else record the challenge."""
        if not self._initialized or (
            self.settings.shared and not self.record.shared_store and await self.record_version() != self._seen_version
        ):
            # A shared login's file is written by every worker that refreshes it: take the newest. (In
            # the shared store, the worker's watch and the re-read before a refresh do that.)
            await self._initialize()
        self.context.protocol_version = request.headers.get(MCP_PROTOCOL_VERSION_HEADER)
        if self._refresh_due():
            async with self._refresh_lock:
                if self._refresh_due():
                    hold = await self._begin_refresh(None)
                    if hold is not False:
                        try:
                            response = yield await self._refresh_token()
                            await self._refreshed(response, hold)
                        finally:
                            await _release(hold)
        sent = self._attach(request)
        response = yield request
        if not _challenged(response):
            return
        if response.status_code == 401 and self.context.current_tokens is not None:
            async with self._refresh_lock:
                current = self.context.current_tokens
                # Another request may have refreshed meanwhile; else this one tries, once.
                if current is not None and current.access_token == sent and self.context.can_refresh_token():
                    hold = await self._begin_refresh(sent)
                    if hold is not False:
                        try:
                            refresh = yield await self._refresh_token()
                            await self._refreshed(refresh, hold)
                        finally:
                            await _release(hold)
            if self.has_tokens and self.context.current_tokens.access_token != sent:  # type: ignore[union-attr]
                self._attach(request)
                response = yield request
                if not _challenged(response):
                    return
        self._record(Challenge(request, response))

    def _attach(self, request: httpx2.Request) -> str | None:
        tokens = self.context.current_tokens
        if tokens is None or not tokens.access_token:
            request.headers.pop("Authorization", None)
            return None
        request.headers["Authorization"] = f"Bearer {tokens.access_token}"
        return tokens.access_token

    async def _begin_refresh(self, refused: str | None) -> RefreshHold | Literal[False] | None:
        """Before spending the refresh token: in the shared store, take the record's lock and read it again.

        False: another replica refreshed meanwhile (or its tokens differ from the `refused` one), and
        this worker now has its tokens; a hold: refresh now, under the lock, and commit through it;
        None: a file, refresh now. Spending a refresh token another replica already rotated would
        make many authorization servers revoke the whole grant.
        """
        record = self.record
        if not record.shared_store:
            return None
        hold, stored, version = await trio.to_thread.run_sync(cast("SharedRecord", record).hold)
        mine = self.context.current_tokens
        expected = refused or (mine.access_token if mine else None)
        if not stored.tokens or stored.tokens.get("access_token") != expected:
            # Refreshed by another replica, or logged out there: take the record as it is, refresh nothing.
            await _release(hold)
            self._adopt(stored, version)
            if not self.has_tokens:
                self.reason = "logged out"
            return False
        self._adopt(stored, version)  # the refresh token as stored, whatever this worker last read
        return hold

    async def _refreshed(self, response: httpx2.Response, hold: RefreshHold | None = None) -> None:
        if await self._handle_refresh_response(response):
            log.info("upstream %s: access token refreshed", self.context.server_url)
            await self._commit(hold)  # the SDK stored the tokens; the expiry goes with them
            return
        if hold is None and self.settings.shared and await self.record_version() != self._seen_version:
            # Another worker refreshed the shared login first (its refresh token is the new one).
            await self._initialize()
            if self.has_tokens:
                return
        # The SDK dropped the tokens from memory; the record must not bring them back.
        self._initialized = True
        self.context.clear_tokens()
        await self._commit(hold)
        self.reason = f"the authorization server refused to refresh the token (HTTP {response.status_code})"
        log.warning("upstream %s: %s", self.context.server_url, self.reason)

    def _record(self, challenge: Challenge) -> None:
        self.challenge = challenge
        if not (challenge.status == 401 and self.reason.startswith("the authorization server refused")):
            self.reason = challenge.reason()
        self._on_challenge(challenge)

    # -- the login (run by the operator's `ctl login`) -------------------------------------------

    def begin_login(self) -> None:
        """Forget the previous login's URL and code, before anyone waits for the next one's."""
        self._url_ready = trio.Event()
        self.authorization_url = self.state = ""
        self._code, self._code_in = trio.open_memory_channel[AuthorizationCodeResult](1)

    async def login(self, redirect_uri: str, http: httpx2.AsyncClient) -> None:
        """Run the authorization code flow from the recorded challenge (or a fresh probe); LoginError."""
        if not self._initialized:
            await self._initialize()
        context = self.context
        context.client_metadata.redirect_uris = [AnyUrl(redirect_uri)]
        client = context.client_info
        if self.settings.client_id:
            context.client_info = self._configured_client()
        elif client is not None and _registered_elsewhere(client, redirect_uri):
            context.client_info = None  # registered for another listener address: register again
        challenge = self.challenge or await self._probe(http)
        if challenge is None:
            raise LoginError("the server accepted a request without a login: nothing to log in to")
        flow = _Flow(httpx2.URL(self.context.server_url))
        with contextlib.suppress(OSError):  # an upstream that does not resolve now keeps the strictest class
            flow.reach = await _reach_of(flow.upstream)
        try:
            await self._drive(challenge, http, flow)
        except OAuthFlowError as exc:
            raise LoginError(flow.failure(exc)) from None
        except ValidationError:
            raise LoginError(f"{flow.host} sent an answer the login cannot read") from None
        except httpx2.HTTPError as exc:
            raise LoginError(f"{flow.host} cannot be reached: {type(exc).__name__}") from None
        finally:
            self._code = self._code_in = None
        self.challenge = None
        self.reason = ""
        await self.save()

    async def _drive(self, challenge: Challenge, http: httpx2.AsyncClient, step: _Flow) -> None:
        """Step the SDK's own flow: its requests are sent, the challenged one is answered from the record."""
        request = challenge.request
        flow = OAuthClientProvider._auth_flow(self, request)
        try:
            outgoing = await flow.__anext__()
            answered = False
            while True:
                if outgoing is request:
                    if answered:
                        return  # the SDK would now retry the request with the new token: it is done
                    answered = True
                    outgoing = await flow.asend(challenge.response())
                    continue
                await step.admit(outgoing)
                response = await _send(http, outgoing)
                step.status = response.status_code
                if outgoing.method == "POST" and response.status_code not in (200, 201):
                    # A registration or token request refused: the SDK would quote the body.
                    raise LoginError(f"{step.host} answered HTTP {response.status_code} to the {step.what}")
                outgoing = await flow.asend(response)
        except StopAsyncIteration:
            if not self.has_tokens:
                raise LoginError("the login ended without a token") from None
        finally:
            await flow.aclose()

    async def _probe(self, http: httpx2.AsyncClient) -> Challenge | None:
        """Ask the upstream once without a token, for the challenge a login answers."""
        if self.sse:
            request = http.build_request("GET", self.context.server_url, headers={"Accept": "text/event-stream"})
        else:
            request = self._initialize_request(http)
        response = await http.send(request, stream=True)
        await response.aclose()
        return Challenge(request, response) if _challenged(response) else None

    def _initialize_request(self, http: httpx2.AsyncClient) -> httpx2.Request:
        return http.build_request(
            "POST",
            self.context.server_url,
            json={
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": CLIENT_NAME, "version": "0.1.0"},
                },
            },
            headers={"Accept": "application/json, text/event-stream"},
        )

    async def _perform_authorization_code_grant(self) -> tuple[str, str]:
        context = self.context
        if not context.client_metadata.scope and self.settings.scopes:
            context.client_metadata.scope = " ".join(self.settings.scopes)
        client = context.client_info
        if self.settings.client_id and client is not None and client.client_secret:
            supported = (
                context.oauth_metadata.token_endpoint_auth_methods_supported if context.oauth_metadata else None
            ) or []
            if supported and "client_secret_basic" not in supported and "client_secret_post" in supported:
                client.token_endpoint_auth_method = "client_secret_post"
        return await super()._perform_authorization_code_grant()

    async def _on_authorization_url(self, url: str) -> None:
        self.authorization_url = url
        self.state = httpx2.URL(url).params.get("state", "")
        self._url_ready.set()
        await trio.lowlevel.checkpoint()

    async def wait_for_url(self) -> str:
        await self._url_ready.wait()
        return self.authorization_url

    async def _wait_for_callback(self) -> AuthorizationCodeResult:
        assert self._code_in is not None
        return await self._code_in.receive()

    def deliver(self, result: AuthorizationCodeResult) -> None:
        """The redirect reached the listener: hand its code to the waiting flow."""
        if self._code is not None:
            # A second redirect with the same state (a reload of the page) finds the code taken.
            with contextlib.suppress(trio.WouldBlock):
                self._code.send_nowait(result)


async def _release(hold: RefreshHold | Literal[False] | None) -> None:
    if hold:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(hold.close)


def _registered_elsewhere(client: OAuthClientInformationFull, redirect_uri: str) -> bool:
    """A dynamic registration whose redirect URIs miss this listener (a metadata document's id is a URL)."""
    if (client.client_id or "").startswith("https://") or not client.redirect_uris:
        return False
    return redirect_uri not in {str(uri) for uri in client.redirect_uris}


def _challenged(response: httpx2.Response) -> bool:
    if response.status_code == 401:
        return True
    return response.status_code == 403 and extract_field_from_www_auth(response, "error") == "insufficient_scope"


async def _send(http: httpx2.AsyncClient, request: httpx2.Request) -> httpx2.Response:
    """One request of the flow, following redirects within its origin as the SDK's transports do."""
    response = await http.send(request)
    for _ in range(_MAX_REDIRECTS):
        follow = next_request_within_origin(response)
        if follow is None:
            break
        response = await http.send(follow)
    return response


class _Flow:
    """Where a login's flow has got to: what it may reach, and what to say when it fails.

    The URLs it fetches are named by the upstream (its challenge and metadata), so none may be
    on an address class more internal than the upstream's own: a public upstream cannot send the
    worker to loopback, a private network or a cloud metadata address. A failure is told by the
    host and the HTTP status alone; an answer's body never reaches an error or the log.
    """

    def __init__(self, upstream: httpx2.URL) -> None:
        self.upstream = upstream
        self.reach = Reach.PUBLIC
        self.host = _host(upstream)
        self.what = "request"
        self.status: int | None = None

    async def admit(self, request: httpx2.Request) -> None:
        url = request.url
        self.host, self.status = _host(url), None
        if request.method != "POST":
            self.what = "metadata request"
        elif request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
            self.what = "token request"
        else:
            self.what = "client registration"
        if url.scheme not in ("http", "https") or not url.host:
            raise LoginError(f"the {self.what} of the login is not an http(s) URL")
        try:
            target = await _reach_of(url)
        except OSError:
            raise LoginError(f"the {self.what} of the login goes to {self.host}, which cannot be resolved") from None
        if target > min(self.reach, Reach.LOOPBACK):
            raise LoginError(
                f"the {self.what} of the login goes to {self.host}, a loopback, private or link-local address,"
                f" which a login with {_host(self.upstream)} may not reach"
            )

    def failure(self, exc: OAuthFlowError) -> str:
        """The SDK's error in words that quote nothing the servers sent."""
        status = f" (HTTP {self.status})" if self.status is not None and self.status >= 300 else ""
        text = str(exc)
        if isinstance(exc, OAuthRegistrationError):
            reason = "its client registration answer cannot be used"
        elif isinstance(exc, OAuthTokenError):
            reason = "its token answer cannot be used"
        elif text.startswith("Protected resource ") and "does not match" in text:
            reason = "its resource metadata names another resource than the server's URL"
        elif text.lower().startswith("protected resource metadata request failed"):
            reason = "its resource metadata cannot be fetched"
        elif text.startswith("Authorization response") and "iss" in text:
            reason = "the redirect does not name the authorization server as its issuer"
        elif text.startswith("State parameter mismatch"):
            reason = "the redirect's state does not match the login's"
        elif text.startswith("No authorization code"):
            reason = "the redirect carries no authorization code"
        else:
            reason = "its answers do not make a login"
        return f"{self.host}{status}: {reason}"


def _host(url: httpx2.URL) -> str:
    host = url.host[:100]
    return f"{host}:{url.port}" if url.port else host


async def _reach_of(url: httpx2.URL) -> Reach:
    """How internal the host of `url` is (OSError if it does not resolve)."""
    port = url.port or (443 if url.scheme == "https" else 80)
    return await resolve_reach(url.host, port)


def _dump(model: Any) -> dict[str, Any] | None:
    return model.model_dump(mode="json", exclude_none=True) if model is not None else None
