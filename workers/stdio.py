"""The stdio transport to an upstream: a child process that cannot outlive its worker.

The SDK's own stdio client starts the server in a new session and leaves it running if the worker
is killed; this one has the kernel SIGKILL the upstream when the worker dies (see runtime.lifetime),
puts it in its own process group so the whole tree can be stopped, and sends its stderr to a log
file instead of the terminal.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import logging
import os
import select
import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio
import mcp_types as types
import msgspec
import trio
from mcp.shared.message import SessionMessage

from mcpvisor.runtime import bwrap, lifetime
from mcpvisor.runtime.commands import child_environment, find_program
from mcpvisor.runtime.logs import RotatingFile, pump
from mcpvisor.wire.sandboxing import SandboxPlan
from mcpvisor.workers import confine
from mcpvisor.workers.limits import (
    FIX_NO_CGROUP,
    CgroupLimits,
    Watchdog,
    join_cgroups,
    open_cgroup,
    reserve_problem,
)
from mcpvisor.workers.lines import LineReader, Oversized

log = logging.getLogger(__name__)

DEFAULT_MAX_RESULT = 64 * 1024 * 1024  # [mcpvisor] max_result_bytes
_ENVELOPE_ROOM = 64 * 1024  # what a line holds beside its result: jsonrpc, id, ...
TOO_LARGE = -32000  # the JSON-RPC code of an answer over max_result_bytes
_COPY_BELOW = 1024 * 1024  # a smaller result is copied out of its line: a view would keep the line
# Reads start small (a pipe holds 64 KiB); on the first one that comes back full the pipe is
# widened and reads grow: a large answer is read in large pieces, a short one pays for no large
# buffer.
_READ_SIZE = 65536
_READ_SIZE_MAX = 1024 * 1024
_STDIN_GRACE = 2.0
_TERM_GRACE = 2.0
_STDERR_DRAIN = 1.0
# A pipe takes a write of at most this many bytes whole or not at all: such a line needs no lock.
_ATOMIC_WRITE = select.PIPE_BUF


class UpstreamProcessError(Exception):
    """The upstream command could not be started."""


class _Envelope(msgspec.Struct):
    """Just enough of a JSON-RPC message to tell a pass-through reply from the rest."""

    id: int | str | None = None
    method: str | None = None
    result: msgspec.Raw = msgspec.Raw()  # empty when absent (Raw cannot be in a union)
    error: dict[str, Any] | None = None
    params: msgspec.Raw = msgspec.Raw()


# Notifications the worker forwards to the frontend as they are, without the SDK session.
FORWARDED_NOTIFICATIONS = frozenset(
    {"notifications/progress", "notifications/message", "notifications/resources/updated"}
)
NotificationHandler = Callable[[str, bytes], Awaitable[None]]


_envelope = msgspec.json.Decoder(_Envelope)
_RAW_ID_PREFIX = "mcpvisor-"


class RawError(Exception):
    """The upstream answered a pass-through request with a JSON-RPC error."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# Takes a pass-through request's outcome, from the task that reads the upstream's stdout.
# A result is bytes, or for a large one a view of the line it came in (bytes-like, never decoded
# here: it is forwarded as it is).
Result = bytes | memoryview
OutcomeHandler = Callable[[Result | RawError], None]


class StdioChannel:
    """The pipes to one upstream, shared by the SDK session and the pass-through path.

    Forwarded requests skip the SDK: their params go out as the JSON bytes the frontend sent and
    their result comes back as the bytes the upstream wrote. They use string ids with a prefix of
    their own, which never collide with the session's integer ids.
    """

    def __init__(self, process: lifetime.Child, max_result: int = DEFAULT_MAX_RESULT) -> None:
        self.process = process
        self.max_result = max_result
        self.bytes_read = 0  # everything the upstream wrote on stdout: its activity
        self._write_lock = trio.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[str, OutcomeHandler] = {}
        self.closed = False
        self.on_notification: NotificationHandler | None = None
        self.nursery: trio.Nursery | None = None  # for the writes that cannot be done at once
        self.ended_by = ""  # why the process was killed, when its sandbox's limits did it

    def try_write(self, data: bytes) -> bool:
        """Write a short line now if no other write is under way and the pipe has room for it.

        A pipe takes a write of at most PIPE_BUF bytes whole or not at all, so False leaves
        nothing behind: the caller can still send the line by `write_line`, which reports errors.
        """
        if len(data) > _ATOMIC_WRITE or self._write_lock.locked() or self.process.stdin is None:
            return False
        try:
            os.write(self.process.stdin.fileno(), data)
        except OSError:
            return False
        return True

    async def write_line(self, data: bytes) -> None:
        """Write one whole line; lines from concurrent writers never interleave.

        When no other write is under way, the line goes straight to the non-blocking pipe: a
        line the pipe takes whole costs one write call and no trip through the scheduler. What
        the pipe does not take is sent, holding the lock, by the stream's own send_all.
        """
        stdin = self.process.stdin
        assert stdin is not None
        lock = self._write_lock
        if lock.locked():
            async with lock:
                await stdin.send_all(data)
            return
        try:
            sent = os.write(stdin.fileno(), data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            # As the stream's send_all reports them: a closed fd, or a broken pipe.
            if exc.errno == errno.EBADF:
                raise trio.ClosedResourceError("file was already closed") from None
            raise trio.BrokenResourceError from exc
        if sent == len(data):
            return
        lock.acquire_nowait()  # nothing ran since locked() said it is free
        try:
            await stdin.send_all(memoryview(data)[sent:])
        finally:
            lock.release()

    async def request(self, method: str, params: bytes | None) -> Result:
        """Send one request as raw JSON and wait for the raw JSON result."""
        if self.closed:
            raise trio.BrokenResourceError("the upstream's stdout is closed")
        request_id = f"{_RAW_ID_PREFIX}{next(self._ids)}"
        done = trio.Event()
        slot: list[Result | RawError] = []

        def deliver(outcome: Result | RawError) -> None:
            slot.append(outcome)
            done.set()

        self._pending[request_id] = deliver
        try:
            await self.write_line(_request_line(request_id, method, params))
            await done.wait()
        except trio.Cancelled:
            if not done.is_set():
                with trio.CancelScope(shield=True), contextlib.suppress(trio.BrokenResourceError, OSError):
                    await self.write_line(_cancel_note(request_id))
            raise
        finally:
            self._pending.pop(request_id, None)
        outcome = slot[0]
        if isinstance(outcome, RawError):
            raise outcome
        return outcome

    def send_request(self, method: str, params: bytes | None, on_outcome: OutcomeHandler) -> str | None:
        """Start a request without a task to wait for it: its outcome goes to `on_outcome`.

        The line is written only if `try_write` can do it at once; None means nothing was sent
        and the caller should use `request`. Otherwise the id is returned, for `abandon`.
        `on_outcome` runs in the task that reads stdout (or the one that closes the channel), so
        it must not block.
        """
        if self.closed:
            return None
        request_id = f"{_RAW_ID_PREFIX}{next(self._ids)}"
        if not self.try_write(_request_line(request_id, method, params)):
            return None
        self._pending[request_id] = on_outcome
        return request_id

    def abandon(self, request_id: str) -> None:
        """Give up on a request started by `send_request`, telling the upstream, as `request` does
        when cancelled; an answer that comes later is dropped."""
        if self._pending.pop(request_id, None) is None:
            return  # answered already
        note = _cancel_note(request_id)
        if self.closed or self.try_write(note) or self.nursery is None:
            return
        with contextlib.suppress(RuntimeError):  # the nursery is closing: so is the channel
            self.nursery.start_soon(self._write_quietly, note)

    async def _write_quietly(self, data: bytes) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            await self.write_line(data)

    def take_reply(self, envelope: _Envelope) -> bool:
        """Deliver a pass-through reply; False when the message is the session's."""
        if not (isinstance(envelope.id, str) and envelope.id.startswith(_RAW_ID_PREFIX)) or envelope.method:
            return False
        deliver = self._pending.pop(envelope.id, None)
        if deliver is not None:
            if envelope.error is not None:
                deliver(RawError(int(envelope.error.get("code", -32603)), str(envelope.error.get("message", ""))))
            elif len(envelope.result) > self.max_result:
                deliver(RawError(TOO_LARGE, self.too_large(len(envelope.result), "result")))
            elif len(envelope.result) > _COPY_BELOW:
                # A large result goes on as a view of the line it came in (which it keeps alive):
                # one copy less of it in the worker. ZeroMQ sends a buffer that large without
                # copying it either.
                deliver(memoryview(envelope.result))
            else:
                deliver(bytes(envelope.result) if len(envelope.result) else b"{}")
        return True

    def too_large(self, size: int, what: str) -> str:
        return f"the upstream's {what} is {size:,} bytes, over the limit of {self.max_result:,} (max_result_bytes)"

    def take_oversized(self, line: Oversized) -> bool:
        """Fail the pass-through request an answer too large to keep was for; False if it is not one."""
        request_id = line.request_id
        if not (isinstance(request_id, str) and request_id.startswith(_RAW_ID_PREFIX)):
            return False
        deliver = self._pending.pop(request_id, None)
        if deliver is not None:
            deliver(RawError(TOO_LARGE, self.too_large(line.size, "answer")))
        return True

    def close(self) -> None:
        """The upstream went away: fail every pass-through request in flight."""
        self.closed = True
        pending, self._pending = self._pending, {}
        for deliver in pending.values():
            deliver(RawError(-32000, self.ended_by or "the upstream closed the connection"))


def _request_line(request_id: str, method: str, params: bytes | None) -> bytes:
    line = b'{"jsonrpc":"2.0","id":"' + request_id.encode() + b'","method":' + msgspec.json.encode(method)
    return line + (b',"params":' + params if params else b"") + b"}\n"


def _cancel_note(request_id: str) -> bytes:
    note = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": request_id}}
    return msgspec.json.encode(note) + b"\n"


@asynccontextmanager
async def open_stdio_upstream(
    command: str,
    args: list[str],
    env: Mapping[str, str],
    cwd: str | None,
    stderr_log: RotatingFile,
    sandbox: SandboxPlan | None = None,
    worker_id: str = "",
    max_result: int = DEFAULT_MAX_RESULT,
) -> AsyncIterator[tuple[anyio.abc.ObjectReceiveStream, anyio.abc.ObjectSendStream, StdioChannel]]:
    """Start the upstream and yield (read_stream, write_stream) for a ClientSession, and the channel.

    An answer over `max_result` bytes fails its request with an error naming both sizes; the
    upstream lives on. With `sandbox`, `env` is the configured environment alone: the process runs in bubblewrap,
    in its own cgroup when one is writable (else watched for memory), and never unconfined.
    """
    search_path = env.get("PATH") if sandbox is None else child_environment({}).get("PATH")
    executable = find_program(command, search_path)
    argv, run_env, run_cwd = [executable, *args], dict(env), cwd
    limits: CgroupLimits | None = None
    watchdog: Watchdog | None = None
    confined: confine.Confined | None = None
    if sandbox is not None:
        try:
            problem = await trio.to_thread.run_sync(bwrap.probe)
            if problem is not None:
                raise confine.SandboxError(problem)
            limits = open_cgroup(sandbox, worker_id) if sandbox.limits != "watchdog" else None
            if (limits is None or not limits.has_pids) and sandbox.limits == "cgroup":
                raise confine.SandboxError(FIX_NO_CGROUP)
            if (full := reserve_problem(sandbox)) is not None:
                raise confine.SandboxError(full)
            joins = [partial(join_cgroups, list(limits.procs_files))] if limits is not None else []
            confined = confine.confine(sandbox, worker_id, executable, args, env, cwd, before=joins)
        except (confine.SandboxError, OSError) as exc:
            if limits is not None:
                limits.close()
            raise UpstreamProcessError(f"sandbox not built, the upstream is not started: {exc}") from None
        watchdog = Watchdog.for_plan(sandbox, memory=limits is None, quota=confined.quota)
        argv, run_env, run_cwd = confined.argv, confined.env, None
    try:
        process = lifetime.spawn(
            argv,
            env=run_env,
            cwd=run_cwd,
            stdin_pipe=True,
            stdout_pipe=True,
            capture_output=True,
            before_exec=confined.prepare if confined is not None else None,
            pass_fds=confined.pass_fds if confined is not None else (),
        )
    except (OSError, subprocess.SubprocessError) as exc:
        why = (confined.failure() if confined is not None else "") or getattr(exc, "strerror", None) or exc
        if confined is not None:
            confined.close()
        if limits is not None:
            limits.close()
        raise UpstreamProcessError(f"cannot start {command!r}: {why}") from None
    if confined is not None:
        confined.started()
        if watchdog is not None and confined.namespaces is not None and limits is None:
            watchdog.ipc_fd, watchdog.userns_fd = confined.namespaces.ipc, confined.namespaces.ipc_owner
        if confined.outbound is not None:
            try:
                await confined.outbound.start(process.pid, confined.namespaces)
            except confine.SandboxError as exc:
                process.send_signal_to_group(signal.SIGKILL)
                confined.close()
                if limits is not None:
                    limits.close()
                raise UpstreamProcessError(f"sandbox not built, the upstream is not started: {exc}") from None
    await trio.lowlevel.checkpoint()
    channel = StdioChannel(process, max_result)

    def killed_for_memory() -> bool:
        return (limits is not None and limits.oom_kills() > 0) or (watchdog is not None and watchdog.fired)

    memory_note = (
        f"the upstream was killed: its sandbox went over its memory limit ({sandbox.memory_mb} MiB)"
        if sandbox is not None
        else ""
    )

    def death_note() -> str:
        if watchdog is not None and watchdog.reason:
            return f"the upstream was killed: {watchdog.reason}"
        return memory_note

    to_session, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](64)
    write_stream, from_session = anyio.create_memory_object_stream[SessionMessage](64)

    async def refuse(request_id: int | str, message: str) -> None:
        """Answer one of the session's requests with an error in the upstream's stead."""
        error = {"jsonrpc": "2.0", "id": request_id, "error": {"code": TOO_LARGE, "message": message}}
        await to_session.send(SessionMessage(types.jsonrpc_message_adapter.validate_python(error, by_name=False)))

    async def deliver_oversized(line: Oversized) -> None:
        log.warning("upstream answer of %d bytes dropped: over max_result_bytes (%d)", line.size, max_result)
        if channel.take_oversized(line) or line.request_id is None:
            return
        await refuse(line.request_id, channel.too_large(line.size, "answer"))

    async def deliver(line: bytes) -> None:
        try:
            envelope = _envelope.decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError):
            envelope = None
        if envelope is not None and channel.take_reply(envelope):
            return
        if envelope is not None and envelope.id is not None and len(envelope.result) > max_result:
            await refuse(envelope.id, channel.too_large(len(envelope.result), "result"))
            return
        if (
            envelope is not None
            and envelope.id is None
            and envelope.method in FORWARDED_NOTIFICATIONS
            and channel.on_notification is not None
        ):
            await channel.on_notification(envelope.method, bytes(envelope.params) if len(envelope.params) else b"{}")
            return
        try:
            message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        except ValueError as exc:
            # Its text is not shown: what an upstream writes may be a user's data.
            log.warning("upstream wrote a line that is not JSON-RPC (%d bytes)", len(line))
            await to_session.send(exc)
            return
        await to_session.send(SessionMessage(message))

    def note_death() -> None:
        if sandbox is not None and not channel.ended_by and killed_for_memory():
            channel.ended_by = death_note()
            log.warning("%s", channel.ended_by)

    async def read_stdout() -> None:
        stdout = process.stdout
        assert stdout is not None
        lines = LineReader(max_result + _ENVELOPE_ROOM)
        size = _READ_SIZE
        waited = True  # whether the task went through the scheduler since the last chunk
        try:
            async with to_session:
                try:
                    while True:
                        # The pipe is non-blocking: read first, and wait only when it is empty. A
                        # chunk that follows another without a wait yields first, so an upstream that
                        # never stops writing cannot starve the worker's other tasks.
                        try:
                            chunk = os.read(stdout.fileno(), size)
                        except BlockingIOError:
                            try:
                                await trio.lowlevel.wait_readable(stdout.fileno())
                            except trio.ClosedResourceError:
                                return
                            waited = True
                            continue
                        except OSError:
                            return  # closed or broken, as the stream's receive_some would report
                        if not chunk:
                            return
                        channel.bytes_read += len(chunk)
                        if len(chunk) == size and size < _READ_SIZE_MAX:
                            if size == _READ_SIZE:
                                with contextlib.suppress(OSError):  # above the system's pipe-max-size
                                    fcntl.fcntl(stdout.fileno(), fcntl.F_SETPIPE_SZ, _READ_SIZE_MAX)
                            size = min(size * 4, _READ_SIZE_MAX)
                        elif len(chunk) < size:
                            size = _READ_SIZE
                        if not waited:
                            await trio.lowlevel.checkpoint()
                        waited = False
                        for line in lines.feed(chunk):
                            if isinstance(line, Oversized):
                                await deliver_oversized(line)
                            elif line.strip():
                                await deliver(line)
                finally:
                    # Before the session hears of the end: it reports why.
                    note_death()
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return
        finally:
            note_death()
            channel.close()

    async def write_stdin() -> None:
        async with from_session:
            async for item in from_session:
                data = item.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
                try:
                    await channel.write_line(data)
                except (trio.ClosedResourceError, trio.BrokenResourceError, OSError):
                    return

    async with trio.open_nursery() as nursery:
        channel.nursery = nursery
        nursery.start_soon(read_stdout)
        nursery.start_soon(write_stdin)
        assert process.output is not None
        stderr_done = trio.Event()

        async def pump_stderr() -> None:
            assert process.output is not None
            try:
                await pump(process.output, stderr_log)
            finally:
                stderr_done.set()

        nursery.start_soon(pump_stderr)
        if watchdog is not None:
            nursery.start_soon(watchdog.watch, process.pid, lambda: process.send_signal_to_group(signal.SIGKILL))
        try:
            yield read_stream, write_stream, channel
        finally:
            with trio.CancelScope(shield=True):
                # The MCP way first (stdin closed), then TERM, then KILL.
                await lifetime.stop_group(
                    process, signal.SIGTERM, _TERM_GRACE, stdin=process.stdin, stdin_grace=_STDIN_GRACE, name="upstream"
                )
                # An upstream's last words (why it died) are what its log is for: let the pump
                # reach the end of the pipe. Bounded, as a grandchild may still hold it open.
                with trio.move_on_after(_STDERR_DRAIN):
                    await stderr_done.wait()
                if confined is not None:
                    confined.close()
                if limits is not None:
                    await limits.aclose()
            nursery.cancel_scope.cancel()
