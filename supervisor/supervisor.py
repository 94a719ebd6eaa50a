"""The supervisor: owns the config, spawns the frontend and one worker per server, keeps them up."""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

import trio
import zmq

from mcpvisor.frontend import spec as frontend_spec
from mcpvisor.supervisor import config as config_mod
from mcpvisor.supervisor.config import Config, Policy
from mcpvisor.supervisor.process import Launch, Program
from mcpvisor.wire import codec
from mcpvisor.wire.endpoints import Endpoints, ensure_private_dir, runtime_dir
from mcpvisor.wire.messages import ProcessEvent
from mcpvisor.wire.zsocket import ZSocket
from mcpvisor.workers import spec as worker_spec

log = logging.getLogger("mcpvisor.supervisor")

FRONTEND = "frontend"
WORKER_PREFIX = "worker:"


def worker_name(server: str) -> str:
    return f"{WORKER_PREFIX}{server}"


class Supervisor:
    """The process table, the event socket and the control socket."""

    def __init__(self, config: Config, config_path: Path) -> None:
        self.config = config
        self.config_path = config_path.resolve()
        self.data_dir = config_mod.data_dir(config, self.config_path)
        self.log_dir = self.data_dir / "logs"
        self.run_dir = runtime_dir(self.data_dir)
        self.endpoints = Endpoints.in_dir(self.run_dir)
        self.programs: dict[str, Program] = {}
        self._events: ZSocket | None = None
        self._nursery: trio.Nursery | None = None
        self.shutdown_requested = trio.Event()

    # -- programs --------------------------------------------------------------------------------

    def _base_env(self) -> dict[str, str]:
        return dict(os.environ)

    def frontend_launch(self) -> Launch:
        spec = frontend_spec.FrontendSpec(
            settings=self.config.mcpvisor,
            servers=self.config.servers,
            calls_endpoint=self.endpoints.calls,
            control_endpoint=self.endpoints.control,
            events_endpoint=self.endpoints.events,
            config_path=str(self.config_path),
        )
        env = self._base_env() | {frontend_spec.ENV_VAR: frontend_spec.encode(spec)}
        return Launch([sys.executable, "-m", "mcpvisor.frontend"], env, self.log_dir / "frontend.log")

    def worker_launch(self, server: str) -> Launch:
        spec = worker_spec.WorkerSpec(
            id=server,
            server=self.config.servers[server],
            calls_endpoint=self.endpoints.calls,
            log_dir=str(self.log_dir),
            call_timeout=self.config.mcpvisor.call_timeout,
            log_level=self.config.mcpvisor.log_level,
        )
        env = self._base_env() | {worker_spec.ENV_VAR: worker_spec.encode(spec)}
        return Launch([sys.executable, "-m", "mcpvisor.workers"], env, self.log_dir / f"{server}.worker.log")

    def _add_program(self, name: str, launch: Launch, policy: Policy) -> Program:
        program = Program(name, launch, policy, self._emit)
        self.programs[name] = program
        assert self._nursery is not None
        self._nursery.start_soon(program.serve)
        return program

    def _emit(self, program: Program) -> None:
        """Publish a state change on the event socket: topic `process.<name>.<state>`."""
        if self._events is None:
            return
        event = ProcessEvent(name=program.name, state=program.state, pid=program.pid, description=program.description())
        topic = f"process.{program.name}.{program.state.lower()}".encode()
        try:
            self._events.send_multipart_nowait([topic, *codec.events.encode(event)])
        except (zmq.ZMQError, trio.ClosedResourceError) as exc:
            log.debug("event not published: %s", exc)

    # -- running ---------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        ensure_private_dir(self.run_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        ctx = zmq.Context()
        events_raw = ctx.socket(zmq.PUB)
        events_raw.bind(self.endpoints.events)
        self._events = ZSocket(events_raw)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                frontend = self._add_program(FRONTEND, self.frontend_launch(), Policy())
                frontend.start()
                for name, server in self.config.servers.items():
                    if server.enabled:
                        self._add_program(worker_name(name), self.worker_launch(name), server.policy).start()
                log.info(
                    "mcpvisor started: %d servers, listening on %s",
                    len(self.programs) - 1,
                    self.config.mcpvisor.listen,
                )
                task_status.started()
                await self.shutdown_requested.wait()
                await self.stop_all()
                nursery.cancel_scope.cancel()
        finally:
            self._events.close()
            self._events = None
            ctx.term()

    async def stop_all(self) -> None:
        """Stop every process at once, each with its own stopwaitsecs."""
        for program in self.programs.values():
            program.stop()
        async with trio.open_nursery() as nursery:
            for program in self.programs.values():
                nursery.start_soon(program.wait_stopped)


async def serve(config: Config, config_path: Path) -> None:
    supervisor = Supervisor(config, config_path)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(supervisor.run)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("received %s: stopping", signal.Signals(signum).name)
                supervisor.shutdown_requested.set()
                break
