"""The supervisor: owns the config, spawns the frontend and one worker per server, keeps them up."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
import trio
import zmq

from mcpvisor.runtime import bwrap, lifetime, namespaces, telemetry
from mcpvisor.runtime.forkserver import ForkServer
from mcpvisor.runtime.logs import log_stem
from mcpvisor.runtime.replies import PendingReplies
from mcpvisor.store import oauth_store
from mcpvisor.store.proposals import ProposalStore
from mcpvisor.store.sandbox_uids import SandboxUids, open_local
from mcpvisor.supervisor import config as config_mod
from mcpvisor.supervisor import configstore, operator_changes
from mcpvisor.supervisor.commands import EXIT_ERROR, EXIT_UNKNOWN, EXIT_USAGE, CommandError, load_all
from mcpvisor.supervisor.config import Config
from mcpvisor.supervisor.policy_files import load_policies
from mcpvisor.supervisor.process import Launch, Program, Spawner
from mcpvisor.supervisor.systemd import Notifier
from mcpvisor.wire import codec, frontend_spec, sandboxing, tenant_secrets, worker_spec
from mcpvisor.wire.config import ConfigError, Policy, ServerConfig
from mcpvisor.wire.endpoints import Endpoints, ensure_private_dir, runtime_dir
from mcpvisor.wire.inbox import serve_messages
from mcpvisor.wire.messages import (
    Command,
    ConfigChanged,
    ControlMessage,
    OperatorReply,
    OperatorRequest,
    ProcessEvent,
    Reply,
    Report,
)
from mcpvisor.wire.operator import Action, OperatorResult
from mcpvisor.wire.redaction import redact_secrets
from mcpvisor.wire.sandboxing import SandboxPlan
from mcpvisor.wire.secrets import SECRET_REF
from mcpvisor.wire.states import ProcessState, UpstreamState
from mcpvisor.wire.zsocket import ZSocket

if TYPE_CHECKING:  # the database driver loads only with a shared store
    from mcpvisor.supervisor.shared import SharedState

log = logging.getLogger("mcpvisor.supervisor")
_T = TypeVar("_T")

FRONTEND = "frontend"
WORKER_PREFIX = "worker:"
OPERATOR_TIMEOUT = 30.0  # seconds the frontend has to answer an operator's request
FRONTEND_WAIT = 30.0  # right after start-up (or a restart) the frontend may still be on its way up
# The frontend has no server table; these are its process policy.
FRONTEND_POLICY = Policy(startsecs=1, startretries=10, backoff_max=30, stopwaitsecs=10)


def frontend_policy(config: Config) -> Policy:
    """The frontend's policy: stopping it waits for it to leave the load balancer's rotation."""
    settings = config.mcpvisor
    wait = FRONTEND_POLICY.stopwaitsecs + settings.leave_delay + settings.leave_timeout
    return msgspec.structs.replace(FRONTEND_POLICY, stopwaitsecs=wait)


def _clip(text: str, limit: int = 200) -> str:
    """Anyone who can reach the control socket chooses these strings: one short printable line."""
    text = text if len(text) <= limit else text[:limit] + "..."
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _command_id(frames: list[bytes]) -> int | None:
    """The id of a command that did not decode, if its header is a map with `t: cmd` and an int `id`."""
    try:
        header = msgspec.msgpack.decode(frames[0]) if len(frames) in (1, 2) else None
    except (ValueError, RecursionError):  # msgspec's DecodeError is a ValueError, and so is bad UTF-8
        return None
    if isinstance(header, dict) and header.get("t") == "cmd":
        request_id = header.get("id")
        if isinstance(request_id, int) and not isinstance(request_id, bool) and 0 <= request_id < 2**63:
            return request_id
    return None


def _secret_files(values: list[str], tenants: list[str]) -> list[str]:
    """The files these values' `${file:}` references read, for every tenant where one names `{tenant}`."""
    found: list[str] = []
    for value in values:
        if not tenant_secrets.names_tenant(value):
            found += [
                os.path.abspath(os.path.expanduser(ref)) for kind, ref in SECRET_REF.findall(value) if kind == "file"
            ]
            continue
        for match in tenant_secrets.TEMPLATE_REF.finditer(value):
            kind, ref = match.group(1), match.group(2)
            if kind != "file":
                continue
            if tenant_secrets.PLACEHOLDER not in ref:
                found.append(os.path.abspath(os.path.expanduser(ref)))
                continue
            # Each tenant's own file, and the dir that holds one per tenant when `{tenant}` is a
            # whole component of the path: a tenant added later is covered before its first start.
            found += [
                os.path.abspath(os.path.expanduser(ref.replace(tenant_secrets.PLACEHOLDER, tenant)))
                for tenant in tenants
            ]
            head, _, tail = ref.partition(tenant_secrets.PLACEHOLDER)
            if head.endswith("/") and (not tail or tail.startswith("/")):
                parent = os.path.abspath(os.path.expanduser(head))
                if parent != "/":
                    found.append(parent)
    return found


def hidden_paths(config: Config, config_path: Path, data_dir: Path, run_dir: Path) -> list[str]:
    """What no sandbox may see: mcpvisor's dirs, its config, and every file a secret or token is read from."""
    paths = [str(data_dir.resolve()), str(run_dir.resolve()), str(config_path), f"{config_path}.bak"]
    # Its dir too when every sandbox would see it (/etc/mcpvisor in /etc): whatever else the
    # operator keeps there. Elsewhere only a bind could show it, and the virtualenv of a project
    # whose dir also holds the config must stay bindable (a bind of the whole dir is refused, as
    # it would show the config: workers.confine).
    parent = str(config_path.parent)
    if parent.startswith("/etc/"):
        paths.append(parent)
    values: list[str] = []
    for server in config.servers.values():
        values += [*server.env.values(), *server.headers.values()]
        if server.oauth is not None and server.oauth.client_secret:
            values.append(server.oauth.client_secret)
    values += [registry.token for registry in config.registries.values() if registry.token]
    if config.mcpvisor.state_url:
        values.append(config.mcpvisor.state_url)
    paths += _secret_files(values, list(config.tenants))
    files = list(config.mcpvisor.admin_token_files)
    for tenant in config.tenants.values():
        files += tenant.token_files
    paths += [os.path.abspath(os.path.expanduser(path)) for path in files]
    return list(dict.fromkeys(paths))


def worker_name(server: str) -> str:
    return f"{WORKER_PREFIX}{server}"


def server_of(worker: str) -> str:
    """`alice/github` -> `github`: the server a worker id runs."""
    return worker.rpartition("/")[2]


def desired_workers(config: Config) -> list[str]:
    """The worker ids this config calls for: one per enabled server, and one per (tenant, server).

    With tenants, the plain `server` workers serve operators (admin tokens), and every worker
    starts on first use rather than with mcpvisor.
    """
    ids = [name for name, server in config.servers.items() if server.enabled]
    for tenant, table in config.tenants.items():
        ids.extend(f"{tenant}/{name}" for name in table.servers if config.servers[name].enabled)
    return ids


@dataclass(frozen=True)
class ConfigDiff:
    """What `reread` finds: servers added, changed and removed, and whether [mcpvisor] changed."""

    added: list[str]
    changed: list[str]
    removed: list[str]
    settings_changed: bool

    tenants_changed: bool = False
    # [telemetry] is set up once per process, the supervisor's included: a change waits for a restart.
    telemetry_changed: bool = False

    @property
    def empty(self) -> bool:
        return not (
            self.added
            or self.changed
            or self.removed
            or self.settings_changed
            or self.tenants_changed
            or self.telemetry_changed
        )


def _process_view(server: ServerConfig) -> ServerConfig:
    # Quarantine is the frontend's business: flipping it must not restart the worker.
    return msgspec.structs.replace(server, quarantined=False)


def diff_configs(old: Config, new: Config) -> ConfigDiff:
    """Compare two configs server by server (pure): which workers must start, restart or stop."""
    old_servers, new_servers = old.servers, new.servers
    common = set(old_servers) & set(new_servers)
    return ConfigDiff(
        added=sorted(set(new_servers) - set(old_servers)),
        changed=sorted(n for n in common if _process_view(old_servers[n]) != _process_view(new_servers[n])),
        removed=sorted(set(old_servers) - set(new_servers)),
        # The frontend holds the settings, the issuer and the search settings, and authenticates clients once tenants
        # exist: a change to those restarts it. A tenant's table changing reaches it as ConfigChanged.
        settings_changed=(old.mcpvisor, old.oauth, old.search, bool(old.tenants))
        != (new.mcpvisor, new.oauth, new.search, bool(new.tenants)),
        tenants_changed=old.tenants != new.tenants,
        telemetry_changed=old.telemetry != new.telemetry,
    )


class Supervisor:
    """The process table, the event socket and the control socket."""

    def __init__(
        self,
        config: Config,
        config_path: Path,
        *,
        notifier: Notifier | None = None,
        shared: SharedState | None = None,
        base: Config | None = None,
        run_dir: Path | None = None,
    ) -> None:
        self.config = config
        self.policies = load_policies(config, config_path)  # [policy] and its files' text, handed to the frontend
        # With a shared store (`state_url`), `config` is the file (`base`) with the run-time
        # changes of every replica over it, and the file is never written (supervisor/shared.py).
        self.shared = shared
        self.base = config if base is None else base
        self.config_path = config_path.resolve()
        self.data_dir = config_mod.data_dir(config, self.config_path)
        self.log_dir = self.data_dir / "logs"
        # The one its instance lock chose (supervisor/instance.py); the shared one by default.
        self.run_dir = run_dir or runtime_dir(self.data_dir)
        self.endpoints = Endpoints.in_dir(self.run_dir)
        self.programs: dict[str, Program] = {}
        self.reports: dict[str, Report] = {}
        self._report_at: dict[str, float] = {}
        self.started_at = time.monotonic()
        self.notifier = notifier or Notifier()
        self.commands = load_all()
        # Clients' proposed changes to the servers, waiting for an operator (kept across restarts).
        if shared is not None:
            from mcpvisor.supervisor.shared import SharedProposals

            self.proposals: ProposalStore = SharedProposals(shared.store, self.data_dir)
        else:
            self.proposals = ProposalStore.load(self.data_dir)
        self.proposals.prune(config.servers)
        self.config_version = 0
        self._events: ZSocket | None = None
        self._control: ZSocket | None = None
        self._frontend_identity: bytes | None = None  # the frontend's DEALER, learnt from its reports
        self._operator_ids = itertools.count(1)
        self._operator_replies: PendingReplies[int, OperatorReply] = PendingReplies()
        self._worker_identities: dict[str, bytes] = {}  # each worker's control DEALER, from its reports
        self._worker_replies: PendingReplies[int, Reply] = PendingReplies()
        self._nursery: trio.Nursery | None = None
        self._ops_lock = trio.Lock()  # one config-changing command at a time
        self._proposals_lock = trio.Lock()  # one change to the shared proposals at a time, in order
        self.forkserver = ForkServer(
            [sys.executable, "-P", "-m", "mcpvisor.workers.forkserver"], os.environ, self.log_dir / "forkserver.log"
        )
        self.shutdown_requested = trio.Event()
        self.stopping = False  # once set, nothing starts again
        self.exit_code = 0  # what `mcpvisor serve` exits with
        self._frontend_was_up = False  # a frontend that cannot listen at start-up ends mcpvisor
        self._sandbox_uids: SandboxUids | None = None

    # -- launching -------------------------------------------------------------------------------

    def frontend_launch(self) -> Launch:
        spec = frontend_spec.FrontendSpec(
            settings=self.config.mcpvisor,
            servers=self.config.servers,
            calls_endpoint=self.endpoints.calls,
            control_endpoint=self.endpoints.control,
            events_endpoint=self.endpoints.events,
            config_path=str(self.config_path),
            data_dir=str(self.data_dir),
            registries=self.config.registries,
            tenants=self.config.tenants,
            oauth=self.config.oauth,
            search=self.config.search,
            policies=self.policies,
            hidden=hidden_paths(self.config, self.config_path, self.data_dir, self.run_dir),
        )
        env = dict(os.environ) | {frontend_spec.ENV_VAR: frontend_spec.encode(spec)}
        return Launch([sys.executable, "-P", "-m", "mcpvisor.frontend"], env, self.log_dir / "frontend.log")

    def worker_launch(self, worker: str) -> Launch:
        tenant = worker.rpartition("/")[0]
        # Per-tenant secret references name this worker's tenant, as the tenant table knows it.
        server = self.config.servers[server_of(worker)]
        if tenant in self.config.tenants:
            server = tenant_secrets.for_tenant(server, tenant)
        spec = worker_spec.WorkerSpec(
            id=worker,
            server=server,
            calls_endpoint=self.endpoints.calls,
            control_endpoint=self.endpoints.control,
            log_dir=str(self.log_dir),
            call_timeout=self.config.mcpvisor.call_timeout,
            log_level=self.config.mcpvisor.log_level,
            max_result_bytes=self.config.mcpvisor.max_result_bytes,
            sandbox=self.sandbox_plan(worker),
            # Only a remote upstream logs in; a stdio server's worker has no use for the store.
            state_url=(self.config.mcpvisor.state_url or "") if server.kind != "stdio" else "",
        )
        env = dict(os.environ) | {worker_spec.ENV_VAR: worker_spec.encode(spec)}
        log_path = self.log_dir / f"{log_stem(worker)}.worker.log"
        return Launch([sys.executable, "-P", "-m", "mcpvisor.workers"], env, log_path)

    def sandbox_plan(self, worker: str, *, for_start: bool = True) -> SandboxPlan | None:
        """The sandbox a worker's upstream runs in (None: none), from the config as it is now.

        As root, each worker id runs as a uid of its own, taken from the uid table on its first start.
        """
        tenant = worker.rpartition("/")[0]
        server = self.config.servers[server_of(worker)]
        table = self.config.tenants.get(tenant) if tenant else None
        uid = None
        if for_start and sandboxing.wanted(self.config.mcpvisor, server, table) and bwrap.mounts_as_root():
            uid = self.sandbox_uids().uid_for(worker)
        elif self._sandbox_uids is not None:
            uid = self._sandbox_uids.known.get(worker)  # shown by `ctl inspect`, never taken for it
        return sandboxing.plan(
            worker,
            self.config.mcpvisor,
            server,
            table,
            data_dir=str(self.data_dir.resolve()),
            hidden=hidden_paths(self.config, self.config_path, self.data_dir, self.run_dir),
            writable=sandboxing.writable_places(self.config.mcpvisor, self.config.servers, self.config.tenants),
            uid=uid,
        )

    async def allocate_sandbox_uids(self, workers: list[str]) -> None:
        """As root, take the uids of these workers now, in a thread: the shared store is a network call."""
        if bwrap.mounts_as_root() and config_mod.needs_sandbox(self.config):
            await trio.to_thread.run_sync(self.sandbox_uids().allocate, workers)

    def sandbox_uids(self) -> SandboxUids:
        """The uid table, in the state store (shared by replicas, or the data dir's SQLite)."""
        if self._sandbox_uids is None:
            db = self.shared.store if self.shared is not None else open_local(str(self.data_dir))
            self._sandbox_uids = SandboxUids(db, namespaces.mapped_ids())
        return self._sandbox_uids

    def _add_program(self, name: str, launch: Launch, policy: Policy, spawner: Spawner | None = None) -> Program:
        program = Program(name, launch, policy, self._state_changed, needs_report=True, spawner=spawner)
        if self.stopping:
            program.halt()  # a change applied while mcpvisor stops: known, never started
        self.programs[name] = program
        assert self._nursery is not None
        self._nursery.start_soon(program.serve)
        return program

    def _add_worker(self, worker: str) -> Program:
        policy = self.config.servers[server_of(worker)].policy
        return self._add_program(worker_name(worker), self.worker_launch(worker), policy, self.forkserver)

    @property
    def on_demand(self) -> bool:
        """Workers start on their first use (tenants are configured), not with mcpvisor."""
        return bool(self.config.tenants)

    def worker_ids(self) -> list[str]:
        return desired_workers(self.config)

    def _start_workers(self, workers: list[str], *, running_before: set[str] = frozenset()) -> None:
        """Add these workers; start those that start with mcpvisor, or were running before a change."""
        for worker in workers:
            program = self._add_worker(worker)
            if not self.on_demand or worker in running_before:
                program.start()
            else:
                program.idle = True

    async def start_pool(self, tenant: str) -> list[str]:
        """Start the workers of a tenant ("" : the plain ones) that are not running; their ids."""
        started = []
        for worker in self.worker_ids():
            if worker.rpartition("/")[0] != tenant:
                continue
            program = self.programs.get(worker_name(worker))
            if program is not None and not program.want_running:
                program.idle = False
                program.start()
                started.append(worker)
        return started

    async def stop_idle(self, tenant: str) -> list[str]:
        """Stop the running workers of a tenant that went idle; their ids."""
        stopping = []
        for worker in self.worker_ids():
            program = self.programs.get(worker_name(worker))
            if worker.rpartition("/")[0] == tenant and program is not None and program.want_running:
                program.idle = True
                stopping.append(program)
        await self.stop_programs(stopping)
        return [self.display_name(program) for program in stopping]

    async def _remove_programs(self, names: list[str]) -> None:
        """Stop these programs (all at once) and forget them."""
        programs = [self.programs[name] for name in names if name in self.programs]
        await self.stop_programs(programs)
        for program in programs:
            program.retire()
            del self.programs[program.name]
            self.reports.pop(program.name, None)
            self._report_at.pop(program.name, None)

    # -- events ----------------------------------------------------------------------------------

    def _state_changed(self, program: Program) -> None:
        """Every state change: publish `process.<name>.<state>`, refresh systemd's status."""
        if program.state is not ProcessState.RUNNING:
            self.reports.pop(program.name, None)
            if program.name == FRONTEND:
                # Its requests in flight will never be answered: say so now rather than at the timeout.
                self._frontend_identity = None
                gone = OperatorReply(id=0, error="the frontend stopped before it answered", exit_code=EXIT_ERROR)
                self._operator_replies.deliver_all(gone)
        event = ProcessEvent(name=program.name, state=program.state, pid=program.pid, description=program.description())
        self._publish(f"process.{program.name}.{program.state.lower()}", event)
        self._update_systemd()

    def _publish(self, topic: str, message: ProcessEvent | ConfigChanged) -> None:
        if self._events is None:
            return
        try:
            self._events.send_multipart_nowait([topic.encode(), *codec.events.encode(message)])
        except (zmq.ZMQError, trio.ClosedResourceError) as exc:
            log.debug("event not published: %s", exc)

    def publish_config(self) -> None:
        self.config_version += 1
        self._publish(
            "config",
            ConfigChanged(
                servers=dict(self.config.servers),
                version=self.config_version,
                tenants=dict(self.config.tenants),
                policies=self.policies,
            ),
        )

    def _update_systemd(self) -> None:
        if not self.notifier.enabled:
            return
        workers = [p for p in self.programs.values() if p.name.startswith(WORKER_PREFIX)]
        ready = sum(
            1
            for p in workers
            if (r := self.reports.get(p.name)) is not None and r.upstream_state is UpstreamState.READY
        )
        status = f"{ready}/{len(workers)} upstreams ready"
        settled = all(p.name in self.reports or p.state in (ProcessState.FATAL, ProcessState.BACKOFF) for p in workers)
        frontend = self.programs.get(FRONTEND)
        if settled and frontend is not None and frontend.state is ProcessState.RUNNING:
            self.notifier.ready(status)
        if self.notifier.ready_sent:
            self.notifier.send(f"STATUS={status}")

    # -- reports and the watchdog ----------------------------------------------------------------

    def on_report(self, report: Report, identity: bytes = b"") -> None:
        program = self.programs.get(report.name)
        if program is None or report.pid != program.pid:
            return  # a late report from a process that is already gone
        if report.name == FRONTEND and identity:
            self._frontend_identity = identity
        elif identity:
            self._worker_identities[report.name] = identity
        if report.fatal:
            if report.name == FRONTEND:
                self._frontend_cannot_run(program, report.fatal)
            else:
                program.spawn_error = f"upstream failed to start: {report.fatal}"
            return
        previous = self.reports.get(report.name)
        self.reports[report.name] = report
        self._report_at[report.name] = time.monotonic()
        if self._has_settled(program, report):
            program.ready.set()
            if report.name == FRONTEND:
                self._frontend_was_up = True
        if previous is None or previous.upstream_state != report.upstream_state:
            self._update_systemd()

    def _frontend_cannot_run(self, program: Program, reason: str) -> None:
        """The frontend cannot serve (its port is taken): FATAL, not a loop; at start-up, mcpvisor exits."""
        program.refuse(reason)
        log.error("frontend: %s", reason, extra={"fields": {"event": "frontend_fatal"}})
        if not self._frontend_was_up and not self.stopping:
            log.error("mcpvisor cannot start: %s", reason)
            self.exit_code = 1
            self.shutdown_requested.set()

    def _has_settled(self, program: Program, report: Report) -> bool:
        """Whether a report makes the process count as up: RUNNING is earned, not assumed.

        The frontend is up once it reports. A worker is up once its upstream is ready; a remote
        upstream that is unreachable also settles it (the worker keeps reconnecting), whereas a
        stdio upstream that cannot start makes the worker exit, and start retries apply.
        """
        if report.upstream_state is None or report.upstream_state is UpstreamState.READY or report.waiting:
            return True  # waiting: for the operator to put a secret in place, retrying meanwhile
        server = self.config.servers.get(server_of(program.name.removeprefix(WORKER_PREFIX)))
        waiting = (UpstreamState.ERROR, UpstreamState.AUTHENTICATING)  # AUTHENTICATING: for an operator's login
        return report.upstream_state in waiting and server is not None and server.kind != "stdio"

    async def _serve_watchdog(self) -> None:
        """Kill a process that stopped reporting: it is hung, and its program will restart it."""
        while True:
            slept_from = time.monotonic()
            await trio.sleep(1.0)
            now = time.monotonic()
            if now - slept_from > 1.5:
                # The supervisor itself was held up: the reports that came meanwhile are not read
                # yet. A process is judged by what it sent, not by how busy we were.
                continue
            for name, program in list(self.programs.items()):
                seen = self._report_at.get(name)
                if program.state is not ProcessState.RUNNING or seen is None or program.pid == 0:
                    continue
                if now - seen > program.policy.heartbeat_timeout:
                    log.warning("%s: no report for %.1fs, killing pid %d", name, now - seen, program.pid)
                    self._report_at.pop(name, None)
                    program.kill_hung()

    async def _serve_systemd_watchdog(self) -> None:
        interval = self.notifier.watchdog_interval()
        if interval is None:
            return
        while True:
            self.notifier.send("WATCHDOG=1")
            await trio.sleep(interval)

    # -- control ---------------------------------------------------------------------------------

    async def _serve_control(self, sock: ZSocket, nursery: trio.Nursery) -> None:
        async def handle(envelope: list[bytes], msg: ControlMessage, _payload: bytes | None) -> None:
            if isinstance(msg, Report):
                self.on_report(msg, envelope[0])
            elif isinstance(msg, Command):
                nursery.start_soon(self._run_command, sock, envelope[0], msg)
            elif isinstance(msg, OperatorReply):
                self._operator_replies.deliver(msg.id, msg)
            elif isinstance(msg, Reply):
                self._worker_replies.deliver(msg.id, msg)

        async def undecodable(envelope: list[bytes], frames: list[bytes], exc: Exception) -> None:
            # A command we cannot read still gets an answer when it says who is waiting for one.
            request_id = _command_id(frames)
            if request_id is None:
                log.warning("undecodable control message: %s", _clip(str(exc)))
                return
            reply = Reply(id=request_id, ok=False, error=f"malformed command: {_clip(str(exc))}", exit_code=EXIT_USAGE)
            await self._send_reply(sock, envelope[0], reply)

        await serve_messages(sock, codec.control, handle, envelope=1, undecodable=undecodable, what="control message")

    async def _run_command(self, sock: ZSocket, identity: bytes, cmd: Command) -> None:
        """Run one command and answer it; nothing a command does can end the supervisor."""
        spec = self.commands.get(cmd.name)
        try:
            if spec is None:
                raise CommandError(f"unknown command {_clip(repr(cmd.name))}", EXIT_UNKNOWN)
            if spec.operator_only and identity == self._frontend_identity:
                # The frontend's line carries what its clients' tools send: never a verdict on a call.
                raise CommandError(f"{cmd.name}: only an operator (mcpvisor ctl, the admin API) may decide calls")
            result = await spec.handler(self, spec.parse(cmd.args, cmd.data))
            reply = Reply(id=cmd.id, ok=True, result=result, exit_code=spec.exit_code(result))
            if cmd.name in operator_changes.AUDITED and self._nursery is not None:
                by = "frontend" if identity == self._frontend_identity else "ctl"
                self._nursery.start_soon(operator_changes.tell_frontend, self, cmd, by)
        except CommandError as exc:
            reply = Reply(id=cmd.id, ok=False, error=_clip(exc.message, 2000), exit_code=exc.exit_code)
        except ConfigError as exc:
            reply = Reply(id=cmd.id, ok=False, error=_clip(str(exc), 2000), exit_code=EXIT_USAGE)
        # A bug in one command must not end the service: it is logged with its traceback, and
        # the operator gets an answer instead of a dead daemon.
        except Exception as exc:
            log.exception("command %s failed", _clip(cmd.name))
            error = f"{cmd.name}: internal error ({type(exc).__name__}); the supervisor's log has the details"
            reply = Reply(id=cmd.id, ok=False, error=_clip(error), exit_code=EXIT_ERROR)
        # Kept in the event log; the console shows what happens (state changes), not every question.
        log.info(
            "command %s %s: %s",
            _clip(cmd.name),
            _clip(" ".join(cmd.args)),
            "ok" if reply.ok else reply.error,
            extra={"fields": {"event": "command", "command": _clip(cmd.name), "ok": reply.ok}, "console": False},
        )
        await self._send_reply(sock, identity, reply)

    async def _send_reply(self, sock: ZSocket, identity: bytes, reply: Reply) -> None:
        try:
            frames = codec.control.encode(reply)
        except (TypeError, ValueError, OverflowError) as exc:
            # A result msgpack cannot carry is a bug in its command; the asker still gets an answer.
            log.error("reply to command %d not encodable: %s", reply.id, exc)
            frames = codec.control.encode(
                Reply(id=reply.id, ok=False, error="internal error: the result could not be sent", exit_code=1)
            )
        try:
            await sock.send_multipart([identity, *frames])
        except (zmq.ZMQError, trio.ClosedResourceError) as exc:
            log.debug("control reply not delivered: %s", exc)

    def frontend_state(self) -> str:
        frontend = self.programs.get(FRONTEND)
        return str(frontend.state) if frontend is not None else "not started"

    async def wait_frontend(self, timeout: float = FRONTEND_WAIT) -> bool:
        """Wait (up to `timeout`) for a frontend on its way up; whether it serves."""
        frontend = self.programs.get(FRONTEND)
        on_its_way = (ProcessState.STARTING, ProcessState.BACKOFF, ProcessState.EXITED)
        with trio.move_on_after(timeout):
            while frontend is not None and frontend.wanted and frontend.state in on_its_way:
                await frontend.wait_change()
        return frontend is not None and frontend.state is ProcessState.RUNNING and self._frontend_identity is not None

    async def ask_frontend(
        self, action: Action, name: str = "", tools: list[str] | None = None, *, reason: str = ""
    ) -> OperatorResult:
        """Put an operator's request to the frontend, which holds the approvals; its answer.

        A frontend on its way up (it may already answer /healthz while its first report is under
        way) is waited for, as `ctl login` does, rather than refused."""
        if not await self.wait_frontend():
            raise CommandError(
                f"the frontend is not running ({self.frontend_state()}, see `mcpvisor ctl status`);"
                " try again once it is"
            )
        identity = self._frontend_identity
        if identity is None or self._control is None:
            raise CommandError("the frontend is not running (see `mcpvisor ctl status`); try again once it is")
        request = OperatorRequest(
            id=next(self._operator_ids), action=action, name=name, tools=tools or [], reason=reason
        )
        reply = await self._ask(identity, request, self._operator_replies, OPERATOR_TIMEOUT, "the frontend")
        if reply.error or reply.result is None:
            raise CommandError(reply.error or "the frontend gave no answer", reply.exit_code or EXIT_ERROR)
        return reply.result

    async def _ask(
        self, identity: bytes, request: Any, replies: PendingReplies[int, Any], timeout: float, who: str
    ) -> Any:
        """Send `request` to the process behind `identity` on the control socket; its reply, or CommandError."""
        assert self._control is not None
        with replies.expect(request.id) as slot:
            try:
                await self._control.send_multipart([identity, *codec.control.encode(request)])
            except zmq.ZMQError as exc:
                raise CommandError(f"{who} cannot be reached: {exc.strerror}") from None
            try:
                return await slot.wait(timeout)
            except trio.TooSlowError:
                raise CommandError(f"{who} did not answer within {timeout:g}s") from None

    async def ask_worker(self, program: Program, command: str, data: Any = None, timeout: float = 60.0) -> Any:
        """Send a command to one running worker (an operator's `ctl login`); its result, or CommandError."""
        identity = self._worker_identities.get(program.name)
        alive = program.state in (ProcessState.RUNNING, ProcessState.STARTING)
        if not alive or identity is None or self._control is None:
            raise CommandError(f"{self.display_name(program)}: the worker is not running (see `mcpvisor ctl status`)")
        request = Command(id=next(self._operator_ids), name=command, data=data)
        reply = await self._ask(identity, request, self._worker_replies, timeout, "the worker")
        if not reply.ok:
            raise CommandError(reply.error, reply.exit_code or EXIT_ERROR)
        return reply.result

    # -- names -----------------------------------------------------------------------------------

    def resolve(self, names: list[str], *, allow_all: bool = True) -> list[Program]:
        """`time`, `frontend`, `all` -> programs; CommandError (exit 4) for an unknown name."""
        if not names:
            raise CommandError("name a server, 'frontend' or 'all'", EXIT_UNKNOWN)
        if allow_all and "all" in names:
            return list(self.programs.values())
        found = []
        for name in names:
            program = self.programs.get(name if name == FRONTEND else worker_name(name))
            if program is None:
                if name in self.config.servers:
                    raise CommandError(f"{name}: server is disabled (enable it first)", EXIT_UNKNOWN)
                raise CommandError(f"{name}: no such server", EXIT_UNKNOWN)
            found.append(program)
        return found

    def display_name(self, program: Program) -> str:
        return program.name.removeprefix(WORKER_PREFIX)

    async def stored_logins(self) -> dict[str, float | None]:
        """Every upstream login kept, worker id -> access token expiry: in the shared store, or the data dir.

        A shared store that cannot be reached is a CommandError naming it (never its password).
        """
        if self.shared is None:
            return dict(oauth_store.logins(self.data_dir))
        from mcpvisor.store import oauth_pg
        from mcpvisor.store.state_url import StateStoreError

        try:
            return dict(await trio.to_thread.run_sync(oauth_pg.logins, self.shared.store))
        except StateStoreError as exc:
            raise CommandError(str(exc)) from None

    async def remove_login(self, worker: str) -> bool:
        """Forget a worker's login where it is kept (no worker of it runs here); whether there was one."""
        if self.shared is None:
            return oauth_store.remove(oauth_store.token_path(self.data_dir, worker))
        from mcpvisor.store import oauth_pg
        from mcpvisor.store.state_url import StateStoreError

        try:
            return await trio.to_thread.run_sync(oauth_pg.remove, self.shared.store, worker)
        except StateStoreError as exc:
            raise CommandError(str(exc)) from None

    def status_row(self, program: Program, logins: dict[str, float | None] | None = None) -> dict[str, Any]:
        """One process's status; `logins` (from `stored_logins`) gives a worker's token expiry."""
        report = self.reports.get(program.name)
        row: dict[str, Any] = {
            "name": self.display_name(program),
            "state": str(program.state),
            "description": program.description(),
            "pid": program.pid,
            "uptime": round(time.monotonic() - program.started_at, 1) if program.pid else 0,
            "restarts": max(program.spawns - 1, 0),
        }
        if report is not None and report.spans_dropped:
            row["spans_dropped"] = report.spans_dropped  # telemetry the process could not export
        if program.name.startswith(WORKER_PREFIX):
            row["upstream"] = str(report.upstream_state) if report and report.upstream_state else ""
            row["tools"] = report.tools if report else 0
            # An upstream's error may echo what it was sent; no status line shows a credential.
            row["error"] = redact_secrets(report.error) if report else ""
            row["discoveries"] = report.discoveries if report else 0
            row["connect_seconds"] = report.connect_seconds if report else 0.0
            worker = self.display_name(program)
            config = self.config.servers.get(server_of(worker))
            shared = config is not None and config.oauth is not None and config.oauth.shared
            expires = (logins or {}).get(server_of(worker) if shared else worker)
            if expires is not None:
                row["token_expires"] = round(expires)  # Unix time of the upstream login's access token
        return row

    # -- lifecycle commands ----------------------------------------------------------------------

    def refuse_while_stopping(self) -> None:
        if self.stopping:
            raise CommandError("mcpvisor is stopping: nothing starts any more")

    async def start_programs(self, programs: list[Program]) -> None:
        self.refuse_while_stopping()
        for program in programs:
            program.start()
        async with trio.open_nursery() as nursery:
            for program in programs:
                nursery.start_soon(program.wait_settled)

    async def stop_everything(self) -> None:
        """Stop every process: nothing starts from now on, and it is over within the largest
        `stopwaitsecs` (and the moments SIGKILL takes).

        The frontend goes first, since it finishes the calls in flight, which need their workers;
        each worker follows once the frontend is gone, or at the latest when its own stopwaitsecs
        still fits in that bound.
        """
        self.stopping = True
        self.notifier.send("STOPPING=1")
        programs = list(self.programs.values())
        for program in programs:
            program.halt()  # BACKOFF goes to STOPPED now; nothing restarts
        budget = max((program.policy.stopwaitsecs for program in programs), default=0.0)
        log.info("stopping every process (within %gs)", budget + lifetime.KILL_WAIT)
        started = trio.current_time()
        frontend = self.programs.get(FRONTEND)
        frontend_gone = trio.Event()

        async def stop_frontend() -> None:
            if frontend is not None:
                await self.stop_programs([frontend])
            frontend_gone.set()

        async def stop_worker(program: Program) -> None:
            with trio.move_on_at(started + budget - program.policy.stopwaitsecs):
                await frontend_gone.wait()
            await self.stop_programs([program])

        # Past its bound, something this code did not foresee holds the stop: end it anyway.
        with trio.move_on_after(budget + 2 * lifetime.KILL_WAIT) as bounded:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(stop_frontend)
                for program in programs:
                    if program is not frontend:
                        nursery.start_soon(stop_worker, program)
        if bounded.cancelled_caught:
            late = [
                p.name
                for p in programs
                if p.state not in (ProcessState.STOPPED, ProcessState.EXITED, ProcessState.FATAL)
            ]
            log.error("the stop overran its bound (still %s): SIGKILL to every process", ", ".join(late) or "none")
            self.kill_everything()
        log.info("every process stopped in %.1fs", trio.current_time() - started)

    def kill_everything(self) -> None:
        """SIGKILL every process now (a third stop signal); they are stopped as they exit."""
        self.shutdown_requested.set()
        for program in self.programs.values():
            program.halt()
            if program.kill_now():
                log.warning("%s: SIGKILL to pid %d", program.name, program.pid)
        self.forkserver.close()

    async def stop_programs(self, programs: list[Program]) -> None:
        for program in programs:
            program.stop()
        async with trio.open_nursery() as nursery:
            for program in programs:
                nursery.start_soon(program.wait_stopped)

    # -- config commands -------------------------------------------------------------------------

    def reread(self) -> tuple[Config, ConfigDiff]:
        new = self._with_shared(config_mod.load(self.config_path))
        return new, diff_configs(self.config, new)

    def _with_shared(self, base: Config) -> Config:
        """The config file `base` as this replica runs it: with the shared store's run-time changes over it."""
        return self.shared.overlay(base) if self.shared is not None else base

    async def apply(self, new: Config, diff: ConfigDiff) -> ConfigDiff:
        """Make the running processes match `new`: touch only what the diff names."""
        self.config = new
        await self.on_proposals(self.proposals.prune, new.servers)
        # Tell the frontend first: a disabled or removed server disappears from clients' lists
        # now, not after its worker has finished stopping.
        self.publish_config()
        old_ids = {name.removeprefix(WORKER_PREFIX) for name in self.programs if name.startswith(WORKER_PREFIX)}
        new_ids = set(desired_workers(new))
        touched = set(diff.changed) | set(diff.removed)
        leaving = sorted(w for w in old_ids if w not in new_ids or server_of(w) in touched)
        running = {w for w in old_ids if self.programs[worker_name(w)].want_running}
        # A worker new to a tenant whose workers run starts now: the frontend will not ask again.
        active = {w.rpartition("/")[0] for w in running}
        await self._remove_programs([worker_name(w) for w in leaving])
        arriving = sorted(new_ids - (old_ids - set(leaving)))
        await self.allocate_sandbox_uids(arriving)
        self._start_workers(arriving, running_before=running | {w for w in arriving if w.rpartition("/")[0] in active})
        frontend = self.programs.get(FRONTEND)
        if frontend is not None:
            frontend.launch = self.frontend_launch()
            frontend.policy = frontend_policy(new)
            if diff.settings_changed:
                await self.stop_programs([frontend])
                frontend.start()
        return diff

    async def update(self) -> ConfigDiff:
        """Reread the file and apply it; a broken file changes nothing (ConfigError)."""
        async with self._ops_lock:
            base = config_mod.load(self.config_path)
            policies = load_policies(base, self.config_path)  # a broken policy file changes nothing either
            new = self._with_shared(base)
            self.base = base
            diff = diff_configs(self.config, new)
            policies_changed, self.policies = policies != self.policies, policies
            if diff.empty:
                if policies_changed:
                    self.publish_config()  # the frontend decides with the new policies from now on
                return diff
            return await self.apply(new, diff)

    async def follow_shared(self) -> None:
        """Apply the run-time changes another replica made through the shared store (and any missed)."""
        assert self.shared is not None
        async with self._ops_lock:
            new = await trio.to_thread.run_sync(self.shared.overlay, self.base)
            if new != self.config:
                diff = diff_configs(self.config, new)
                log.info(
                    "shared store: applying run-time changes (added %s, changed %s, removed %s)",
                    diff.added,
                    diff.changed,
                    diff.removed,
                )
                await self.apply(new, diff)

    async def on_proposals(self, call: Callable[..., _T], *args: Any) -> _T:
        """`call(*args)`, a method of `self.proposals`. With a shared store, in a thread: it waits on
        the network (a client's proposal too), which must not hold up the supervisor's loop."""
        if self.shared is None:
            return call(*args)
        async with self._proposals_lock:
            return await trio.to_thread.run_sync(call, *args)

    async def follow_proposals(self) -> None:
        await self.on_proposals(self.proposals.reload)  # type: ignore[attr-defined]

    async def reload(self, new: Config) -> None:
        """Restart every process with `new`."""
        async with self._ops_lock:
            self.policies = load_policies(new, self.config_path)
            await self._remove_programs([name for name in self.programs if name != FRONTEND])
            self.config = new
            await self.on_proposals(self.proposals.prune, new.servers)
            frontend = self.programs[FRONTEND]
            frontend.launch = self.frontend_launch()
            await self.stop_programs([frontend])
            frontend.start()
            self._start_workers(desired_workers(new))
            self.publish_config()

    async def change_server(self, name: str, server: ServerConfig | None, *, tenant: str = "") -> None:
        """Persist one server's new table (None: remove it) and apply it to the running set.

        With `tenant`, a server added is added to that tenant's servers too (its approved proposal).
        """
        async with self._ops_lock:
            new = configstore.with_server(self.config, name, server, tenant=tenant)
            if self.shared is not None:
                from mcpvisor.store.state_url import StateStoreError

                try:
                    await trio.to_thread.run_sync(lambda: self.shared.record_server(name, server, tenant=tenant))
                except StateStoreError as exc:
                    raise CommandError(f"{name}: not changed: {exc}") from None
            else:
                configstore.save_server(self.config_path, new, name, server, was=self.config.servers.get(name))
            await self.apply(new, diff_configs(self.config, new))

    # -- running ---------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        ensure_private_dir(self.run_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        ctx = zmq.Context()
        events_raw = ctx.socket(zmq.PUB)
        events_raw.bind(self.endpoints.events)
        control_raw = ctx.socket(zmq.ROUTER)
        control_raw.bind(self.endpoints.control)
        for endpoint in (self.endpoints.events, self.endpoints.control):
            os.chmod(endpoint.removeprefix("ipc://"), 0o600)
        self._events = ZSocket(events_raw)
        control = self._control = ZSocket(control_raw)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._serve_control, control, nursery)
                nursery.start_soon(self._serve_watchdog)
                nursery.start_soon(self.forkserver.serve)
                nursery.start_soon(self._serve_systemd_watchdog)
                if self.shared is not None:
                    nursery.start_soon(self.shared.serve_watching, self.follow_shared, self.follow_proposals)
                self._add_program(FRONTEND, self.frontend_launch(), frontend_policy(self.config)).start()
                await self.allocate_sandbox_uids(desired_workers(self.config))
                self._start_workers(desired_workers(self.config))
                log.info(
                    "mcpvisor started: %d servers, listening on %s, control at %s",
                    sum(1 for s in self.config.servers.values() if s.enabled),
                    self.config.mcpvisor.listen,
                    self.endpoints.control,
                    extra={"fields": {"event": "started", "pid": os.getpid()}},
                )
                task_status.started()
                await self.shutdown_requested.wait()
                await self.stop_everything()
                nursery.cancel_scope.cancel()
        finally:
            # Whatever is left (a worker whose fork was abandoned, an upstream's daemon that
            # escaped its group) goes with mcpvisor: no process outlives the supervisor.
            for pid in lifetime.kill_strays():
                log.warning("killed pid %d, a process left behind", pid)
            self._events.close()
            self._events = None
            control.close()
            ctx.term()
            self.notifier.close()
            for endpoint in (self.endpoints.events, self.endpoints.control):
                # A stale socket file would make `ctl` wait for an answer instead of failing at once.
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(endpoint.removeprefix("ipc://"))


async def serve(
    config: Config, config_path: Path, shared: SharedState | None = None, run_dir: Path | None = None
) -> int:
    """Run the supervisor until SIGTERM/SIGINT or `ctl shutdown`; SIGHUP applies the config file.

    With `shared`, `config` is the file; the shared store's run-time changes are applied over it.
    A second SIGTERM/SIGINT during the stop changes nothing; a third SIGKILLs every process.
    Returns the exit status: 1 when the frontend cannot listen at start-up.
    """
    base = config
    if shared is not None:
        config = await trio.to_thread.run_sync(shared.overlay, base)
    supervisor = Supervisor(config, config_path, shared=shared, base=base, run_dir=run_dir)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async with telemetry.running("supervisor"), trio.open_nursery() as nursery:

            async def handle_signals() -> None:
                extra = 0  # stop signals after the stop began
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if signum == signal.SIGHUP:
                        if supervisor.stopping:
                            log.info("received SIGHUP while stopping: ignored")
                            continue
                        log.info("received SIGHUP: rereading %s", supervisor.config_path)
                        nursery.start_soon(_update_on_hup, supervisor)
                    elif not supervisor.shutdown_requested.is_set():
                        log.info("received %s: stopping", name)
                        supervisor.shutdown_requested.set()
                    elif (extra := extra + 1) == 1:
                        log.warning(
                            "received %s: already stopping (one more and every process is killed at once)", name
                        )
                    else:
                        log.warning("received %s again: SIGKILL to every process now", name)
                        supervisor.kill_everything()

            nursery.start_soon(handle_signals)
            await supervisor.run()
            nursery.cancel_scope.cancel()
    return supervisor.exit_code


async def _update_on_hup(supervisor: Supervisor) -> None:
    try:
        diff = await supervisor.update()
    except ConfigError as exc:
        log.error("SIGHUP: config not reloaded, the running config stays: %s", exc)
        return
    log.info("SIGHUP: added %s, changed %s, removed %s", diff.added, diff.changed, diff.removed)
