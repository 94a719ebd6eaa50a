"""One supervised process: spawn, watch, stop, restart, with supervisord's states.

Every state change goes through `Program._set_state`, the one place that records it and emits
the event, as supervisord's `change_state` does. The loop does no I/O of its own: processes come
from a `Spawner` and are watched through the `ChildProcess` it returns, and every delay is a trio
timer, so tests drive the real loop with trio's mock clock.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import trio

from mcpvisor.runtime import lifetime
from mcpvisor.runtime.logs import RotatingFile, pump
from mcpvisor.supervisor import process_spans
from mcpvisor.supervisor.policy import FlapDetector, backoff_delay, format_uptime, should_restart
from mcpvisor.wire.config import Policy
from mcpvisor.wire.states import ProcessState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Launch:
    """How to exec one process."""

    argv: list[str]
    env: dict[str, str]
    log_path: Path


class ChildProcess(Protocol):
    """What the lifecycle loop needs of a running process (`lifetime.Child` is one)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    @property
    def output(self) -> trio.abc.ReceiveStream | None: ...

    async def wait(self) -> int: ...

    def send_signal_to_group(self, signum: int) -> bool: ...


class Spawner(Protocol):
    """Starts a process for a `Launch`; raises OSError when it cannot."""

    async def spawn(self, launch: Launch) -> ChildProcess: ...


class ExecSpawner:
    """Fork/exec each process from the supervisor, as a child that dies with it."""

    async def spawn(self, launch: Launch) -> ChildProcess:
        env = {**launch.env, "MCPVISOR_PARENT_PID": str(os.getpid())}
        child = lifetime.spawn(launch.argv, env=env, capture_output=True)
        await trio.lowlevel.checkpoint()
        return child


class Program:
    """A process the supervisor keeps running according to its policy."""

    def __init__(
        self,
        name: str,
        launch: Launch,
        policy: Policy,
        on_state: Callable[[Program], None],
        *,
        needs_report: bool = False,
        spawner: Spawner | None = None,
    ) -> None:
        self.name = name
        self.launch = launch
        self.policy = policy
        self._on_state = on_state
        self._spawner = spawner or ExecSpawner()
        self.state = ProcessState.STOPPED
        self.process: ChildProcess | None = None
        self.started_at = 0.0
        self.stopped_at = 0.0
        self.exit_code: int | None = None
        self.retries = 0
        self.spawns = 0  # every start, by policy or by an operator; the first is not a restart
        self.spawn_error = ""
        self.want_running = False
        self.idle = False  # stopped for want of use; starts again on the next (a tenant's workers)
        self.needs_report = needs_report  # RUNNING only once the process says it is up
        self.ready = trio.Event()  # set by whoever knows the process is fully up
        self._wake = trio.Event()
        self._flaps = FlapDetector(policy.flap_window, policy.flap_count)
        self._stopped = trio.Event()
        self._settled = trio.Event()
        self._scope = trio.CancelScope()
        self._log = RotatingFile(launch.log_path)
        self._pumps: trio.Nursery | None = None

    # -- commands --------------------------------------------------------------------------------

    def start(self) -> None:
        """Ask for the process to run; leaves FATAL (supervisord: only an explicit start does)."""
        if self.state is ProcessState.FATAL:
            self.retries = 0
            self._set_state(ProcessState.STOPPED)
        self.want_running = True
        self._poke()

    def stop(self) -> None:
        self.want_running = False
        self._poke()

    def _poke(self) -> None:
        self._wake.set()

    def kill_hung(self) -> None:
        """SIGKILL a process that stopped answering; the lifecycle loop sees it exit and restarts it."""
        if self.process is not None and self.process.returncode is None:
            self.spawn_error = "killed: it stopped reporting (hung)"
            self.process.send_signal_to_group(signal.SIGKILL)

    def retire(self) -> None:
        """End the lifecycle loop for good (the server was removed or replaced)."""
        self._scope.cancel()

    async def wait_settled(self, timeout: float = 60.0) -> None:
        """After start(): wait until it is RUNNING, or has failed to get there."""
        with trio.move_on_after(self.policy.startsecs + timeout):
            while self.want_running and self.state not in (ProcessState.RUNNING, ProcessState.FATAL):
                await self._settled.wait()
                self._settled = trio.Event()

    async def wait_stopped(self) -> None:
        while self.state not in (ProcessState.STOPPED, ProcessState.FATAL, ProcessState.EXITED) or self.want_running:
            await self._stopped.wait()
            self._stopped = trio.Event()

    # -- state -----------------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        return self.process.pid if self.process is not None and self.process.returncode is None else 0

    def _set_state(self, state: ProcessState) -> None:
        if state is self.state:
            return
        log.info(
            "%s: %s -> %s",
            self.name,
            self.state,
            state,
            extra={"fields": {"event": "state", "name": self.name, "from": str(self.state), "to": str(state)}},
        )
        process_spans.changed(self, state)
        self.state = state
        if state in (ProcessState.STOPPED, ProcessState.FATAL, ProcessState.EXITED):
            self._stopped.set()
        self._settled.set()
        self._on_state(self)

    def description(self, now: float | None = None) -> str:
        """supervisord's status description: `pid 4121, uptime 0:12:03`, `Exited too quickly`, ..."""
        now = time.monotonic() if now is None else now
        match self.state:
            case ProcessState.RUNNING:
                return f"pid {self.pid}, uptime {format_uptime(now - self.started_at)}"
            case ProcessState.STARTING:
                return f"pid {self.pid}" if self.pid else ""
            case ProcessState.BACKOFF:
                return self.spawn_error or "Exited too quickly (process log may have details)"
            case ProcessState.FATAL:
                return self.spawn_error or "Exited too quickly (process log may have details)"
            case ProcessState.EXITED:
                return f"exit status {self.exit_code}"
            case ProcessState.STOPPED:
                if self.idle:
                    return "idle: starts on its next use"
                return "Not started" if not self.stopped_at else "stopped"
            case _:
                return ""

    # -- the lifecycle loop ----------------------------------------------------------------------

    async def serve(self) -> None:
        """Run forever: start when wanted, restart by policy, stop when asked."""
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    self._pumps = nursery
                    while True:
                        if not self.want_running:
                            await self._wait_wake()
                            continue
                        await self._run_once()
        finally:
            with trio.CancelScope(shield=True):
                await self._terminate()
            self._log.close()

    async def _wait_wake(self, timeout: float = float("inf")) -> bool:
        """Sleep until poked or `timeout`; True when poked."""
        with trio.move_on_after(timeout):
            await self._wake.wait()
            self._wake = trio.Event()
            return True
        return False

    async def _run_once(self) -> None:
        self._wake = trio.Event()  # the poke that brought us here is acted upon now
        self.spawn_error = ""
        self._set_state(ProcessState.STARTING)
        self.ready = trio.Event()
        if not self.needs_report:
            self.ready.set()
        try:
            self.process = await self._spawn()
        except OSError as exc:
            self.spawn_error = f"spawn error: {exc.strerror or exc}"
            log.error("%s: %s", self.name, self.spawn_error)
            await self._after_early_exit()
            return
        self.started_at = time.monotonic()
        self.spawns += 1
        self._on_state(self)  # the pid is known now
        outcome = await self._watch(up_at=trio.current_time() + self.policy.startsecs)
        if outcome == "up":
            self._set_state(ProcessState.RUNNING)
            self.retries = 0
            outcome = await self._watch(up_at=None)
        if outcome == "stop":
            await self._stop_process()
        elif self.state is ProcessState.RUNNING:
            await self._after_exit()
        else:
            await self._after_early_exit()

    async def _spawn(self) -> ChildProcess:
        child = await self._spawner.spawn(self.launch)
        assert self._pumps is not None
        if child.output is not None:
            # The pump ends by itself when the child and everything that inherited its output exit.
            self._pumps.start_soon(pump, child.output, self._log)
        return child

    async def _watch(self, *, up_at: float | None) -> str:
        """Wait for the first of: "exit", "stop" (requested), or "up" (past `up_at` and ready)."""
        process = self.process
        assert process is not None
        outcome = ""
        async with trio.open_nursery() as nursery:

            def finish(what: str) -> None:
                nonlocal outcome
                outcome = outcome or what
                nursery.cancel_scope.cancel()

            async def on_exit() -> None:
                await process.wait()
                finish("exit")

            async def on_stop() -> None:
                while self.want_running:
                    await self._wake.wait()
                    self._wake = trio.Event()
                finish("stop")

            async def on_up(deadline: float) -> None:
                await trio.sleep_until(deadline)
                await self.ready.wait()
                finish("up")

            nursery.start_soon(on_exit)
            nursery.start_soon(on_stop)
            if up_at is not None:
                nursery.start_soon(on_up, up_at)
        return outcome

    async def _after_early_exit(self) -> None:
        """It died before `startsecs`: BACKOFF and retry, or FATAL after the last retry."""
        self.exit_code = self.process.returncode if self.process is not None else None
        self.retries += 1
        if self.retries > self.policy.startretries:
            self.want_running = False
            self._set_state(ProcessState.FATAL)
            log.error("%s: gave up after %d start attempts", self.name, self.retries)
            return
        self._set_state(ProcessState.BACKOFF)
        delay = backoff_delay(self.retries, self.policy.backoff_max)
        await self._wait_wake(delay)

    async def _after_exit(self) -> None:
        """It died after it was RUNNING: EXITED, then restart by `autorestart`, slowed if flapping."""
        assert self.process is not None
        self.exit_code = self.process.returncode
        self.stopped_at = time.monotonic()
        self._set_state(ProcessState.EXITED)
        if not should_restart(self.policy.autorestart, self.exit_code, self.policy.exitcodes):
            self.want_running = False
            return
        if self._flaps.record_exit(trio.current_time()):
            self.retries += 1
            self.spawn_error = f"flapping: {self.policy.flap_count} exits within {self.policy.flap_window:g}s"
            self._set_state(ProcessState.BACKOFF)
            await self._wait_wake(backoff_delay(self.retries, self.policy.backoff_max))

    async def _stop_process(self) -> None:
        self._set_state(ProcessState.STOPPING)
        await self._terminate()
        self.stopped_at = time.monotonic()
        self._set_state(ProcessState.STOPPED)

    async def _terminate(self) -> None:
        """stopsignal to the process group, `stopwaitsecs`, then SIGKILL to the group."""
        process = self.process
        if process is None or process.returncode is not None:
            return
        sig = getattr(signal, f"SIG{self.policy.stopsignal}")
        for signum, wait in ((sig, self.policy.stopwaitsecs), (signal.SIGKILL, 5.0)):
            if not process.send_signal_to_group(signum):
                break
            with trio.move_on_after(wait):
                await process.wait()
            if process.returncode is not None:
                break
        self.exit_code = process.returncode
