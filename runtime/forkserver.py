"""Workers forked from a template process instead of exec'd: the supervisor's side.

Starting a worker by exec costs an interpreter and the import of its modules (the MCP SDK alone
takes over a second), and every worker then holds its own copy of them. The forkserver
(`python -m mcpvisor.workers.forkserver`) is exec'd once, imports all that, freezes its heap and
then forks workers on request, which share those pages copy-on-write.

The supervisor still owns each worker's life. The forkserver double-forks: the intermediate exits
at once, so the worker is re-parented to the nearest subreaper, the supervisor (see
`lifetime.become_subreaper`). The supervisor then collects its exit status and signals its process
group like any child's, and the worker asks for SIGKILL when the supervisor dies, as an exec'd
worker does; a crash of the forkserver itself leaves running workers alone.

If the forkserver cannot be started or stops answering, it is restarted once per request and
then the worker is exec'd as before: a worker always starts, the fork is only the fast way.
"""

from __future__ import annotations

import array
import logging
import math
import os
import signal
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

import msgspec
import trio

from mcpvisor.runtime import lifetime

log = logging.getLogger(__name__)

FD_VAR = "MCPVISOR_FORKSERVER_FD"
DISABLE_VAR = "MCPVISOR_FORKSERVER"  # "0": exec every worker (to compare, or to debug)
READY = b"ready"
MAX_MESSAGE = 4 * 1024 * 1024
START_TIMEOUT = 60.0  # importing the SDK on a loaded two-core machine takes seconds
REPLY_TIMEOUT = 10.0
RETRY_AFTER = 60.0


class ForkRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Fork one worker with this environment; its output goes to the descriptor sent alongside."""

    env: dict[str, str]


class ForkReply(msgspec.Struct, frozen=True, kw_only=True):
    pid: int = 0
    error: str = ""


request_codec = msgspec.json.Decoder(ForkRequest)
reply_codec = msgspec.json.Decoder(ForkReply)
encode = msgspec.json.encode


class ForkServerError(Exception):
    """The forkserver could not be started or did not fork."""


class Launchable(Protocol):
    """What a fork needs of the supervisor's launch description."""

    @property
    def argv(self) -> list[str]: ...

    @property
    def env(self) -> dict[str, str]: ...


def enabled() -> bool:
    return sys.platform == "linux" and os.environ.get(DISABLE_VAR, "1") != "0"


class ForkServer:
    """Spawns workers by asking the template process to fork them; exec is the fallback."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> None:
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = log_path
        self.process: lifetime.Child | None = None
        self.starts = 0  # how many template processes were started (observable in tests)
        self._sock: trio.socket.SocketType | None = None
        self._lock = trio.Lock()
        self._exec_until = -math.inf
        self._retired: list[lifetime.Child] = []  # killed template processes not collected yet

    @property
    def pid(self) -> int:
        process = self.process
        return process.pid if process is not None and process.returncode is None else 0

    async def spawn(self, launch: Launchable) -> lifetime.Child:
        """A running worker for `launch`: forked when the forkserver works, else exec'd."""
        env = {**launch.env, "MCPVISOR_PARENT_PID": str(os.getpid())}
        if enabled() and trio.current_time() >= self._exec_until:
            async with self._lock:
                for attempt in (1, 2):
                    try:
                        return await self._fork(env)
                    except ForkServerError as exc:
                        log.warning("forkserver: %s (attempt %d)", exc, attempt)
                        self.close()
                # Do not make every worker wait for a template that keeps failing.
                self._exec_until = trio.current_time() + RETRY_AFTER
                log.error("forkserver unusable: workers are exec'd for the next %gs", RETRY_AFTER)
        await trio.lowlevel.checkpoint()  # before the fork: a cancel after it would lose the child
        return lifetime.spawn(launch.argv, env=env, capture_output=True)

    async def _fork(self, env: dict[str, str]) -> lifetime.Child:
        if self._sock is None or self.process is None or self.process.returncode is not None:
            await self._start()
        sock = self._sock
        assert sock is not None
        read_end, write_end = os.pipe()
        try:
            with lifetime.adopting():
                try:
                    fds = array.array("i", [write_end]).tobytes()
                    await sock.sendmsg([encode(ForkRequest(env=env))], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
                    os.close(write_end)
                    write_end = -1
                    data = b""
                    try:
                        with trio.move_on_after(REPLY_TIMEOUT) as waited:
                            data = await sock.recv(MAX_MESSAGE)
                    except trio.Cancelled:
                        # Abandoned (a stop during the spawn): its answer must not be taken for the
                        # next request's, and a worker it may have forked is killed as a stray.
                        self.close()
                        raise
                    if waited.cancelled_caught:
                        raise ForkServerError(f"no answer within {REPLY_TIMEOUT:g}s")
                    if not data:
                        raise ForkServerError("it closed its socket")
                except OSError as exc:
                    raise ForkServerError(f"cannot reach it: {exc.strerror or exc}") from None
                try:
                    reply = reply_codec.decode(data)
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    raise ForkServerError(f"undecodable answer: {exc}") from None
                if reply.error or reply.pid <= 0:
                    raise ForkServerError(reply.error or "no pid in its answer")
                child = lifetime.Child.adopt(reply.pid, output=trio.lowlevel.FdStream(read_end))
                read_end = -1
                return child
        finally:
            for fd in (read_end, write_end):
                if fd >= 0:
                    os.close(fd)

    async def _start(self) -> None:
        self.close()
        lifetime.become_subreaper()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**self.env, "MCPVISOR_PARENT_PID": str(os.getpid()), FD_VAR: str(theirs.fileno())}
        try:
            # Created 0600 like every log mcpvisor writes (runtime/logs.py).
            with open(os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab") as output:
                self.process = lifetime.spawn(self.argv, env=env, output=output, pass_fds=(theirs.fileno(),))
        except OSError as exc:
            ours.close()
            raise ForkServerError(f"cannot start it: {exc.strerror or exc}") from None
        finally:
            theirs.close()
        self.starts += 1
        self._sock = trio.socket.from_stdlib_socket(ours)
        with trio.move_on_after(START_TIMEOUT):
            hello = await self._sock.recv(64)
            if hello == READY:
                log.info("forkserver started: pid %d", self.process.pid)
                return
            raise ForkServerError(f"it exited while starting (status {await self.process.wait()})")
        raise ForkServerError(f"not ready within {START_TIMEOUT:g}s")

    def close(self) -> None:
        """Stop the template process; workers it forked are the supervisor's and run on."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self.process is not None:
            if self.process.returncode is None:
                self.process.send_signal_to_group(signal.SIGKILL)
                self._retired.append(self.process)
            self.process = None

    async def serve(self) -> None:
        """Reap what the supervisor inherits as a subreaper; stop the template on the way out."""
        try:
            while True:
                await trio.sleep(1.0)
                lifetime.reap_orphans()
                self.kill_abandoned()
                self._retired = [process for process in self._retired if process.returncode is None]
        finally:
            self.close()

    def kill_abandoned(self) -> list[int]:
        """Kill the workers forked for a spawn that was abandoned (no Child owns them); their pids.

        A forked worker runs the template's code without exec, so its command line is the
        template's: that tells it from any other process the supervisor inherited.
        """
        killed = []
        for pid in lifetime.strays():
            if lifetime.command_line(pid) == self.argv and lifetime.kill_stray(pid):
                log.warning("forkserver: killed worker pid %d, forked for a start that was abandoned", pid)
                killed.append(pid)
        return killed
