"""`python -m mcpvisor.frontend`: the frontend process, started by the supervisor."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import sys

import trio
import zmq
from hypercorn.config import Config as HypercornConfig

from mcpvisor.frontend.door.catalog import Catalog
from mcpvisor.frontend.door.control import ControlClient
from mcpvisor.frontend.door.gatekeeper import Gate
from mcpvisor.frontend.door.logins import LoginTickets
from mcpvisor.frontend.door.metrics import Metrics
from mcpvisor.frontend.door.router import MergedCatalog, Router
from mcpvisor.frontend.endpoints.admin_api import PREFIX as API_PREFIX
from mcpvisor.frontend.endpoints.admin_api import AdminApi, DefinitionArchive
from mcpvisor.frontend.endpoints.app import Gateway
from mcpvisor.frontend.endpoints.auth import Authenticator
from mcpvisor.frontend.endpoints.console import PREFIX as CONSOLE_PREFIX
from mcpvisor.frontend.endpoints.console import Console, OperatorDoor
from mcpvisor.frontend.endpoints.http_server import Http1Server
from mcpvisor.frontend.endpoints.leaving import Leaving
from mcpvisor.frontend.endpoints.oauth_resource import JwtAuthority, ResourceMetadata, resource_metadata_url
from mcpvisor.frontend.endpoints.operator import Operator
from mcpvisor.frontend.gate.activity import ActivityLog
from mcpvisor.frontend.gate.approvals import ToolApprovals
from mcpvisor.frontend.gate.call_policy import CallGate
from mcpvisor.frontend.gate.policy_gate import PolicyGate
from mcpvisor.frontend.gate.store_writer import StoreWriter
from mcpvisor.frontend.gate.tool_limits import ToolLimits
from mcpvisor.frontend.gate.waiting_calls import WaitingCalls
from mcpvisor.frontend.stacks import Shared, Stacks
from mcpvisor.frontend.tools.code_execution import Confinement
from mcpvisor.runtime import lifetime, logs, script_runner, telemetry
from mcpvisor.store.state_db import is_shared, open_store
from mcpvisor.store.tokens import TokenStore
from mcpvisor.wire import codec, frontend_spec
from mcpvisor.wire.config import parse_listen
from mcpvisor.wire.inbox import serve_messages
from mcpvisor.wire.messages import ConfigChanged, EventMessage, ProcessEvent, Report
from mcpvisor.wire.states import ProcessState
from mcpvisor.wire.zsocket import ZSocket

log = logging.getLogger("mcpvisor.frontend")


async def serve_events(sock: ZSocket, router: Router, stacks: Stacks, calls: CallGate) -> None:
    """Follow the supervisor: fail calls to a worker the moment it stops; take in config changes."""

    async def handle(_topic: list[bytes], event: EventMessage, _payload: bytes | None) -> None:
        match event:
            # STOPPING is left out on purpose: a stopping worker finishes the calls it has.
            case ProcessEvent() if event.name.startswith("worker:") and event.state in (
                ProcessState.EXITED,
                ProcessState.STOPPED,
                ProcessState.BACKOFF,
                ProcessState.FATAL,
            ):
                router.fail_worker(event.name.removeprefix("worker:"), f"worker {event.state}")
            case ConfigChanged():
                await calls.reload(event.policies)  # first: the lists clients are sent again use them
                stacks.config_changed(event.servers, event.tenants)

    await serve_messages(sock, codec.events, handle, envelope=1, what="event")


async def serve_reports(sock: ZSocket) -> None:
    """Tell the supervisor this frontend is up (it becomes RUNNING) and alive, every second."""
    report = codec.control.encode(Report(name="frontend", pid=os.getpid()))
    while True:
        sock.send_multipart_nowait(report)
        await trio.sleep(1.0)


class CannotListen(Exception):
    """The listener could not be opened; the supervisor has been told why."""


EXIT_CANNOT_LISTEN = 3


async def report_cannot_listen(control: ZSocket, listen: str, exc: OSError) -> None:
    """Tell the supervisor, in one line, why this frontend cannot serve: it goes FATAL, not round a loop."""
    reason = f"cannot listen on {listen}: {exc.strerror or exc}"
    if exc.errno == errno.EADDRINUSE:
        reason = f"cannot listen on {listen}: the address is in use (another program listens there)"
    log.error("%s", reason)
    control.send_multipart_nowait(codec.control.encode(Report(name="frontend", pid=os.getpid(), fatal=reason)))
    await trio.sleep(0.2)  # the socket closes without lingering: let the report leave first


async def run(
    spec: frontend_spec.FrontendSpec, *, task_status: trio.TaskStatus[Departure] = trio.TASK_STATUS_IGNORED
) -> None:
    settings = spec.settings
    host, port = parse_listen(settings.listen)
    ctx = zmq.Context()
    calls_raw = ctx.socket(zmq.ROUTER)
    calls_raw.setsockopt(zmq.SNDHWM, 10000)
    calls_raw.setsockopt(zmq.RCVHWM, 10000)
    # A worker respawned within moments takes its name over from its dead predecessor's connection.
    calls_raw.setsockopt(zmq.ROUTER_HANDOVER, 1)
    calls_raw.bind(spec.calls_endpoint)
    events_raw = ctx.socket(zmq.SUB)
    events_raw.setsockopt(zmq.SUBSCRIBE, b"process.")
    events_raw.setsockopt(zmq.SUBSCRIBE, b"config")
    events_raw.connect(spec.events_endpoint)
    control_raw = ctx.socket(zmq.DEALER)
    control_raw.connect(spec.control_endpoint)
    calls, events, control = ZSocket(calls_raw), ZSocket(events_raw), ZSocket(control_raw)

    control_client = ControlClient(control)
    db = open_store(spec.data_dir, settings.state_url)
    writer = StoreWriter(db)
    catalog = Catalog(settings.direct_tool_names)
    metrics = Metrics(catalog, status=lambda: control_client.call("status"), workers=lambda: router.catalogs.workers())
    policies = PolicyGate(spec.policies, metrics.registry)
    calls_gate = CallGate(policies, ToolLimits(policies.config.limits), WaitingCalls(db))
    router = Router(
        calls,
        catalog,
        lambda worker: catalog_changed(worker),
        on_notification=lambda worker, method, payload: stacks.upstream_notified(worker, method, payload),
    )
    activity = ActivityLog(
        db,
        record_arguments=settings.activity_record_arguments,
        retention_days=settings.activity_retention_days,
        max_rows=settings.activity_max_rows,
        writer=writer,
    )
    audit_required = settings.audit_required if settings.audit_required is not None else bool(spec.tenants)
    shared = Shared(
        settings=settings,
        servers=spec.servers,
        tenants=spec.tenants,
        router=router,
        gate=Gate(ToolApprovals(db, writer), calls_gate, audit=activity if audit_required else None),
        activity=activity,
        metrics=metrics,
        control=control_client,
        host=host,
        data_dir=spec.data_dir,
        config_path=spec.config_path,
        registries=spec.registries,
        search=spec.search,
        script_confinement=Confinement(
            required=script_runner.sandbox_required(settings, spec.tenants), hidden=tuple(spec.hidden)
        ),
        logins=LoginTickets(ttl=settings.login_link_ttl),
    )
    router.on_account = shared.activity.record_account
    services: trio.Nursery | None = None

    def nursery_of() -> trio.Nursery:
        assert services is not None
        return services

    stacks = Stacks(shared, nursery_of)
    merged = MergedCatalog(router.catalogs)
    # The definitions behind the pins, kept so the operator sees what a changed tool changed.
    archive = DefinitionArchive(db, shared.gate.approvals, merged, writer)

    def catalog_changed(worker: str) -> None:
        stacks.catalog_changed(worker)
        archive.observe(worker)

    def decided(server: str) -> None:
        stacks.changed(server)
        archive.observe(server)

    operator = Operator(
        servers=lambda: shared.servers,
        catalog=merged,
        approvals=shared.gate.approvals,
        control=control_client,
        changed=decided,
        accounts=shared.activity.record_account,
        waiting=calls_gate.waiting,
        changes=shared.activity.record_operator,
    )
    tokens = TokenStore(db)
    authenticator = None
    oauth = spec.oauth
    if spec.tenants or oauth is not None:
        authenticator = Authenticator(
            tokens,
            spec.tenants,
            admin_token_files=settings.admin_token_files,
            jwt=JwtAuthority(oauth, spec.tenants) if oauth is not None else None,
            resource_metadata=resource_metadata_url(oauth.resource) if oauth is not None else None,
        )
    # /api/v1 and /ui: the gateway's boundary, or a console session, through one operator door.
    door = OperatorDoor(
        lambda scope, receive, send: app.boundary(scope, receive, send),
        authenticate=authenticator.principal if authenticator is not None else None,
        tokens=tokens,
    )
    admin_api = AdminApi(
        door,
        control_client,
        servers=lambda: shared.servers,
        catalog=merged,
        approvals=shared.gate.approvals,
        archive=archive,
        tenants=lambda: shared.tenants,
        tokens=tokens,
        waiting=calls_gate.waiting,
    )
    app = Gateway(
        stacks,
        host,
        settings.max_body_bytes,
        authenticator=authenticator,
        metrics=shared.metrics,
        resource_metadata=ResourceMetadata(oauth) if oauth is not None else None,
        operator_surfaces={API_PREFIX: admin_api, CONSOLE_PREFIX: Console(door)},
        sandboxed=shared.sandboxed,
    )

    config = HypercornConfig()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.keep_alive_timeout = 75
    config.include_server_header = False  # the same answers on both of http_server.py's paths
    try:
        async with trio.open_nursery() as nursery:
            services = nursery
            nursery.start_soon(router.serve)
            nursery.start_soon(writer.serve)
            if is_shared(db):
                from mcpvisor.frontend.gate.shared_pins import serve_following_pins  # loads the driver

                nursery.start_soon(serve_following_pins, db, shared.gate.approvals, decided)
            nursery.start_soon(shared.activity.serve_pruning)
            nursery.start_soon(serve_events, events, router, stacks, calls_gate)
            nursery.start_soon(calls_gate.waiting.serve_following)  # verdicts from other replicas
            # The plain stack serves the workstation (and operators when there are tenants).
            plain = await stacks.of("")
            nursery.start_soon(control_client.serve, operator.answer)
            metrics = shared.metrics
            gate = Leaving(app, settings.max_body_bytes)
            listener = Http1Server(
                gate,
                config,
                max_body=settings.max_body_bytes,
                on_connection=metrics.connections.inc if metrics is not None else None,
                on_handover=metrics.handovers.inc if metrics is not None else None,
            )
            try:
                binds = await nursery.start(listener.serve)
            except OSError as exc:
                await report_cannot_listen(control, settings.listen, exc)
                raise CannotListen from None
            nursery.start_soon(serve_reports, control)
            log.info(
                "serving MCP on %s (endpoints: %s%s)",
                ", ".join(binds),
                ", ".join(plain.endpoints) or "none",
                f"; {len(spec.tenants)} tenants" if spec.tenants else "",
            )
            task_status.started(Departure(gate, listener, settings.leave_delay, settings.leave_timeout))
    finally:
        writer.run_pending()
        db.close()
        calls.close()
        events.close()
        control.close()
        ctx.term()
        # The bound socket's file outlives the socket; the next frontend binds it again.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(spec.calls_endpoint.removeprefix("ipc://"))


class Departure:
    """How this frontend leaves on SIGTERM: not-ready at once, then no new connections, then stop."""

    def __init__(self, gate: Leaving, listener: Http1Server, delay: float, timeout: float) -> None:
        self.gate = gate
        self.listener = listener
        self.delay = delay
        self.timeout = timeout

    async def leave(self) -> None:
        """Returns once the calls in flight are done (or `timeout` has passed)."""
        self.gate.start()
        log.info("leaving: /healthz answers 503; accepting for %g s more", self.delay)
        await trio.sleep(self.delay)
        self.listener.stop_accepting()
        with trio.move_on_after(self.timeout) as waited:
            await self.gate.wait_idle()
        if waited.cancelled_caught:
            log.warning("leaving with %d calls still in flight after %g s", self.gate.in_flight, self.timeout)


async def main(spec: frontend_spec.FrontendSpec) -> None:
    async with telemetry.running("frontend"), trio.open_nursery() as nursery:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            departure: Departure | None = None

            async def start() -> None:
                nonlocal departure
                departure = await nursery.start(run, spec)

            async def leave(departure: Departure) -> None:
                await departure.leave()
                nursery.cancel_scope.cancel()

            nursery.start_soon(start)
            leaving = False
            async for signum in signals:
                # SIGTERM leaves gracefully once serving; a second one, or Ctrl-C, stops at once.
                if signum == signal.SIGTERM and departure is not None and not leaving:
                    leaving = True
                    nursery.start_soon(leave, departure)
                    continue
                log.info("received %s, stopping", signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                return


def entry() -> None:
    lifetime.die_with_parent(int(os.environ.get("MCPVISOR_PARENT_PID", "0")) or None)
    text = os.environ.pop(frontend_spec.ENV_VAR, None)
    if text is None:
        print(
            f"{frontend_spec.ENV_VAR} is not set: the frontend is started by `mcpvisor serve`",
            file=sys.stderr,
        )
        sys.exit(2)
    spec = frontend_spec.decode(text)
    logs.setup("frontend", spec.settings.log_level)
    try:
        trio.run(main, spec)
    except* CannotListen:
        sys.exit(EXIT_CANNOT_LISTEN)


if __name__ == "__main__":
    entry()
