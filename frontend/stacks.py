"""One endpoint stack per tenant: isolation by construction.

A tenant's clients reach a stack of their own: its door (`Upstreams`) over the tenant's catalog
(which only the tenant's workers `tenant/server` report into) and the tenant's servers table, its
own sessions, subscriptions and list_changed fan-out, its own response cache, input rounds,
search index and page caches. Nothing a client of one tenant can name (a
tool, a URI, a cursor, a session id, a cache key, a request state) exists in another tenant's
stack, so no path needs its own check. What the stacks share is below the door: the router and
its socket, the gate's pins (keyed by server name, approved by the operator for every tenant),
the activity log (each row names its tenant) and the embedding model.

Without tenants there is one stack, the plain one (tenant ""), exactly as before. With tenants,
operators (admin tokens) use the plain stack, whose workers are the plain `server` ones.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from mcpvisor.frontend.door.control import ControlClient, ControlError
from mcpvisor.frontend.door.gatekeeper import Gate
from mcpvisor.frontend.door.logins import LoginTickets
from mcpvisor.frontend.door.metrics import Metrics
from mcpvisor.frontend.door.rounds import ROUND_TTL, Rounds
from mcpvisor.frontend.door.router import Router, TenantRouter
from mcpvisor.frontend.door.search import ToolIndex
from mcpvisor.frontend.door.service_ranking import ServiceRanking
from mcpvisor.frontend.door.upstreams import Upstreams
from mcpvisor.frontend.endpoints.app import FrontendApp
from mcpvisor.frontend.endpoints.direct import direct_table
from mcpvisor.frontend.endpoints.engine import Engine, Security
from mcpvisor.frontend.endpoints.notices import Notices
from mcpvisor.frontend.endpoints.request_state import StateSeal
from mcpvisor.frontend.endpoints.search_first import search_table
from mcpvisor.frontend.endpoints.server_endpoint import ServerEndpoints
from mcpvisor.frontend.endpoints.serving import McpEndpoint
from mcpvisor.frontend.gate.activity import ActivityLog
from mcpvisor.frontend.tools.builtins import Builtins
from mcpvisor.frontend.tools.code_execution import Confinement
from mcpvisor.frontend.tools.response_cache import ResponseCache
from mcpvisor.wire import sandboxing
from mcpvisor.wire.config import RegistryConfig, SearchConfig, ServerConfig, Settings, TenantConfig
from mcpvisor.wire.states import UpstreamState

log = logging.getLogger(__name__)

# How long a tenant's first request waits for the tenant's workers to be up (or to have failed).
# Past it the request is served with the servers that are up; the others join the lists as they
# come up, and the tenant's clients get list_changed.
START_WAIT = 45.0
IDLE_CHECK = 5.0  # seconds between checks for an idle tenant
ELICITATION_COMPLETE = "notifications/elicitation/complete"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
SETTLE_CHECK = 0.5  # seconds between looks at a tenant's starting workers


@dataclass
class Shared:
    """What every stack uses: below the door, and the process's own settings."""

    settings: Settings
    servers: dict[str, ServerConfig]
    tenants: dict[str, TenantConfig]
    router: Router
    gate: Gate
    activity: ActivityLog
    metrics: Metrics | None
    control: ControlClient
    host: str
    data_dir: str
    config_path: str
    registries: Mapping[str, RegistryConfig]
    search: SearchConfig = field(default_factory=SearchConfig)
    # How code_execution's script processes are confined (bwrap; required with tenants).
    script_confinement: Confinement = field(default_factory=Confinement)
    logins: LoginTickets = field(default_factory=LoginTickets)  # tenants' own upstream logins

    @property
    def on_demand(self) -> bool:
        """Workers start on use and stop when idle: tenants are configured (supervisor/supervisor.py)."""
        return bool(self.tenants)

    def sandboxed(self) -> bool:
        """Whether some server's process runs in a sandbox now (tenants' always do, but tokens guard them)."""
        return any(sandboxing.wanted(self.settings, server, None) for server in self.servers.values())

    def servers_of(self, tenant: str) -> dict[str, ServerConfig]:
        """The servers table a tenant's clients see ("" : every server)."""
        if not tenant:
            return self.servers
        allowed = self.tenants[tenant].servers if tenant in self.tenants else []
        return {name: self.servers[name] for name in allowed if name in self.servers}

    def idle_stop(self, tenant: str) -> float:
        table = self.tenants.get(tenant)
        if table is not None and table.idle_stop is not None:
            return table.idle_stop
        return self.settings.tenant_idle_stop


class TenantControl:
    """The supervisor commands a tenant's built-in tools may send, about the tenant's own workers.

    `upstream_servers` tails and restarts the tenant's worker of a server (`tenant/server`), and a
    tenant's proposals are its own: marked with it, listed to it alone, added to its servers when
    approved. Anything that would change what other tenants see (a policy patch, a quarantine) is
    refused, as is any other command.
    """

    _PROPOSALS = frozenset({"server.propose", "server.proposals"})

    def __init__(self, control: ControlClient, tenant: str) -> None:
        self.control = control
        self.tenant = tenant

    async def call(self, name: str, args: list[str] | None = None, data: Any = None) -> Any:
        if name in ("tail", "restart") and args:
            return await self.control.call(name, [f"{self.tenant}/{args[0]}", *args[1:]], data)
        if name in self._PROPOSALS:
            return await self.control.call(name, args, {**(data or {}), "tenant": self.tenant})
        raise ControlError("a tenant's client cannot change a server that other tenants may share; ask the operator")


class Stack:
    """One tenant's endpoints, door and built-in tools."""

    def __init__(self, tenant: str, shared: Shared) -> None:
        self.tenant = tenant
        self.shared = shared
        settings = shared.settings
        # Only the plain stack keeps its vectors on disk: one file, one writer.
        cache_dir = Path(shared.data_dir) if shared.data_dir and not tenant else None
        ranking = ServiceRanking(shared.search, cache_dir) if shared.search.embedding_url else None
        self.upstreams = Upstreams(
            settings,
            shared.servers_of(tenant),
            catalog=shared.router.catalogs.of_tenant(tenant),
            router=TenantRouter(shared.router, tenant) if tenant else shared.router,
            gate=shared.gate,
            activity=shared.activity,
            index=ToolIndex(cache_dir=cache_dir),
            ranking=ranking,
            rounds=Rounds(ROUND_TTL),
            metrics=shared.metrics,
            tenant=tenant,
            logins=shared.logins,
        )
        self.builtins = Builtins(
            self.upstreams,
            TenantControl(shared.control, tenant) if tenant else shared.control,  # type: ignore[arg-type]
            ResponseCache(),
            registries=shared.registries,
            config_path=shared.config_path,
            search=shared.search,
            confinement=shared.script_confinement,
        )
        # Each endpoint is a table of handlers over the door, served by the engine in both eras.
        security = Security.loopback() if shared.host in LOOPBACK_HOSTS else Security()
        seal = StateSeal(ROUND_TTL)
        quiet = Notices(self.upstreams, announce=lambda: False)  # /mcp lists mcpvisor's own tools only
        tables = {"/mcp": (search_table(self.upstreams, self.builtins, seal), quiet)}
        if settings.enable_direct_endpoint:
            notices = Notices(self.upstreams)
            tables["/mcp/direct"] = (direct_table(self.upstreams, notices, self.builtins, seal), notices)
        self.engines = {
            path: McpEndpoint(
                table,
                Engine(table.methods, security=security, input_schema=table.input_schema),
                notices,
                tenant=tenant,
            )
            for path, (table, notices) in tables.items()
        }
        self.endpoints = sorted(self.engines)
        servers = ServerEndpoints(self.upstreams, self.builtins, security=security, seal=seal, tenant=tenant)
        self.app = FrontendApp(self.engines, servers)
        self.started = trio.Event()
        self.last_used = time.monotonic()
        self.in_flight = 0  # requests of this tenant being served
        self._pool_running = not shared.on_demand
        self._pool_lock = trio.Lock()
        self._catalog_moved = trio.Event()
        self._nursery: trio.Nursery | None = None

    # -- lifetime --------------------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                await self._serve(nursery, task_status)
        finally:
            with trio.CancelScope(shield=True):
                await self.builtins.aclose()
            if not self.tenant:
                with contextlib.suppress(OSError):
                    self.upstreams.index.save_cache()  # the next start need not embed these tools again
                    if self.upstreams.ranking is not None:
                        self.upstreams.ranking.save_cache()

    async def _serve(self, nursery: trio.Nursery, task_status: trio.TaskStatus[None]) -> None:
        self._nursery = nursery
        await nursery.start(self.upstreams.rounds.serve)
        await nursery.start(self.upstreams.serve_index)
        await nursery.start(self.app.servers.serve)
        for engine in self.engines.values():
            await nursery.start(engine.serve)
        if self.shared.on_demand:
            nursery.start_soon(self._serve_idle_stop)
        if self.builtins.code_execution is not None:
            # Find out now whether scripts can run in their sandbox, so the log says so at start.
            nursery.start_soon(self.builtins.code_execution.pool.decision)
        self.upstreams.reindex()  # the tenant's workers may have reported before its first request
        self.started.set()
        task_status.started()
        await trio.sleep_forever()

    # -- events from below -----------------------------------------------------------------------

    def catalog_changed(self, server: str) -> None:
        view = self.upstreams.catalog.servers.get(server)
        if view is not None and view.ready and self._nursery is not None:
            # The tenant's login to it completed: the clients asked to open its link hear so.
            for requester, elicitation in self.upstreams.elicitations.pop(server, []):
                self._nursery.start_soon(requester.tell, ELICITATION_COMPLETE, {"elicitationId": elicitation})
        self.upstreams.reindex(server)
        for engine in self.engines.values():
            engine.notices.changed()
        self.app.servers.changed(server)
        self._catalog_moved.set()

    async def upstream_notified(self, server: str, method: str, payload: bytes) -> None:
        for engine in self.engines.values():
            engine.notices.upstream_notification(server, method, payload)
        self.app.servers.upstream_notification(server, method, payload)
        await trio.lowlevel.checkpoint()

    def config_changed(self) -> None:
        if self.shared.on_demand:
            # A server added to this tenant starts with its next request (starting is idempotent).
            self._pool_running = False
        self.upstreams.apply_config(self.shared.servers_of(self.tenant))
        self.upstreams.reindex()
        for engine in self.engines.values():
            engine.notices.changed()

    # -- workers on use --------------------------------------------------------------------------

    async def in_use(self) -> None:
        """A request of this tenant arrived: start its workers if they are not running, and wait for them."""
        self.last_used = time.monotonic()
        if self._pool_running:
            return
        async with self._pool_lock:
            if self._pool_running:
                return
            try:
                await self.shared.control.call("pool.start", data={"tenant": self.tenant})
            except ControlError as exc:
                log.warning("cannot start the workers of tenant %r: %s", self.tenant or "(operators)", exc)
                return
            self._pool_running = True
            started = time.monotonic()
            await self._wait_settled(START_WAIT)
            log.info(
                "tenant %r in use: workers started, %s after %.1fs",
                self.tenant or "(operators)",
                "all up or failed" if self._settled() else "some still starting",
                time.monotonic() - started,
            )

    def done(self) -> None:
        """A request of this tenant ended: idle time counts from now."""
        self.in_flight -= 1
        self.last_used = time.monotonic()

    async def _wait_settled(self, timeout: float) -> None:
        """Until every server of this tenant is ready or has failed, at most `timeout` seconds."""
        with trio.move_on_after(timeout):
            while not self._settled():
                self._catalog_moved = trio.Event()
                # A state change clients cannot see (connecting -> error, -> authenticating) moves
                # no catalog: look again shortly as well.
                with trio.move_on_after(SETTLE_CHECK):
                    await self._catalog_moved.wait()

    def _settled(self) -> bool:
        catalog = self.upstreams.catalog
        for name, config in self.upstreams.servers.items():
            if not config.enabled:
                continue
            view = catalog.servers.get(name)
            # A view left from before an idle stop is not alive: it says nothing of the new worker.
            # One that waits for a login waits for a person: the request need not wait with it.
            settled = (UpstreamState.READY, UpstreamState.ERROR, UpstreamState.AUTHENTICATING)
            if view is None or not view.alive or view.state not in settled:
                return False
        return True

    async def _serve_idle_stop(self) -> None:
        """Stop the tenant's workers once it made no request for its idle time (0: never)."""
        while True:
            await trio.sleep(IDLE_CHECK)
            limit = self.shared.idle_stop(self.tenant)
            if not limit or not self._pool_running or self.in_flight:
                continue
            if time.monotonic() - self.last_used < limit:
                continue
            async with self._pool_lock:
                try:
                    stopped = await self.shared.control.call("pool.idle", data={"tenant": self.tenant})
                except ControlError as exc:
                    log.warning("cannot stop the idle workers of tenant %r: %s", self.tenant or "(operators)", exc)
                    continue
                self._pool_running = False
                log.info("tenant %r idle for %gs: stopped %s", self.tenant or "(operators)", limit, stopped)


class Stacks:
    """The stacks by tenant, each built and started on its tenant's first request."""

    def __init__(self, shared: Shared, nursery_of: Callable[[], trio.Nursery]) -> None:
        self.shared = shared
        self._nursery_of = nursery_of
        self._stacks: dict[str, Stack] = {}

    def get(self, tenant: str) -> Stack | None:
        return self._stacks.get(tenant)

    def all(self) -> list[Stack]:
        return list(self._stacks.values())

    async def of(self, tenant: str) -> Stack:
        """The tenant's stack, started if this is its first request."""
        stack = self._stacks.get(tenant)
        if stack is None:
            stack = self._stacks[tenant] = Stack(tenant, self.shared)
            await self._nursery_of().start(stack.serve)
        else:
            await stack.started.wait()
        return stack

    def owner(self, worker: str) -> tuple[Stack | None, str]:
        """The stack a worker id belongs to, and the server's name there."""
        tenant, _, server = worker.rpartition("/")
        return self._stacks.get(tenant), server

    def catalog_changed(self, worker: str) -> None:
        stack, server = self.owner(worker)
        if stack is not None:
            stack.catalog_changed(server)

    async def upstream_notified(self, worker: str, method: str, payload: bytes) -> None:
        stack, server = self.owner(worker)
        if stack is not None:
            await stack.upstream_notified(server, method, payload)

    def config_changed(self, servers: dict[str, ServerConfig], tenants: Mapping[str, TenantConfig]) -> None:
        self.shared.servers = servers
        if self.shared.tenants:
            # In place: the authenticator and the limits hold this same table.
            self.shared.tenants.clear()
            self.shared.tenants.update(tenants)
        for stack in self.all():
            stack.config_changed()

    def changed(self, server: str) -> None:
        """The operator changed what clients may see of `server` (an approval): tell every stack."""
        for stack in self.all():
            stack.catalog_changed(server)
