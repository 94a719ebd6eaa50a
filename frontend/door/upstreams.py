"""The one door to the upstreams: what a client may see and call, and the call itself.

Every endpoint and built-in tool reaches an upstream through `Upstreams`: it owns the server table,
the catalog, the router, which servers and tools a client may see (enabled, not quarantined,
definitions as approved), one lookup for tools, prompts and resources with one set of error
messages, the gate a call must pass, the audit record of each call, and call timeouts. A call
returns the upstream's result as the bytes the worker sent.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
import trio

from mcpvisor.frontend import spans
from mcpvisor.frontend.door.calls import Caller, ClientCall
from mcpvisor.frontend.door.catalog import Catalog, ServerView, exposed_name, split_name
from mcpvisor.frontend.door.gatekeeper import Gate, approve_command
from mcpvisor.frontend.door.logins import LOGIN_TOOL, LoginTickets, binding_of, login_answer, login_tool
from mcpvisor.frontend.door.metrics import Metrics
from mcpvisor.frontend.door.rounds import ROUND_METHODS, Rounds
from mcpvisor.frontend.door.router import Router
from mcpvisor.frontend.door.search import SearchHit, ToolIndex
from mcpvisor.frontend.door.service_ranking import ServiceRanking
from mcpvisor.frontend.door.tasks import TASKS, TaskRoutes, UnknownTask, offers_tasks, with_opt_in
from mcpvisor.frontend.gate import call_policy
from mcpvisor.frontend.gate.activity import ActivityLog, Outcome, endpoint_of, new_request_id, with_request_id
from mcpvisor.frontend.tool_args import error_result
from mcpvisor.runtime import telemetry
from mcpvisor.store import oauth_store
from mcpvisor.wire.config import ServerConfig, Settings
from mcpvisor.wire.errors import INVALID_PARAMS, ErrorCode, WireError

log = logging.getLogger(__name__)

# How long a search waits for the index to take in the latest catalog changes.
INDEX_WAIT = 10.0

UNAVAILABLE = -32000  # JSON-RPC server error: the server exists but cannot take the call now
MAX_ELICITATIONS = 8  # per server, the clients told when its login completes
LOGIN_START_TIMEOUT = 45.0  # the worker discovers the authorization server and registers before it has a URL
LOGGED_METHODS = frozenset({"resources/read", "prompts/get"})  # besides tools/call
RESOURCE_METHODS = frozenset({"resources/read", "resources/subscribe", "resources/unsubscribe"})
# Failures whose message is the upstream's own words, which may echo what the client sent.
_UPSTREAMS_WORDS = frozenset({"upstream_error", "bad_request", ""})

Kind = Literal["tool", "resource", "prompt"]


class NotFound(Exception):
    """A name or URI a client may not reach; the message says what is wrong and is safe to show."""

    def __init__(self, kind: Kind, name: str, reason: str, *, code: int = INVALID_PARAMS, unknown: bool = True) -> None:
        self.kind = kind
        self.name = name
        self.reason = reason
        self.code = code
        self.message = f"Unknown {kind} '{name}': {reason}" if unknown else f"{kind.title()} '{name}' {reason}"
        super().__init__(self.message)


class UpstreamError(Exception):
    """The call reached the worker and failed there (timeout, upstream gone, busy, an MCP error).

    `reason` names the wire's error code (`timeout`, `upstream_error`, ...) where one is known.
    """

    def __init__(self, code: int, message: str, *, reason: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason


class LoginRequired(UpstreamError):
    """The upstream refused the tenant's token and it cannot be refreshed: the tenant logs in again."""


@dataclass(frozen=True, slots=True)
class ToolTarget:
    """One upstream tool, found by the name a client used."""

    server: str
    tool: str
    definition: dict[str, Any]
    quarantined: bool
    login: bool = False  # the server waits for this tenant's login: calling it answers with the login link

    @property
    def name(self) -> str:
        return f"{self.server}:{self.tool}"

    @property
    def destructive(self) -> bool:
        """The server marks the tool `destructiveHint: true` (whatever else it says)."""
        annotations = self.definition.get("annotations") or {}
        return annotations.get("destructiveHint") is True


class Refused(Exception):
    """The gate refused a call; `answer` is the tool result that explains why (nothing ran).

    `reason` is one word for what stopped it: policy, quarantine, pinning, destructive or login.
    """

    def __init__(
        self, answer: dict[str, Any], reason: str = "", *, policy: tuple[str, tuple[str, ...]] = ("", ())
    ) -> None:
        super().__init__("refused by the gate")
        self.answer = answer
        self.reason = reason
        self.policy = policy  # a policy's refusal: its decision and the ids of the policies that made it


class Upstreams:
    """The door: visibility, lookup, the gate, the audit record and the call."""

    def __init__(
        self,
        settings: Settings,
        servers: dict[str, ServerConfig],
        *,
        catalog: Catalog,
        router: Router,
        gate: Gate,
        activity: ActivityLog,
        index: ToolIndex,
        rounds: Rounds,
        metrics: Metrics | None = None,
        tenant: str = "",
        ranking: ServiceRanking | None = None,
        logins: LoginTickets | None = None,
    ) -> None:
        self.tenant = tenant  # whose door this is ("": the servers without a tenant)
        self.logins = logins  # the login links of every tenant (a tenant's own upstream logins)
        # Per server, the clients that accepted a URL elicitation of its login: (request context, id).
        self.elicitations: dict[str, list[tuple[Any, str]]] = {}
        self.settings = settings
        self.servers = servers
        self.catalog = catalog
        self.router = router
        self.gate = gate
        self.activity = activity
        self.index = index
        self.ranking = ranking  # the operator's embedding service, when `[search] embedding_url` names one
        self.rounds = rounds
        self._unindexed: set[str] = set()  # servers whose catalog changed since the index last took it in
        self._wake_indexer = trio.Event()
        self._indexed = trio.Event()
        self.metrics = metrics
        self._config_version = 0
        self.tasks = TaskRoutes()  # this stack's task handles: another tenant's are unknown here

    # -- the server table ------------------------------------------------------------------------

    def apply_config(self, servers: dict[str, ServerConfig]) -> list[str]:
        """The supervisor changed the servers table: forget removed servers; the names that changed."""
        removed = sorted(set(self.catalog.servers) - set(servers))
        for name in removed:
            self.router.fail_worker(name, "the server was removed")
            self.catalog.remove(name)
            self.tasks.forget_server(name)
        for name in set(self.servers) - set(servers):
            self.gate.approvals.forget(name)
        self.servers = servers
        self._config_version += 1
        return removed

    @property
    def view_version(self) -> tuple[int, ...]:
        """Changes whenever what a client may see could have: the catalog, the pins, the config."""
        return (
            self.catalog.version,
            self.gate.approvals.version,
            self.gate.calls.policy.version,
            self._config_version,
            id(self.servers),
            id(self.settings),
        )

    def worker_id(self, server: str) -> str:
        """The id of the worker that runs `server` for this door's tenant (metrics, operator views)."""
        return f"{self.tenant}/{server}" if self.tenant else server

    def call_timeout(self, server: str) -> float:
        config = self.servers.get(server)
        return config.call_timeout(self.settings.call_timeout) if config is not None else self.settings.call_timeout

    # -- visibility ------------------------------------------------------------------------------

    def shown(self, server: str) -> bool:
        """A client may see the server: it is configured (or reported), enabled and not quarantined."""
        config = self.servers.get(server)
        return config is None or (config.enabled and not config.quarantined)

    def visible(self) -> list[ServerView]:
        """The servers whose catalogs clients see: connected (or waiting for the tenant's login), enabled,
        not quarantined."""
        return [view for view in self.catalog.listed_servers() if self.shown(view.id)]

    def tools(self) -> Iterator[tuple[ServerView, dict[str, Any]]]:
        """Every tool a client may see and call, as its server defines it (changed definitions withheld)."""
        for view in self.visible():
            if view.login:
                yield from ((view, tool) for tool in view.tools)  # mcpvisor's own login tool: nothing to pin
                continue
            withheld = self.gate.withheld(view.id, view.tools)
            for tool in view.tools:
                if tool.get("name") not in withheld and self.listed("tool", view.id, tool):
                    yield view, tool

    def exposed_tools(self) -> list[dict[str, Any]]:
        """The visible tools under the names `/mcp/direct` gives them (`server:tool` or `server__tool`)."""
        style = self.catalog.name_style
        return [{**tool, "name": exposed_name(view.id, tool["name"], style)} for view, tool in self.tools()]

    def prompts(self) -> Iterator[tuple[ServerView, dict[str, Any]]]:
        """Every prompt a client may see and get (changed definitions withheld)."""
        for view in self.visible():
            withheld = self.gate.withheld(view.id, view.prompts, "prompt")
            for prompt in view.prompts:
                if prompt.get("name") not in withheld and self.listed("prompt", view.id, prompt):
                    yield view, prompt

    def resources(self) -> list[dict[str, Any]]:
        return [r for view in self.visible() for r in view.resources if self.listed("resource", view.id, r)]

    def templates(self) -> list[dict[str, Any]]:
        return [t for view in self.visible() for t in view.templates if self.listed("resource", view.id, t)]

    def listed(self, kind: Kind, server: str, item: dict[str, Any]) -> bool:
        """The policies let this tenant see it (`Action::"list"`); a tool they hide does not exist for it."""
        return self.gate.calls.policy.shown(self.tenant, kind, server, item)

    async def search(self, query: str, limit: int) -> list[tuple[SearchHit, dict[str, Any]]]:
        """The best `limit` visible tools for `query`, with their definitions.

        Waits (briefly) for the index to take in the latest catalog changes, so a server that is
        ready is also found.
        """
        with trio.move_on_after(INDEX_WAIT):
            while self._unindexed:
                await self._indexed.wait()
        views = {view.id: view for view in self.visible()}
        withheld = {
            (server, tool)
            for server, view in views.items()
            if not view.login
            for tool in self.gate.withheld(server, view.tools)
        }
        if self.gate.calls.policy.active:  # what the policies hide is asked for beyond `limit` as well
            withheld |= {
                (server, tool["name"])
                for server, view in views.items()
                if not view.login
                for tool in view.tools
                if not self.listed("tool", server, tool)
            }
        index, vector = self.index, None
        if self.ranking is not None:
            vector = await self.ranking.query_vector(query, views, fallback=self.index.status)
            if vector is not None and self.ranking.index is not None:
                index = self.ranking.index
        found = []
        for hit in index.search(query, limit + len(withheld), servers=list(views), query_vector=vector):
            if (hit.server, hit.tool) in withheld:
                continue
            definition = self._definition(views[hit.server], hit.tool)
            if definition is None:  # the index lags the catalog by one change at most
                continue
            found.append((hit, definition))
            if len(found) == limit:
                break
        return found

    def _definition(self, view: ServerView, tool: str) -> dict[str, Any] | None:
        """The server's (first) definition of `tool`: from the catalog's index when it names this
        tool, else by a walk of the server's list (a name another server's exposed name took)."""
        exposed = exposed_name(view.id, tool, self.catalog.name_style)
        if self.catalog.resolve_tool(exposed) == (view.id, tool):
            return self.catalog.tool_definition(exposed)
        return next((t for t in view.tools if t.get("name") == tool), None)

    def reindex(self, server: str | None = None) -> None:
        """Take in a catalog change (one server's, or all): pin what is first seen, queue the index update."""
        names = [server] if server is not None else list({*self.catalog.servers, *self.index.servers()})
        for name in names:
            view = self.catalog.servers.get(name)
            if view is not None and view.ready and self.shown(name):
                self.gate.sighted(view)
            self._unindexed.add(name)
        self._wake_indexer.set()
        if self.ranking is not None:
            self.ranking.changed(names)

    @property
    def search_status(self) -> str:
        """How searches are ranked: "hybrid", "lexical (why)", or the embedding service and its state."""
        if self.ranking is None:
            return self.index.status
        if self.ranking.ranking:
            return f"embedding service {self.ranking.url}"
        return f"{self.index.status}; embedding service {self.ranking.url} not in use: {self.ranking.problem}"

    async def serve_index(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the search index up to date, embedding new definitions off the event loop.

        Embedding a large upstream's tools takes a fraction of a second of CPU: done on the loop it
        would stall every client's call, and a frontend that stalls long enough is killed as hung.
        """
        if self.ranking is not None:
            ranking = self.ranking
            async with trio.open_nursery() as nursery:
                await nursery.start(
                    functools.partial(ranking.serve, lambda: self.catalog.servers, lambda: self.index.status)
                )
                await nursery.start(self._serve_index)
                task_status.started()
            return
        await self._serve_index(task_status=task_status)

    async def _serve_index(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self._wake_indexer.wait()
            self._wake_indexer = trio.Event()
            while self._unindexed:
                name = min(self._unindexed)
                self._unindexed.discard(name)
                view = self.catalog.servers.get(name)
                if view is not None and view.listed:
                    prepared = await trio.to_thread.run_sync(self.index.prepare, name, list(view.tools))
                    if name not in self._unindexed:  # else a newer change of it is queued: take that one
                        self.index.apply(prepared)
                else:
                    self.index.remove_server(name)
            self._indexed.set()
            self._indexed = trio.Event()

    # -- lookup ----------------------------------------------------------------------------------

    def find_tool(self, name: str, *, quarantined: bool = False) -> ToolTarget:
        """The tool a client's name points at (`server:tool`, or the direct endpoint's exposed name).

        With `quarantined`, a quarantined server's tools are found too, so a call to one can be
        answered with its security analysis rather than "unknown tool".
        """
        resolved = self.catalog.resolve_tool(name)
        parts = resolved or split_name(name)
        if parts is None and "__" in name:
            server, _, tool = name.partition("__")
            parts = (server, tool) if server and tool else None
        if parts is None:
            raise NotFound("tool", name, "upstream tools are named 'server:tool'")
        server, tool = parts
        config = self.servers.get(server)
        view = self.catalog.servers.get(server)
        hidden = config is not None and config.quarantined and not quarantined
        if (config is None and view is None) or hidden:
            raise NotFound("tool", name, f"no server '{server}' (servers: {self._known()})")
        if config is not None and not config.enabled:
            reason = f"is unavailable: server '{server}' is disabled"
            raise NotFound("tool", name, reason, code=UNAVAILABLE, unknown=False)
        if view is not None and view.listed and view.login and not (config is not None and config.quarantined):
            # Any tool of a server waiting for the tenant's login answers with the login link.
            return ToolTarget(server, tool, login_tool(server), quarantined=False, login=True)
        if view is None or not view.ready:
            reason = f"is unavailable: {self.catalog.describe_unavailable(server)}"
            raise NotFound("tool", name, reason, code=UNAVAILABLE, unknown=False)
        for definition in view.tools:
            if definition.get("name") == tool and self.listed("tool", server, definition):
                return ToolTarget(server, tool, definition, quarantined=config is not None and config.quarantined)
        raise NotFound("tool", name, f"server '{server}' has no tool '{tool}'")

    def find_prompt(self, name: str) -> tuple[str, str]:
        """`server:prompt` -> (server, the upstream's prompt name)."""
        target = self.catalog.resolve_prompt(name)
        if target is None or not self.shown(target[0]):
            raise NotFound("prompt", name, "prompts are named 'server:prompt'")
        server, prompt = target
        view = self.catalog.servers[server]
        definition = next((p for p in view.prompts if p.get("name") == prompt), {"name": prompt})
        if not self.listed("prompt", server, definition):
            raise NotFound("prompt", name, "prompts are named 'server:prompt'")
        if prompt in self.gate.withheld(server, view.prompts, "prompt"):
            reason = f"its definition changed since approval; an operator approves it with `{approve_command(server)}`"
            raise NotFound("prompt", name, reason)
        return target

    def find_resource(self, uri: str) -> str:
        """The visible server that serves `uri` (a listed resource or a template that matches it)."""
        server = self.catalog.resolve_resource(uri)
        if server is None or not self.shown(server) or not self.listed("resource", server, self._resource(server, uri)):
            raise NotFound("resource", uri, "no connected server offers it")
        return server

    def _prompt(self, server: str, name: str) -> dict[str, Any]:
        view = self.catalog.servers.get(server)
        listed = view.prompts if view is not None else []
        return next((prompt for prompt in listed if prompt.get("name") == name), {"name": name})

    def _resource(self, server: str, uri: str) -> dict[str, Any]:
        """The listed resource at `uri` (its name and type for the policies), else the bare uri."""
        view = self.catalog.servers.get(server)
        listed = view.resources if view is not None else []
        return next((resource for resource in listed if resource.get("uri") == uri), {"uri": uri})

    def _known(self) -> str:
        return ", ".join(sorted(set(self.servers) | set(self.catalog.servers))) or "none"

    # -- calls -----------------------------------------------------------------------------------

    async def request(
        self,
        server: str,
        method: str,
        params: dict[str, Any],
        call: ClientCall | None = None,
        *,
        what: str = "",
        activity_id: str = "",
    ) -> bytes | dict[str, Any]:
        """`_request` in the door's span, while telemetry is on."""
        if telemetry.active is None:
            return await self._request(server, method, params, call, what=what, activity_id=activity_id)
        name = params.get("uri" if method in RESOURCE_METHODS else "name")
        run = functools.partial(self._request, server, method, params, call, what=what, activity_id=activity_id)
        return await self._in_door(method, server, name if isinstance(name, str) else "", params, call, "", run)

    async def _in_door(
        self,
        method: str,
        server: str,
        name: str,
        params: dict[str, Any],
        call: ClientCall | None,
        via: str,
        run: Callable[[], Awaitable[bytes | dict[str, Any]]],
    ) -> bytes | dict[str, Any]:
        """`run()` in the door's span: the gate's refusal, a failure or the answer is told on it."""
        worker = self.worker_id(server)
        with spans.door(self.tenant, method, server, name, params, call, via=via, worker=worker) as door:
            if door is None:
                return await run()
            try:
                result = await run()
            except Refused as refused:
                door.refused(refused.reason, *refused.policy)
                raise
            except UpstreamError as exc:
                door.failed(exc.code, exc.message, exc.reason, own=exc.reason not in _UPSTREAMS_WORDS)
                raise
            door.answered(method, result)
            return result

    async def _request(
        self,
        server: str,
        method: str,
        params: dict[str, Any],
        call: ClientCall | None = None,
        *,
        what: str = "",
        activity_id: str = "",
    ) -> bytes | dict[str, Any]:
        """Run one request on a server's upstream: the result's JSON bytes; UpstreamError on failure.

        With the client's call, the upstream's progress, logs and questions go back to that client.
        A 2026-07-28 client's call that the upstream answers with a question returns the
        `input_required` result (a dict) instead: the client answers and calls again.
        resources/read and prompts/get are recorded in the activity log here (tools/call in `call_tool`).
        """
        if method in LOGGED_METHODS and not activity_id:
            return await self._logged_request(server, method, params, call, what)
        timeout = self.call_timeout(server)
        try:
            # Only a 2026-07-28 client that can be asked something needs its call carried over rounds.
            if call is not None and call.modern and method in ROUND_METHODS and call.askable:
                router = self.router

                async def send(params: dict[str, Any], call: ClientCall) -> bytes:
                    return await router.request(server, method, params, timeout, call, activity_id=activity_id)

                return await self.rounds.forward(send, server, method, params, call)
            return await self.router.request(server, method, params, timeout, call, activity_id=activity_id)
        except WireError as exc:
            if exc.code is ErrorCode.LOGIN_REQUIRED:
                raise LoginRequired(exc.jsonrpc_code, exc.message, reason=exc.code.name.lower()) from None
            # Name what was called ("Tool 'github:create_issue': ..."), not only the server.
            message = f"{what}: {exc.message}" if what else exc.message
            raise UpstreamError(exc.jsonrpc_code, message, reason=exc.code.name.lower()) from None

    # -- a tenant's own upstream accounts --------------------------------------------------------

    async def connect_account(self, server: str, call: ClientCall | None, *, tool: str = "") -> dict[str, Any]:
        """Start this tenant's login to `server`: the tool result with a single-use link to open.

        A client that declared URL-mode elicitation is also asked to open the link (MCP 2025-11-25).
        """
        if self.logins is None or not self.tenant:
            return error_result(f"Server '{server}' needs a login by the operator: `mcpvisor ctl login {server}`")
        settings = self.settings
        secret = self.logins.new_secret()
        params = {
            "redirect_uri": oauth_store.redirect_uri(settings.listen, settings.public_url),
            "binding": binding_of(secret),
            "link_ttl": self.logins.ttl,
        }
        try:
            raw = await self.router.request(server, oauth_store.LOGIN_METHOD, params, LOGIN_START_TIMEOUT)
        except WireError as exc:
            return error_result(f"Server '{server}': {exc.message}")
        answer = msgspec.json.decode(raw, type=dict[str, Any])
        url = answer.get("url")
        if not isinstance(url, str) or not url:
            return {
                "content": [{"type": "text", "text": f"Your {server} account is connected: its tools are listed now."}]
            }
        ticket = self.logins.issue(self.worker_id(server), server, self.tenant, url, secret)
        link = oauth_store.base_url(settings.listen, settings.public_url) + oauth_store.START_PATH + ticket
        if call is not None:
            message = f"Connect your {server} account (for {self.tenant}) to use its tools."
            if (elicitation := await call.open_url(message, link)) is not None:
                # Told `notifications/elicitation/complete` once the server is connected (frontend/stacks.py).
                waiting = self.elicitations.setdefault(server, [])
                waiting[:] = [*waiting[-(MAX_ELICITATIONS - 1) :], (call.request, elicitation)]
        return login_answer(server, self.tenant, link, self.logins.ttl, tool=tool)

    async def disconnect_account(self, server: str) -> dict[str, Any]:
        """Forget this tenant's tokens for `server`; it waits for the tenant's login again."""
        try:
            raw = await self.router.request(server, oauth_store.LOGOUT_METHOD, {}, LOGIN_START_TIMEOUT)
        except WireError as exc:
            raise UpstreamError(exc.jsonrpc_code, f"Server '{server}': {exc.message}") from None
        return msgspec.json.decode(raw, type=dict[str, Any])

    async def call_tool(
        self,
        target: ToolTarget,
        params: dict[str, Any],
        call: ClientCall | None = None,
        *,
        via: str,
        intent: dict[str, Any] | None = None,
        destructive: bool = True,
        tasks: bool = False,
        caller: Caller | None = None,
    ) -> bytes | dict[str, Any]:
        """`_call_tool` in the door's span, while telemetry is on: the gate's decision, how it ended."""
        options: dict[str, Any] = {"intent": intent, "destructive": destructive, "tasks": tasks, "caller": caller}
        if telemetry.active is None:
            return await self._call_tool(target, params, call, via=via, **options)
        run = functools.partial(self._call_tool, target, params, call, via=via, **options)
        return await self._in_door("tools/call", target.server, target.name, params, call, via, run)

    async def _call_tool(
        self,
        target: ToolTarget,
        params: dict[str, Any],
        call: ClientCall | None = None,
        *,
        via: str,
        intent: dict[str, Any] | None = None,
        destructive: bool = True,
        tasks: bool = False,
        caller: Caller | None = None,
    ) -> bytes | dict[str, Any]:
        """Call an upstream tool through the gate, recorded in the activity log.

        `via` names the path the call came by (`direct`, `call_tool_read`, `proxy`, ...); without
        `destructive`, a tool its server marks destructive is refused. `caller` says who asks when
        no client's call is at hand (it is the call's own otherwise). Refused (with the answer to
        give) when the gate stops the call; UpstreamError when it fails. With `tasks` (an endpoint
        that routes task handles back), a 2026-07-28 client that opted in to the Tasks extension
        may get a task from an upstream that offers them; its handle is remembered here.
        """
        started = time.monotonic()
        request_id = new_request_id()
        who = call.caller if call is not None else caller or Caller()
        decided: tuple[str, tuple[str, ...]] = ("", ())  # the policies' decision, once made

        def record(outcome: Outcome, result: bytes | None = None) -> None:
            duration = time.monotonic() - started
            self.activity.record(
                server=target.server,
                tool=target.tool,
                variant=via,
                intent=intent,
                outcome=outcome,
                duration=duration,
                request_id=request_id,
                client=who.client,
                endpoint=who.endpoint or endpoint_of(via, target.server),
                result_bytes=0 if result is None else len(result),
                arguments=params.get("arguments"),
                result=result,
                trace=(who.traceparent, who.tracestate),
                tenant=self.tenant,
                decision=decided[0],
                policies=decided[1],
            )
            if self.metrics is not None:
                self.metrics.call_done(self.worker_id(target.server), via, outcome, duration)

        if target.login:
            other = "" if target.tool == LOGIN_TOOL else target.tool
            raise Refused(await self.connect_account(target.server, call, tool=other), "login")
        refusal = self.gate.refusal(target, self.catalog)
        gated = refusal is not None
        if refusal is None and target.destructive and not destructive:
            refusal = error_result(
                f"Tool '{target.name}' is marked destructive by its server (destructiveHint: true): "
                f"call it with call_tool_destructive instead of {via}. It was not run."
            )
        if refusal is not None:
            record("blocked")
            raise Refused(refusal, "quarantine" if target.quarantined else "pinning" if gated else "destructive")
        try:
            passed = await self.gate.calls.admit(
                tenant=self.tenant,
                kind="tool",
                server=target.server,
                item=target.definition,
                name=target.name,
                arguments=params.get("arguments"),
                endpoint=who.endpoint or endpoint_of(via, target.server),
                via=via,
                client=who.client,
                progress=_progress_to(call),
                activity=self.activity,
            )
        except call_policy.Stopped as stopped:
            decided = (stopped.decision, stopped.policies)
            record("blocked")
            raise Refused(stopped.answer, "policy", policy=(stopped.decision, stopped.policies)) from None
        decided = (passed.decision, passed.policies)
        spans.gate_passed(passed.decision, passed.policies)
        in_flight = self.metrics.in_flight_of(self.worker_id(target.server)) if self.metrics is not None else None
        tasks = tasks and call is not None and call.modern and call.request.declares("extensions", TASKS)
        if tasks and self.offers_tasks(target.server):
            params = with_opt_in(params)
        try:
            if in_flight is not None:
                in_flight.inc()
            result = await self.request(
                target.server, "tools/call", params, call, what=f"Tool '{target.name}'", activity_id=request_id
            )
        except LoginRequired:
            record("error")
            # Never a bare failure: the same answer as the login tool's, the link to log in again.
            raise Refused(await self.connect_account(target.server, call, tool=target.tool), "login") from None
        except UpstreamError:
            record("error")
            raise
        finally:
            passed.done()
            if in_flight is not None:
                in_flight.dec()
        if isinstance(result, bytes):
            record("error" if _is_error(result) else "ok", result)
            if tasks and (task_id := _task_id(result)) is not None:
                self.tasks.made(target.server, task_id)
            return with_request_id(result, request_id)
        return result

    def offers_tasks(self, server: str) -> bool:
        """The server's upstream declared the Tasks extension when it last connected."""
        view = self.catalog.servers.get(server)
        return view is not None and offers_tasks(view.initialize)

    async def task_request(
        self, server: str, method: str, params: dict[str, Any], call: ClientCall | None, *, handle: str
    ) -> bytes:
        """A tasks/get, tasks/update or tasks/cancel for a task `server` made for this stack.

        `params` carry the upstream's own task id; `handle` is the id the client used (named in
        errors). UnknownTask when no client of this stack was handed that task by `server`.
        """
        task_id = params.get("taskId")
        if not isinstance(task_id, str) or not self.tasks.knows(server, task_id):
            raise UnknownTask(handle)
        # The client declared the extension (endpoints check); an upstream gates tasks/* on that too.
        result = await self.request(server, method, with_opt_in(params), call, what=f"Task '{handle}'")
        assert isinstance(result, bytes)  # tasks/* are not carried over rounds
        return result

    async def _logged_request(
        self, server: str, method: str, params: dict[str, Any], call: ClientCall | None, what: str
    ) -> bytes | dict[str, Any]:
        """`request` for a resources/read or prompts/get, with its activity row and request id."""
        started = time.monotonic()
        request_id = new_request_id()
        kind: Kind = "resource" if method == "resources/read" else "prompt"
        name = params.get("uri" if kind == "resource" else "name")
        who = call.caller if call is not None else Caller()
        decided: tuple[str, tuple[str, ...]] = ("", ())

        def record(outcome: Outcome, result: bytes | None = None) -> None:
            self.activity.record(
                server=server,
                tool=name if isinstance(name, str) else "",
                variant=method,
                intent=None,
                outcome=outcome,
                duration=time.monotonic() - started,
                request_id=request_id,
                client=who.client,
                endpoint=who.endpoint or endpoint_of("", server),
                kind=kind,
                result_bytes=0 if result is None else len(result),
                arguments=params.get("arguments") if kind == "prompt" else None,
                result=result,
                trace=(who.traceparent, who.tracestate),
                tenant=self.tenant,
                decision=decided[0],
                policies=decided[1],
            )

        shown = name if isinstance(name, str) else ""
        item = self._resource(server, shown) if kind == "resource" else self._prompt(server, shown)
        if not self.listed(kind, server, item):  # hidden from this tenant: as if it did not exist
            record("blocked")
            reason = "no connected server offers it" if kind == "resource" else "prompts are named 'server:prompt'"
            raise UpstreamError(INVALID_PARAMS, NotFound(kind, what_of(kind, server, shown), reason).message)
        try:
            passed = await self.gate.calls.admit(
                tenant=self.tenant,
                kind=kind,
                server=server,
                item=item,
                name=f"{server}:{shown}",
                arguments=params.get("arguments") if kind == "prompt" else None,
                endpoint=who.endpoint or endpoint_of("", server),
                via=method,
                client=who.client,
                progress=_progress_to(call),
                activity=self.activity,
            )
        except call_policy.Stopped as stopped:
            decided = (stopped.decision, stopped.policies)
            record("blocked")
            raise UpstreamError(INVALID_PARAMS, stopped.message) from None
        decided = (passed.decision, passed.policies)
        try:
            result = await self.request(server, method, params, call, what=what, activity_id=request_id)
        except UpstreamError:
            record("error")
            raise
        finally:
            passed.done()
        if isinstance(result, bytes):
            record("ok", result)
            return with_request_id(result, request_id)
        return result


def what_of(kind: Kind, server: str, name: str) -> str:
    """How a client names a resource (its URI) or a prompt (`server:prompt`) in an error."""
    return name if kind == "resource" else f"{server}:{name}"


def _progress_to(call: ClientCall | None) -> call_policy.Progress | None:
    """How a call waiting for an operator tells its client so: progress notifications, when it asked for them."""
    if call is None:
        return None

    async def progress(waited: float, message: str) -> None:
        await call.notify("notifications/progress", call_policy.progress_payload(waited, message))

    return progress


class _ErrorFlag(msgspec.Struct):
    isError: bool | None = None


_decode_flag = msgspec.json.Decoder(_ErrorFlag)


class _TaskFlag(msgspec.Struct):
    resultType: str | None = None
    taskId: str | None = None


_decode_task_flag = msgspec.json.Decoder(_TaskFlag)


def _task_id(result: bytes) -> str | None:
    """The task id of a CreateTaskResult, without decoding the rest of it; None for other results."""
    if b'"task"' not in result:
        return None
    try:
        flag = _decode_task_flag.decode(result)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return flag.taskId if flag.resultType == "task" else None


def _is_error(result: bytes) -> bool:
    """Whether a tools/call result says `isError: true`, without decoding the rest of it."""
    try:
        return _decode_flag.decode(result).isError is True
    except (msgspec.DecodeError, msgspec.ValidationError):
        return True
