"""The stdio transport to an upstream: a child process that cannot outlive its worker.

The SDK's own stdio client starts the server in a new session and leaves it running if the worker
is killed; this one has the kernel SIGKILL the upstream when the worker dies (see wire.lifetime),
puts it in its own process group so the whole tree can be stopped, and sends its stderr to a log
file instead of the terminal.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import mcp_types as types
import trio
from mcp.shared.message import SessionMessage
from mcpvisor.wire import lifetime

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_MAX_LINE = 64 * 1024 * 1024  # an upstream that never ends a line must not eat the worker's memory
_STDIN_GRACE = 2.0
_TERM_GRACE = 2.0

# Inherited by default, as the SDK's stdio client does: enough to find and run programs.
INHERITED_ENV = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LC_ALL", "TMPDIR", "TZ")


def child_environment(extra: Mapping[str, str]) -> dict[str, str]:
    """The upstream's environment: a safe inherited base, then its configured `env`."""
    env = {key: os.environ[key] for key in INHERITED_ENV if key in os.environ}
    # Commands installed next to mcpvisor (in its virtualenv) are found without activating it.
    here = os.path.dirname(sys.executable)
    path = env.get("PATH", os.defpath)
    if here not in path.split(os.pathsep):
        env["PATH"] = os.pathsep.join([here, path])
    env.update(extra)
    return env


class UpstreamProcessError(Exception):
    """The upstream command could not be started."""


@asynccontextmanager
async def open_stdio_upstream(
    command: str,
    args: list[str],
    env: Mapping[str, str],
    cwd: str | None,
    stderr_path: Path,
) -> AsyncIterator[tuple[anyio.abc.ObjectReceiveStream, anyio.abc.ObjectSendStream, lifetime.Child]]:
    """Start the upstream and yield (read_stream, write_stream, process) for a ClientSession."""
    executable = shutil.which(command, path=env.get("PATH")) or command
    stderr_path.parent.mkdir(parents=True, exist_ok=True)
    with open(stderr_path, "ab", buffering=0) as stderr_file:
        try:
            process = lifetime.spawn(
                [executable, *args], env=env, cwd=cwd, stdin_pipe=True, stdout_pipe=True, output=stderr_file
            )
        except OSError as exc:
            raise UpstreamProcessError(f"cannot start {command!r}: {exc.strerror or exc}") from None
    await trio.lowlevel.checkpoint()
    to_session, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](64)
    write_stream, from_session = anyio.create_memory_object_stream[SessionMessage](64)

    async def read_stdout() -> None:
        assert process.stdout is not None
        buffer = b""
        async with to_session:
            while True:
                try:
                    chunk = await process.stdout.receive_some(65536)
                except (trio.ClosedResourceError, trio.BrokenResourceError):
                    return
                if not chunk:
                    return
                buffer += chunk
                if b"\n" not in chunk:
                    if len(buffer) > _MAX_LINE:
                        await to_session.send(ValueError("upstream sent a line longer than 64 MiB"))
                        return
                    continue
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    try:
                        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                    except ValueError as exc:
                        log.warning("upstream wrote a line that is not JSON-RPC: %.200r", line)
                        await to_session.send(exc)
                        continue
                    try:
                        await to_session.send(SessionMessage(message))
                    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                        return

    async def write_stdin() -> None:
        assert process.stdin is not None
        async with from_session:
            async for item in from_session:
                data = item.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
                try:
                    await process.stdin.send_all(data)
                except (trio.ClosedResourceError, trio.BrokenResourceError, OSError):
                    return

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_stdout)
        nursery.start_soon(write_stdin)
        try:
            yield read_stream, write_stream, process
        finally:
            with trio.CancelScope(shield=True):
                await stop_process(process)
            nursery.cancel_scope.cancel()


async def stop_process(process: lifetime.Child) -> None:
    """The MCP shutdown sequence: close stdin, wait, TERM the group, wait, KILL the group."""
    if process.stdin is not None:
        await process.stdin.aclose()
    with trio.move_on_after(_STDIN_GRACE):
        await process.wait()
    for sig, grace in ((signal.SIGTERM, _TERM_GRACE), (signal.SIGKILL, 5.0)):
        # Signal the group even when the leader is gone: a launcher (npx, uvx, sh) may have
        # left the real server behind in it.
        if not process.send_signal_to_group(sig):
            return
        if process.returncode is None:
            with trio.move_on_after(grace):
                await process.wait()
    if process.returncode is None:
        log.error("upstream pid %d survived SIGKILL", process.pid)
