"""Start a whole mcpvisor stack (supervisor, frontend, workers, upstreams) as real processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import tomli_w
import trio
from mcp import Client

from mcpvisor.supervisor.ctl import Connection
from mcpvisor.supervisor.instance import read_holder
from mcpvisor.wire.endpoints import Endpoints
from mcpvisor.wire.messages import Reply

REPO = Path(__file__).resolve().parents[2]
UPSTREAMS = REPO / "tests" / "upstreams"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def wait_listening(port: int, process: subprocess.Popen[bytes], *, timeout: float = 15.0) -> None:
    """Wait until something accepts connections on the loopback `port`; fail if `process` exits."""
    with trio.fail_after(timeout):
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{process.args!r} exited with {process.returncode} before listening")
            try:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
            except OSError:
                await trio.sleep(0.05)
                continue
            await stream.aclose()
            return


def python_server(script: str, *args: str, **extra: Any) -> dict[str, Any]:
    """A server table that runs one of tests/upstreams/ over stdio."""
    return {"command": sys.executable, "args": [str(UPSTREAMS / script), *args], **extra}


def echo_server(name: str = "echo", *args: str, **extra: Any) -> dict[str, Any]:
    return python_server("echo_server.py", "--name", name, *args, **extra)


@dataclass
class Stack:
    """A running mcpvisor: its supervisor process, config and where it listens."""

    process: subprocess.Popen[bytes]
    config_path: Path
    data_dir: Path
    run_dir: Path
    port: int
    env: dict[str, str]
    clients: list[Any] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def direct_url(self) -> str:
        return f"{self.base_url}/mcp/direct"

    @property
    def url(self) -> str:
        return f"{self.base_url}/mcp"

    def log(self, name: str) -> str:
        path = self.data_dir / "logs" / name
        return path.read_text(errors="replace") if path.exists() else ""

    async def health(self) -> dict[str, Any]:
        async with httpx2.AsyncClient(timeout=5) as http:
            response = await http.get(f"{self.base_url}/healthz")
            return response.json()

    async def wait_ready(self, servers: list[str], *, timeout: float = 30.0) -> dict[str, Any]:
        """Wait until each named server is ready behind the frontend."""
        deadline = trio.current_time() + timeout
        last: dict[str, Any] = {}
        while trio.current_time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"supervisor exited with {self.process.returncode}: {self.supervisor_output()}")
            try:
                last = await self.health()
            except (httpx2.TransportError, ValueError):
                await trio.sleep(0.1)
                continue
            states = last.get("servers", {})
            if all(states.get(s, {}).get("state") == "ready" and states[s].get("alive") for s in servers):
                return last
            await trio.sleep(0.1)
        raise TimeoutError(f"servers {servers} not ready after {timeout}s: {last}")

    def supervisor_output(self) -> str:
        return (self.data_dir / "supervisor.out").read_text(errors="replace")

    @asynccontextmanager
    async def client(self, path: str = "/mcp/direct", **kwargs: Any) -> AsyncIterator[Client]:
        async with Client(f"{self.base_url}{path}", **kwargs) as client:
            yield client

    def ctl(self, *args: str, json_output: bool = True, timeout: float = 60) -> tuple[int, Any]:
        """Run `mcpvisor ctl` against this stack: (exit code, parsed JSON or text output)."""
        command = [sys.executable, "-P", "-m", "mcpvisor.supervisor", "ctl", "-c", str(self.config_path)]
        if json_output:
            command.append("--json")
        result = subprocess.run(
            [*command, *args], capture_output=True, text=True, env=self.env, timeout=timeout, check=False
        )
        if not json_output:
            return result.returncode, result.stdout + result.stderr
        try:
            return result.returncode, json.loads(result.stdout) if result.stdout.strip() else None
        except json.JSONDecodeError:
            return result.returncode, result.stdout + result.stderr

    async def actl(self, *args: str, json_output: bool = True) -> tuple[int, Any]:
        """`ctl` without blocking the test's event loop."""
        return await trio.to_thread.run_sync(lambda: self.ctl(*args, json_output=json_output))

    def control(self, command: str, *args: str, timeout: float = 30) -> Reply:
        """Ask the supervisor on its control socket, as `ctl` does, without a process per question.

        Tests that poll the state use this: `ctl` costs about 0.4 s of CPU a run, which adds up to
        minutes over a suite on two cores. Tests of `ctl` itself run the real command (`ctl()`).
        """
        return ask(self.control_endpoint, command, *args, timeout=timeout)

    @property
    def control_endpoint(self) -> str:
        """The control socket its lock names (another data dir's instance may hold `run_dir`), else run_dir's."""
        return read_holder(self.data_dir).control or Endpoints.in_dir(self.run_dir).control

    def status(self) -> dict[str, dict[str, Any]]:
        reply = self.control("status")
        assert reply.ok and isinstance(reply.result, list), reply
        return {row["name"]: row for row in reply.result}

    async def wait_status(self, predicate: Any, *, timeout: float = 30.0) -> dict[str, dict[str, Any]]:
        """Poll the status on the control socket until `predicate(rows_by_name)` holds."""
        deadline = trio.current_time() + timeout
        rows: dict[str, dict[str, Any]] = {}
        while trio.current_time() < deadline:
            rows = await trio.to_thread.run_sync(self.status)
            if predicate(rows):
                return rows
            await trio.sleep(0.2)
        raise TimeoutError(f"status never matched: {rows}")

    def pids(self) -> set[int]:
        """Every live process in the supervisor's tree (the supervisor included)."""
        return descendants(self.process.pid) | {self.process.pid}


def ask(endpoint: str, command: str, *args: str, timeout: float = 30) -> Reply:
    """One question on a control socket, as `ctl` asks it (NoDaemon when nothing answers)."""
    connection = Connection(endpoint, timeout)
    try:
        return connection.call(command, list(args))
    finally:
        connection.close()


def descendants(pid: int) -> set[int]:
    """All processes below `pid`, from /proc (no psutil needed)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    found: set[int] = set()
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def write_config(
    path: Path,
    servers: Mapping[str, Mapping[str, Any]],
    settings: Mapping[str, Any],
    tables: Mapping[str, Any] | None = None,
) -> None:
    """`tables`: more top-level tables, such as `registries`."""
    document = {"mcpvisor": dict(settings), "servers": {k: dict(v) for k, v in servers.items()}, **(tables or {})}
    path.write_text(tomli_w.dumps(document))


def launch_stack(
    tmp_path: Path,
    servers: Mapping[str, Mapping[str, Any]],
    *,
    settings: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    tables: Mapping[str, Any] | None = None,
    port: int | None = None,
    python: str = sys.executable,
) -> Stack:
    """Write a config under `tmp_path` and start `mcpvisor serve` on it; returns at once, not waiting for it.

    `python`: the interpreter (and so the mcpvisor installed with it) to run, for a bench that
    compares two builds.
    """
    port = port or free_port()
    data_dir = tmp_path / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    config_path = tmp_path / "mcpvisor.toml"
    all_settings = {"listen": f"127.0.0.1:{port}", "enable_direct_endpoint": True, "data_dir": str(data_dir)}
    all_settings.update(settings or {})
    write_config(config_path, servers, all_settings, tables)
    return serve_config(config_path, data_dir, port, env=env, cwd=cwd, python=python)


def serve_config(
    config_path: Path,
    data_dir: Path,
    port: int,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    python: str = sys.executable,
) -> Stack:
    """Start `mcpvisor serve` on a config as it is, in a runtime dir of its own; returns at once."""
    # ipc:// paths are limited to ~100 bytes: keep the runtime dir short.
    run_dir = Path(tempfile.mkdtemp(prefix="mv", dir="/tmp"))
    process_env = {**os.environ, "XDG_RUNTIME_DIR": str(run_dir), **(env or {})}
    process_env.pop("RUNTIME_DIRECTORY", None)
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / "supervisor.out", "ab") as out:
        process = subprocess.Popen(
            [python, "-P", "-m", "mcpvisor.supervisor", "serve", "-c", str(config_path)],
            stdout=out,
            stderr=out,
            env=process_env,
            cwd=cwd,
            start_new_session=True,
        )
    return Stack(process, config_path, data_dir, run_dir / "mcpvisor", port, process_env)


async def wait_stack(stack: Stack, wait_for: list[str]) -> None:
    """Wait until each named server is ready behind the frontend and RUNNING for the supervisor."""
    await stack.wait_ready(wait_for)
    # A worker serves once its upstream is ready, and is RUNNING once it has lived `startsecs`
    # (as in supervisord): a test starts from a stack the supervisor also sees as up.
    if wait_for:
        await stack.wait_status(lambda rows: all(rows.get(name, {}).get("state") == "RUNNING" for name in wait_for))


def _enabled(servers: Mapping[str, Mapping[str, Any]]) -> list[str]:
    return [name for name, server in servers.items() if server.get("enabled", True)]


@asynccontextmanager
async def open_stack(
    tmp_path: Path,
    servers: Mapping[str, Mapping[str, Any]],
    *,
    settings: Mapping[str, Any] | None = None,
    wait_for: list[str] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    tables: Mapping[str, Any] | None = None,
    port: int | None = None,
    python: str = sys.executable,
) -> AsyncIterator[Stack]:
    """Write a config, run `mcpvisor serve` on it, wait for the servers, and stop it afterwards.

    `port`: listen there rather than on a free port picked here, for configs that name their own URL.
    """
    stack = launch_stack(
        tmp_path, servers, settings=settings, env=env, cwd=cwd, tables=tables, port=port, python=python
    )
    try:
        await wait_stack(stack, _enabled(servers) if wait_for is None else wait_for)
        yield stack
    finally:
        await stop_stack(stack)


@asynccontextmanager
async def open_replicas(
    tmp_path: Path,
    count: int,
    servers: Mapping[str, Mapping[str, Any]],
    *,
    state_url: str,
    settings: Mapping[str, Any] | None = None,
    wait_for: list[str] | None = None,
    env: Mapping[str, str] | None = None,
    tables: Mapping[str, Any] | None = None,
) -> AsyncIterator[list[Stack]]:
    """Start `count` replicas of mcpvisor sharing one state store (`state_url`), all at once.

    Each replica is a whole `mcpvisor serve` with the same servers, settings and tables; only its
    listen port, data dir and runtime dir are its own (as pods of one Deployment on their own
    disks). They start together, so an empty database sees its first replicas race to set it up.
    """
    stacks: list[Stack] = []
    try:
        for index in range(count):
            replica_dir = tmp_path / f"replica{index}"
            replica_dir.mkdir(parents=True, exist_ok=True)
            replica_settings = {**(settings or {}), "state_url": state_url}
            stacks.append(launch_stack(replica_dir, servers, settings=replica_settings, env=env, tables=tables))
        names = _enabled(servers) if wait_for is None else wait_for
        async with trio.open_nursery() as nursery:
            for stack in stacks:
                nursery.start_soon(wait_stack, stack, names)
        yield stacks
    finally:
        with trio.CancelScope(shield=True):
            async with trio.open_nursery() as nursery:
                for stack in stacks:
                    nursery.start_soon(stop_stack, stack)


async def stop_stack(stack: Stack, timeout: float = 15.0) -> None:
    """SIGTERM the supervisor, wait for it; SIGKILL its whole tree if it does not finish."""
    pids = stack.pids()
    if stack.process.poll() is None:
        stack.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while stack.process.poll() is None and time.monotonic() < deadline:
            await trio.sleep(0.05)
    for pid in pids | stack.pids():
        if alive(pid):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    if stack.process.poll() is None:
        stack.process.kill()
    stack.process.wait()
