"""One upstream MCP connection: connect, initialize, discover, run requests, reconnect when lost."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import msgspec
import trio
from mcp.client.session import ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.dispatcher import CallOptions
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED
from pydantic import TypeAdapter, ValidationError

from mcpvisor.runtime import lifetime
from mcpvisor.runtime.backoff import backoff_delay
from mcpvisor.runtime.commands import child_environment
from mcpvisor.runtime.logs import RotatingFile, log_stem, tail_lines
from mcpvisor.store import oauth_store
from mcpvisor.store.state_url import StateStoreError
from mcpvisor.wire import tenant_secrets
from mcpvisor.wire.config import ServerConfig
from mcpvisor.wire.errors import ErrorCode, WireError
from mcpvisor.wire.redaction import redact_secrets, redact_url
from mcpvisor.wire.sandboxing import SandboxPlan
from mcpvisor.wire.secrets import Redactor, SecretError, resolve_all
from mcpvisor.wire.states import UpstreamState
from mcpvisor.workers import upstream_spans
from mcpvisor.workers.http_calls import LIST_CHANGED, HttpCalls, Malformed, TooLarge, Unreachable
from mcpvisor.workers.oauth import Challenge, Record, UpstreamAuth
from mcpvisor.workers.routing_headers import stamp_routing_headers
from mcpvisor.workers.stdio import (
    DEFAULT_MAX_RESULT,
    FORWARDED_NOTIFICATIONS,
    RawError,
    Result,
    StdioChannel,
    UpstreamProcessError,
    open_stdio_upstream,
)

log = logging.getLogger(__name__)

CLIENT_INFO = types.Implementation(name="mcpvisor", version="0.1.0")


class TaskRequest(types.Request[dict[str, Any] | None, str]):
    """A Tasks extension request (tasks/get, tasks/update, tasks/cancel): the SDK has no model of its
    own for these, so the params go upstream as the client sent them."""

    method: str
    params: dict[str, Any] | None = None


TASK_METHODS = ("tasks/get", "tasks/update", "tasks/cancel")
_TASKS_OPT_IN = "io.modelcontextprotocol/clientCapabilities"


def _opts_in_to_tasks(params: Any) -> bool:
    """The request says its caller accepts a task (the Tasks extension in its `_meta` capabilities)."""
    meta = params.get("_meta") if isinstance(params, dict) else None
    capabilities = meta.get(_TASKS_OPT_IN) if isinstance(meta, dict) else None
    extensions = capabilities.get("extensions") if isinstance(capabilities, dict) else None
    return isinstance(extensions, dict) and "io.modelcontextprotocol/tasks" in extensions


# The requests a client may route to an upstream, and the SDK type that carries each.
REQUEST_TYPES: dict[str, type[types.Request[Any, Any]]] = {
    "tools/call": types.CallToolRequest,
    "resources/read": types.ReadResourceRequest,
    "prompts/get": types.GetPromptRequest,
    "completion/complete": types.CompleteRequest,
    "resources/subscribe": types.SubscribeRequest,
    "resources/unsubscribe": types.UnsubscribeRequest,
    "ping": types.PingRequest,
    **dict.fromkeys(TASK_METHODS, TaskRequest),
}

# Forwarded as JSON bytes on stdio upstreams, without the SDK session decoding them.
PASS_THROUGH = frozenset(
    {"tools/call", "resources/read", "prompts/get", "completion/complete", "tasks/get", "tasks/update", "tasks/cancel"}
)

_json_params = msgspec.json.Decoder(dict[str, Any] | None)
_RAW_RESULT: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])
_json = msgspec.json.Encoder()
_MAX_PAGES = 1000
REDISCOVER_QUIET = 0.2
REDISCOVER_MAX_WAIT = 2.0  # a paginator that never ends must not hang discovery


# What an upstream may ask the client of a call, and the type the client's answer must have.
ANSWER_TYPES: dict[str, TypeAdapter[Any]] = {
    "sampling/createMessage": TypeAdapter(types.CreateMessageResult | types.CreateMessageResultWithTools),
    "elicitation/create": TypeAdapter(types.ElicitResult),
    "roots/list": TypeAdapter(types.ListRootsResult),
}


class ClientHooks:
    """What the upstream's session passes on to the frontend: notifications and client requests.

    The worker fills these in; the defaults drop notifications and refuse requests.
    """

    async def notification(self, method: str, params: bytes) -> None:
        await trio.lowlevel.checkpoint()

    async def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any] | types.ErrorData:
        await trio.lowlevel.checkpoint()
        return types.ErrorData(code=types.INVALID_REQUEST, message=f"{method} is not supported here")

    async def checked(self, method: str, params: dict[str, Any]) -> Any:
        """The client's answer to one of ANSWER_TYPES, as its result type, or the ErrorData to send."""
        answer = await self.ask(method, params)
        if isinstance(answer, types.ErrorData):
            return answer
        try:
            return ANSWER_TYPES[method].validate_python(answer, by_name=False)
        except ValidationError as exc:
            return types.ErrorData(
                code=types.INTERNAL_ERROR, message=f"the client's answer is invalid: {_first_error(exc)}"
            )

    async def answer(self, method: str, params: dict[str, Any]) -> dict[str, Any] | types.ErrorData | None:
        """A request an upstream put on a call's stream (workers/http_calls.py): the client's checked
        answer as JSON, or None for a method no client is asked."""
        if method not in ANSWER_TYPES:
            return None
        result = await self.checked(method, params)
        return result if isinstance(result, types.ErrorData) else _dump(result)

    async def sampling(self, context: Any, params: types.CreateMessageRequestParams) -> Any:
        return await self.checked("sampling/createMessage", _dump(params))

    async def elicitation(self, context: Any, params: types.ElicitRequestParams) -> Any:
        return await self.checked("elicitation/create", _dump(params))

    async def list_roots(self, context: Any) -> Any:
        return await self.checked("roots/list", {})


def _dump(params: Any) -> dict[str, Any]:
    return params.model_dump(by_alias=True, mode="json", exclude_none=True) if params is not None else {}


class StartupFailed(Exception):
    """The upstream never became ready; the worker exits so the supervisor's start policy applies."""


class _WatchedStream:
    """A receive stream that sets `eof` when the transport closes it."""

    def __init__(self, inner: Any, eof: trio.Event) -> None:
        self._inner = inner
        self._eof = eof

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._eof.set()
            raise

    def __aiter__(self) -> _WatchedStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._inner.aclose()

    def close(self) -> None:
        self._inner.close()

    async def __aenter__(self) -> _WatchedStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


SECRET_RECHECK_MAX = 10.0  # a missing secret is looked for again at most this often
SHARED_LOGIN_CHECK = 2.0  # how often a tenant's worker of a shared login looks for the operator's
LOGIN_WATCH = 1.0  # how often a worker reads its login's version in the shared store (another replica's logout)


class Upstream:
    """Owns the connection to one upstream and the catalog discovered on it."""

    def __init__(
        self,
        name: str,
        server: ServerConfig,
        log_dir: Path,
        on_change: Callable[[], None],
        hooks: ClientHooks | None = None,
        *,
        sandbox: SandboxPlan | None = None,
        state_url: str = "",
        max_result: int = DEFAULT_MAX_RESULT,
    ) -> None:
        self.name = name
        self.max_result = max_result
        self.sandbox = sandbox
        self.hooks = hooks or ClientHooks()
        self.server = server
        self.log_dir = log_dir
        self._on_change = on_change
        self.state = UpstreamState.DISCONNECTED
        self.error = ""
        self.catalog = b'{"tools":[],"resources":[],"resourceTemplates":[],"prompts":[]}'
        self.catalog_seq = 0
        self.server_name = ""
        self.initialize_result = b""  # the upstream's initialize result as JSON
        self.protocol_version = ""  # the version the upstream chose in its initialize result
        self._attempt: upstream_spans.Attempt | upstream_spans._NoAttempt = upstream_spans.NO_ATTEMPT
        self.session: ClientSession | None = None
        self.redact = Redactor()
        self._lost = trio.Event()
        self._lost_reason = ""
        self._rediscover = trio.Event()
        self._channel: StdioChannel | None = None
        self._http_calls: HttpCalls | None = None  # a streamable-HTTP upstream's pass-through requests
        self._stderr_log = RotatingFile(log_dir / f"{log_stem(name)}.stderr.log")
        self.discoveries = 0  # how many discoveries ran (observable in tests and status)
        self.tool_count = 0
        self.connect_seconds = 0.0
        self.ever_ready = False
        self._last_process: lifetime.Child | None = None
        self._last_channel: StdioChannel | None = None
        # OAuth toward a remote upstream, unless the operator sends an Authorization header himself.
        self.auth: UpstreamAuth | None = None
        self.tenant, _, self.server_label = name.rpartition("/")
        # One operator login for every tenant (a service account), or each tenant's own (the default).
        self.shared_login = server.oauth is not None and server.oauth.shared
        if server.kind != "stdio" and server.url and not any(k.lower() == "authorization" for k in server.headers):
            record: Record
            if state_url:
                # The database driver loads only with a shared store.
                from mcpvisor.store.oauth_pg import SharedRecord
                from mcpvisor.store.state_pg import PostgresState

                # Every replica's worker of this id reads the one record in the shared store.
                key = name.rpartition("/")[2] if self.shared_login else name
                record = SharedRecord(PostgresState(state_url, max_size=1), key)
            else:
                # The supervisor keeps logs in DATA_DIR/logs; the token files live beside them.
                record = oauth_store.FileRecord(
                    oauth_store.token_file_of(log_dir.parent, name, shared=self.shared_login)
                )
            self.auth = UpstreamAuth(server.url, record, server.oauth, self._challenged, sse=server.kind == "sse")
        self._needs_login = False
        self._logged_in = trio.Event()
        self.waiting_for_secret = False  # a secret this worker's references name is missing

    @property
    def self_login(self) -> bool:
        """The tenant connects its own account (the `SERVER:login` tool), not the operator."""
        return self.auth is not None and bool(self.tenant) and not self.shared_login

    @property
    def awaiting_login(self) -> bool:
        """Waiting for this tenant's own login: what makes the frontend offer `SERVER:login`."""
        return self.self_login and self.state is UpstreamState.AUTHENTICATING

    @property
    def pid(self) -> int | None:
        """The upstream process's pid (stdio only)."""
        process = self._channel.process if self._channel is not None else None
        return process.pid if process is not None and process.returncode is None else None

    # -- state -----------------------------------------------------------------------------------

    def _set_state(self, state: UpstreamState, error: str = "") -> None:
        if state is UpstreamState.READY:
            error = ""
        # The values known to be secret, then whatever looks like one (an upstream may quote the URL).
        error = redact_secrets(self.redact(error))
        if (state, error) != (self.state, self.error):
            if error:
                log.warning("upstream %s: %s (%s)", self.name, state, error)
            else:
                log.info("upstream %s: %s", self.name, state)
            self.state, self.error = state, error
            self.catalog_seq += 1
            self._on_change()

    def _set_catalog(self, catalog: bytes) -> None:
        if catalog != self.catalog:
            self.catalog = catalog
            self.catalog_seq += 1
            self._on_change()

    # -- the connection loop ---------------------------------------------------------------------

    async def serve(self) -> None:
        """Connect, discover and stay connected; reconnect with backoff whenever the link is lost.

        A stdio upstream that never became ready raises StartupFailed instead: the worker exits,
        and the supervisor's start retries (BACKOFF, then FATAL) take over, as for any program
        that cannot start. A remote upstream is retried here, since it may simply be down.
        """
        attempt = 0
        policy = self.server.policy
        message = ""
        while True:
            self._lost = trio.Event()
            self._lost_reason = ""
            self._set_state(UpstreamState.CONNECTING, self.error)
            self._attempt = upstream_spans.connecting(self, attempt, message)
            try:
                async with self._connect() as session:
                    self.session = session
                    with self._attempt.discovering():
                        await self._discover(session)
                    attempt = 0
                    self.ever_ready = True
                    self.waiting_for_secret = False
                    self._set_state(UpstreamState.READY)
                    self._attempt.ready()
                    self._attempt = upstream_spans.NO_ATTEMPT
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._serve_pings, session)
                        nursery.start_soon(self._serve_polling, session)
                        if self.auth is not None and self.auth.record.shared_store:
                            nursery.start_soon(self._serve_login_watch)
                        await self._lost.wait()
                        nursery.cancel_scope.cancel()
                    # Fail what is in flight and refuse new calls now, not after the teardown.
                    self.session = None
                    ended_by = self._channel.ended_by if self._channel is not None else ""
                    reason = self._lost_reason or ended_by or "the upstream closed the connection"
                    self._set_state(UpstreamState.ERROR, reason)
                    if self._channel is not None:
                        self._channel.close()
                    raise WireError(ErrorCode.UPSTREAM_GONE, reason)
            except Exception as exc:  # the reconnect loop is the boundary: every failure becomes a state
                message = self._explain(describe_failure(exc))
                self.waiting_for_secret = _secret_error(exc)
                self._attempt.failed(message)
            finally:
                self.session = None
                self._channel = None
                self._http_calls = None
            if self._needs_login and self.auth is not None:
                self._set_state(UpstreamState.AUTHENTICATING, self.login_hint())
                await self._wait_for_login()
                self._logged_in = trio.Event()
                attempt = 0
                continue
            if self.waiting_for_secret:
                # Not a crash to retry fast: the operator has to put the secret in place.
                self._set_state(UpstreamState.ERROR, f"waiting for the operator: {message}")
                await trio.sleep(backoff_delay(attempt + 1, SECRET_RECHECK_MAX, base=0.5, jitter=0.1))
                attempt += 1
                continue
            self._set_state(UpstreamState.ERROR, message)
            if not self.ever_ready and self.server.kind == "stdio":
                raise StartupFailed(message)
            delay = backoff_delay(attempt + 1, policy.reconnect_backoff_max, base=0.5, jitter=0.1)
            attempt += 1
            await trio.sleep(delay)

    @asynccontextmanager
    async def _connect(self) -> AsyncIterator[ClientSession]:
        """Open the transport and run the initialize handshake within `init_timeout`."""
        timeout = self.server.policy.init_timeout
        started = trio.current_time()
        async with AsyncExitStack() as stack:
            read_stream, write_stream = await self._open_transport(stack)
            if self._channel is not None:
                self._channel.on_notification = self.hooks.notification
            # Declaring sampling, elicitation and roots lets capability-gated upstream tools appear;
            # each request is passed on to the client whose call caused it (see ClientHooks).
            session = ClientSession(
                _WatchedStream(read_stream, self._lost),
                write_stream,
                client_info=CLIENT_INFO,
                message_handler=self._on_message,
                sampling_callback=self.hooks.sampling,
                elicitation_callback=self.hooks.elicitation,
                list_roots_callback=self.hooks.list_roots,
            )
            await stack.enter_async_context(session)
            with trio.move_on_after(timeout) as scope, self._attempt.initializing():
                result = await session.initialize()
            if scope.cancelled_caught:
                raise WireError(ErrorCode.TIMEOUT, f"no answer to initialize within {timeout:g}s")
            if result.capabilities.logging is not None:
                # Clients choose their own levels at the frontend, which filters; so take everything.
                with trio.move_on_after(timeout), contextlib.suppress(MCPError):
                    await session.set_logging_level("debug")
            self.server_name = result.server_info.name if result.server_info else ""
            self.protocol_version = str(result.protocol_version or "")
            if self._http_calls is not None:
                self._http_calls.protocol_version = self.protocol_version
            self.initialize_result = _json.encode(result.model_dump(by_alias=True, mode="json", exclude_none=True))
            self.connect_seconds = trio.current_time() - started
            yield session

    async def _open_transport(self, stack: AsyncExitStack) -> tuple[Any, Any]:
        server = self.server
        if not self.tenant and tenant_secrets.server_names_tenant(server):
            raise SecretError("this server's secrets are per tenant ({tenant} in a reference): it serves tenants only")
        if server.kind == "stdio":
            assert server.command is not None
            configured = resolve_all(server.env)
            for value in configured.values():
                self.redact.add(value)
            # A sandbox gets its configured env alone; mcpvisor's own never goes in.
            env = configured if self.sandbox is not None else child_environment(configured)
            read_stream, write_stream, channel = await stack.enter_async_context(
                open_stdio_upstream(
                    server.command,
                    server.args,
                    env,
                    server.cwd,
                    self._stderr_log,
                    sandbox=self.sandbox,
                    worker_id=self.name,
                    max_result=self.max_result,
                )
            )
            self._channel = channel
            self._last_channel = channel
            self._last_process = channel.process
            return read_stream, write_stream
        headers = resolve_all(server.headers)
        for value in headers.values():
            self.redact.add(value)
        assert server.url is not None
        log.info("upstream %s: connecting to %s (%s)", self.name, redact_url(server.url), server.kind)
        if server.kind == "sse":
            return await stack.enter_async_context(sse_client(server.url, headers=headers, auth=self.auth))
        http = await stack.enter_async_context(create_mcp_http_client(headers=headers, auth=self.auth))
        http.event_hooks["request"].append(stamp_routing_headers)
        calls = self._http_calls = HttpCalls(
            http,
            server.url,
            notify=self.hooks.notification,
            answer=self.hooks.answer,
            list_changed=self._rediscover.set,
            max_result=self.max_result,
        )
        http.event_hooks["response"].append(calls.see)
        return await stack.enter_async_context(streamable_http_client(server.url, http_client=http))

    def _explain(self, message: str) -> str:
        """For a stdio upstream that died: its exit status and last words beat "connection closed"."""
        # Read after the transport has closed, which waits for the process, so its status is known.
        process, self._last_process = self._last_process, None
        channel, self._last_channel = self._last_channel, None
        if channel is not None and channel.ended_by:
            return channel.ended_by
        status = process.returncode if process is not None else None
        # Only when the link just dropped: a process stopped for hanging says more as "hung".
        if status is None or "closed" not in message.lower():
            return message
        how = f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"
        last = tail_lines(self._stderr_log.path, 1)
        return f"the upstream process {how}" + (f": {last[0].strip()[:200]}" if last else "")

    def mark_lost(self, reason: str) -> None:
        """Give up on the current connection: the loop reconnects (restarting a stdio upstream)."""
        if not self._lost.is_set():
            self._lost_reason = reason
            self._lost.set()

    # -- OAuth -----------------------------------------------------------------------------------

    def login_hint(self) -> str:
        """Why the upstream waits for a login, and what to do: safe for any client to read."""
        reason = self.auth.reason if self.auth is not None and self.auth.reason else "the server asks for a login"
        if self.self_login:
            return f"{reason}: connect your account with the tool `{self.server_label}:login`"
        if self.tenant:
            return f"{reason}: waiting for the operator to log in (`mcpvisor ctl login {self.server_label}`)"
        return f"{reason}: run `mcpvisor ctl login {self.name}`"

    async def _wait_for_login(self) -> None:
        """Until a login completes; a shared login's tenant workers also watch the operator's file, and
        with a shared store every worker watches its record (a login through another replica)."""
        auth = self.auth
        shared_store = auth is not None and auth.record.shared_store
        if auth is None or not (shared_store or (self.shared_login and self.tenant)):
            await self._logged_in.wait()
            return
        seen = await self._record_version(auth.seen_version)
        while True:
            with trio.move_on_after(LOGIN_WATCH if shared_store else SHARED_LOGIN_CHECK):
                await self._logged_in.wait()
                return
            version = await self._record_version(seen)
            if version != seen:
                seen = version
                stored = await self._record_load()
                if stored is not None and stored.tokens:
                    auth.reload()  # the next request reads the tokens another worker or replica stored
                    self._needs_login = False
                    return

    async def _record_version(self, fallback: object | None) -> object | None:
        """The login record's version; `fallback` while the shared store cannot be reached (retried)."""
        assert self.auth is not None
        try:
            return await self.auth.record_version()
        except StateStoreError as exc:
            log.warning("upstream %s: %s", self.name, exc)
            return fallback

    async def _record_load(self) -> oauth_store.TokenFile | None:
        """The login record as stored; None while the shared store cannot be reached (retried)."""
        assert self.auth is not None
        try:
            return await trio.to_thread.run_sync(self.auth.record.load)
        except StateStoreError as exc:
            log.warning("upstream %s: %s", self.name, exc)
            return None

    async def _serve_login_watch(self) -> None:
        """With a shared store: a logout or a new login through another replica reaches this worker too."""
        auth = self.auth
        assert auth is not None
        while True:
            await trio.sleep(LOGIN_WATCH)
            seen = auth.seen_version
            version = await self._record_version(seen)
            if version == seen:
                continue
            stored = await self._record_load()
            if stored is None:
                continue
            if stored.tokens:
                auth.reload()  # refreshed or logged in again elsewhere: the next request reads it
                continue
            auth.reload()
            auth.reason = "logged out"
            self._needs_login = True
            self.mark_lost(self.login_hint())
            return

    def _challenged(self, challenge: Challenge) -> None:
        """A request met a challenge its tokens could not answer (see workers/oauth.py)."""
        if challenge.step_up:
            return  # the other tools keep working; the refused call says what to do
        self._needs_login = True
        if self.session is not None:
            self.mark_lost(self.login_hint())

    def logged_in(self) -> None:
        """A login completed: connect now, without waiting out a backoff."""
        self._needs_login = False
        self._logged_in.set()
        self._on_change()

    def login_failed(self, error: str) -> None:
        """An operator's login did not complete: say why where `ctl status` shows it."""
        if self.auth is None:
            return
        self.auth.reason = f"the login failed ({error[:200]})"
        if self.state is UpstreamState.AUTHENTICATING:
            self._set_state(UpstreamState.AUTHENTICATING, self.login_hint())

    async def logged_out(self) -> None:
        """Forget the tokens and drop the connection; the next one needs a login."""
        if self.auth is None:
            return
        await self.auth.forget()
        self.auth.reason = "logged out"
        self._needs_login = True
        if self.session is not None:
            self.mark_lost(self.login_hint())
        else:
            self._set_state(UpstreamState.AUTHENTICATING, self.login_hint())

    async def _serve_pings(self, session: ClientSession) -> None:
        """A hung upstream (stopped, deadlocked) answers no ping: reconnect instead of timing out calls.

        An upstream that is writing is not hung, however long its answer: a ping waits behind a
        large result on a stdio upstream's stdout, so while bytes keep coming the wait goes on.
        """
        policy = self.server.policy
        while True:
            await trio.sleep(policy.ping_interval)
            if (lost := await self._ping(session, policy.ping_timeout)) is not None:
                self.mark_lost(lost)
                return

    async def _ping(self, session: ClientSession, timeout: float) -> str | None:
        """One ping; why the connection is lost, or None when the upstream answered (or is busy writing)."""
        answered = trio.Event()
        closed = False

        async def ping() -> None:
            nonlocal closed
            try:
                await session.send_ping()
            except MCPError as exc:
                # An error answer is still an answer: the upstream is alive.
                closed = exc.code == CONNECTION_CLOSED
            answered.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ping)
            while not answered.is_set():
                before = self.activity()
                with trio.move_on_after(timeout):
                    await answered.wait()
                if not answered.is_set() and (before is None or self.activity() == before):
                    nursery.cancel_scope.cancel()
                    return f"no answer to ping within {timeout:g}s (upstream hung)"
        return "the upstream closed the connection" if closed else None

    def activity(self) -> int | None:
        """How much a stdio upstream has written so far; None for a remote one (its ping answers alone)."""
        channel = self._channel
        return channel.bytes_read if channel is not None else None

    async def _serve_polling(self, session: ClientSession) -> None:
        """Rediscover every poll_interval for upstreams that do not announce list changes."""
        caps = session.server_capabilities
        announces = caps is not None and any(
            getattr(cap, "list_changed", False) for cap in (caps.tools, caps.resources, caps.prompts) if cap is not None
        )
        if announces:
            return
        while True:
            await trio.sleep(self.server.policy.poll_interval)
            self._rediscover.set()

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, types.ServerNotification):
            method = message.method
            if method in LIST_CHANGED:
                self._rediscover.set()
            elif method in FORWARDED_NOTIFICATIONS and message.params is not None:
                params = message.params.model_dump(by_alias=True, mode="json", exclude_none=True)
                await self.hooks.notification(method, _json.encode(params))
        elif isinstance(message, Exception):
            log.debug("upstream %s transport: %s", self.name, message)
        await trio.lowlevel.checkpoint()

    # -- discovery -------------------------------------------------------------------------------

    async def _discover(self, session: ClientSession) -> None:
        """List tools, resources, templates and prompts, following cursors, within the timeout."""
        caps = session.server_capabilities
        catalog: dict[str, list[dict[str, Any]]] = {
            "tools": [],
            "resources": [],
            "resourceTemplates": [],
            "prompts": [],
        }
        with trio.move_on_after(self.server.policy.discovery_timeout) as scope:
            if caps is None or caps.tools is not None:
                catalog["tools"] = await self._list_all(session.list_tools, "tools")
            if caps is None or caps.resources is not None:
                catalog["resources"] = await self._list_all(session.list_resources, "resources")
                catalog["resourceTemplates"] = await self._list_all(
                    session.list_resource_templates, "resource_templates"
                )
            if caps is None or caps.prompts is not None:
                catalog["prompts"] = await self._list_all(session.list_prompts, "prompts")
        if scope.cancelled_caught:
            raise WireError(
                ErrorCode.TIMEOUT,
                f"discovery took longer than {self.server.policy.discovery_timeout:g}s",
            )
        self.discoveries += 1
        self.tool_count = len(catalog["tools"])
        self._set_catalog(_json.encode(catalog))

    @staticmethod
    async def _list_all(fetch: Callable[..., Any], field: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        cursor: str | None = None
        seen: set[str] = set()
        for _ in range(_MAX_PAGES):
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            result = await fetch(params=params)
            items.extend(
                item.model_dump(by_alias=True, mode="json", exclude_none=True) for item in getattr(result, field)
            )
            cursor = result.next_cursor
            if not cursor or cursor in seen:
                break
            seen.add(cursor)
        return items

    # -- requests --------------------------------------------------------------------------------

    async def request(self, method: str, params: bytes | None, timeout: float, request_id: int = 0) -> Result:
        """Run one request upstream: JSON params in, the JSON result out, or WireError."""
        session = self.session
        if session is None or self.state is not UpstreamState.READY:
            detail = f": {self.error}" if self.error else ""
            raise WireError(ErrorCode.SERVER_UNAVAILABLE, f"server '{self.name}' is {self.state}{detail}")
        challenge = self.auth.challenge if self.auth is not None else None
        try:
            return await self._request_ready(session, method, params, timeout, request_id)
        except WireError:
            after = self.auth.challenge if self.auth is not None else None
            if after is None or after is challenge:
                raise
            if self.self_login:
                # The frontend answers it as the login tool would: the tenant's login URL.
                code = ErrorCode.LOGIN_REQUIRED
            else:
                code = ErrorCode.FORBIDDEN if after.step_up else ErrorCode.SERVER_UNAVAILABLE
            raise WireError(code, f"server '{self.server_label}': {self.login_hint()}") from None

    async def _request_ready(
        self, session: ClientSession, method: str, params: bytes | None, timeout: float, request_id: int
    ) -> Result:
        if method not in REQUEST_TYPES:
            raise WireError(ErrorCode.BAD_REQUEST, f"method {method!r} cannot be routed to an upstream")
        channel = self._channel
        if channel is not None and method in PASS_THROUGH:
            return await self._request_raw(channel, method, params)
        calls = self._http_calls
        if calls is not None and calls.ready and method in PASS_THROUGH:
            return await self._request_http(calls, method, params)
        return await self._request_via_session(session, method, params, timeout, request_id)

    def start_raw(
        self, method: str, params: bytes | None, on_outcome: Callable[[Result | WireError], None]
    ) -> Callable[[], None] | None:
        """Start a pass-through request on a ready stdio upstream with no task waiting for it.

        Its outcome, the JSON result or the WireError `request` would raise, goes to `on_outcome`
        from the task that reads the upstream. Returns the function that abandons the request (for
        a cancel or a timeout), or None when it was not started this way: then use `request`.
        """
        channel = self._channel
        if channel is None or method not in PASS_THROUGH or self.session is None:
            return None
        if self.state is not UpstreamState.READY:
            return None

        def deliver(outcome: Result | RawError) -> None:
            on_outcome(self._raw_failure(channel, outcome) if isinstance(outcome, RawError) else outcome)

        request_id = channel.send_request(method, params, deliver)
        return None if request_id is None else functools.partial(channel.abandon, request_id)

    def _gone_during_call(self, channel: StdioChannel | None) -> WireError:
        """The process went away with a call in flight: why, when its sandbox's limits killed it."""
        ended_by = channel.ended_by if channel is not None else ""
        self.mark_lost(ended_by or "the upstream closed the connection")
        if ended_by:
            return WireError(ErrorCode.UPSTREAM_GONE, f"server '{self.name}': {ended_by}")
        return WireError(ErrorCode.UPSTREAM_GONE, f"server '{self.name}' closed the connection during the call")

    def _raw_failure(self, channel: StdioChannel, exc: RawError) -> WireError:
        if exc.code == CONNECTION_CLOSED and channel.closed:
            return self._gone_during_call(channel)
        return self._upstream_error(exc)

    def _upstream_error(self, exc: RawError) -> WireError:
        """The upstream's JSON-RPC error to a pass-through request, as the frontend gets it."""
        return WireError(ErrorCode.UPSTREAM_ERROR, self.redact(exc.message), mcp_code=exc.code)

    def _too_large(self, size: int) -> WireError:
        message = f"the upstream's result is {size:,} bytes, over the limit of {self.max_result:,}"
        return WireError(ErrorCode.UPSTREAM_ERROR, f"server '{self.name}': {message} (max_result_bytes)")

    async def _request_raw(self, channel: StdioChannel, method: str, params: bytes | None) -> Result:
        try:
            return await channel.request(method, params)
        except RawError as exc:
            raise self._raw_failure(channel, exc) from None
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            self.mark_lost("the upstream closed the connection")
            raise WireError(ErrorCode.UPSTREAM_GONE, f"server '{self.name}' closed the connection") from None

    async def _request_http(self, calls: HttpCalls, method: str, params: bytes | None) -> Result:
        try:
            return await calls.request(method, params)
        except RawError as exc:
            raise self._upstream_error(exc) from None
        except TooLarge as exc:
            raise self._too_large(exc.size) from None
        except Malformed as exc:
            raise WireError(
                ErrorCode.UPSTREAM_ERROR, f"server '{self.name}': {exc}", mcp_code=types.INTERNAL_ERROR
            ) from None
        except Unreachable as exc:
            raise WireError(
                ErrorCode.UPSTREAM_ERROR, f"server '{self.name}': {self.redact(str(exc))}", mcp_code=CONNECTION_CLOSED
            ) from None

    async def _request_via_session(
        self, session: ClientSession, method: str, params: bytes | None, timeout: float, request_id: int
    ) -> bytes:
        try:
            decoded = _json_params.decode(params) if params else None
        except msgspec.DecodeError as exc:
            raise WireError(ErrorCode.BAD_REQUEST, f"params are not valid JSON: {exc}") from None
        try:
            request = REQUEST_TYPES[method].model_validate({"method": method, "params": decoded}, by_name=False)
        except ValidationError as exc:
            raise WireError(ErrorCode.BAD_REQUEST, f"invalid params for {method}: {_first_error(exc)}") from None
        progress = None
        token = (decoded or {}).get("_meta", {}).get("progressToken") if isinstance(decoded, dict) else None
        if token is not None:
            # The SDK puts its own token on the wire and calls back: forward under the frontend's.
            async def progress(value: float, total: float | None, message: str | None) -> None:
                note = {"progressToken": token, "progress": value, "total": total, "message": message}
                await self.hooks.notification(
                    "notifications/progress", _json.encode({k: v for k, v in note.items() if v is not None})
                )

        try:
            if method in TASK_METHODS or _opts_in_to_tasks(decoded):
                # The SDK checks a tools/call result against its own CallToolResult, which a task
                # (`resultType: "task"`) is not: these go as raw JSON-RPC, their results unread.
                options: CallOptions = {"timeout": timeout}
                if progress is not None:
                    options["on_progress"] = progress
                raw = await session._dispatcher.send_raw_request(method, decoded, options)
            else:
                raw = await session.send_request(
                    request, _RAW_RESULT, request_read_timeout_seconds=timeout, progress_callback=progress
                )
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                raise self._gone_during_call(self._channel) from None
            raise WireError(ErrorCode.UPSTREAM_ERROR, self.redact(exc.message), mcp_code=exc.code) from None
        except ValidationError as exc:
            raise WireError(
                ErrorCode.UPSTREAM_ERROR, f"server '{self.name}' sent an invalid result: {_first_error(exc)}"
            ) from None
        result = _json.encode(raw)
        if len(result) > self.max_result:
            raise self._too_large(len(result))
        return result

    async def serve_rediscovery(self) -> None:
        """Rediscover on list_changed: at most one discovery in flight and one queued after it.

        A burst is waited out first (until it has been quiet for REDISCOVER_QUIET, at most
        REDISCOVER_MAX_WAIT), so a thousand notifications cost one or two discoveries, not one per
        notification.
        """
        while True:
            await self._rediscover.wait()
            deadline = trio.current_time() + REDISCOVER_MAX_WAIT
            while trio.current_time() < deadline:
                self._rediscover = trio.Event()
                with trio.move_on_after(min(REDISCOVER_QUIET, deadline - trio.current_time())):
                    await self._rediscover.wait()
                if not self._rediscover.is_set():
                    break
            self._rediscover = trio.Event()
            session = self.session
            if session is None or self.state is not UpstreamState.READY:
                continue
            try:
                with upstream_spans.discovery(self):
                    await self._discover(session)
            except WireError as exc:
                log.warning("upstream %s: rediscovery failed: %s", self.name, exc.message)
            except MCPError as exc:
                log.warning("upstream %s: rediscovery failed: %s", self.name, exc.message)


def _secret_error(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return any(_secret_error(inner) for inner in exc.exceptions)
    return isinstance(exc, SecretError)


def describe_failure(exc: BaseException) -> str:
    """One line for why a connection attempt failed, without a traceback."""
    if isinstance(exc, BaseExceptionGroup):
        return describe_failure(exc.exceptions[0])
    if isinstance(exc, WireError):
        return exc.message
    if isinstance(exc, UpstreamProcessError | SecretError):
        return str(exc)
    if isinstance(exc, MCPError):
        return f"upstream error {exc.code}: {exc.message}"
    if isinstance(exc, OSError | ValidationError | anyio.BrokenResourceError | anyio.ClosedResourceError):
        return f"{type(exc).__name__}: {exc}"
    log.error("unexpected failure on the upstream connection", exc_info=exc)
    return f"{type(exc).__name__}: {exc}"


def _first_error(exc: ValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return str(exc)
    first = errors[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    return f"{where}: {first.get('msg', '')}" if where else str(first.get("msg", ""))
