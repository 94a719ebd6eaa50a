"""A real HAProxy (Debian's `haproxy`) on loopback, running the shipped deploy/haproxy/haproxy.cfg.

The shipped file's `bind` and `server` lines name the compose replicas; here they name the
servers a test started, and everything else (affinity, health checks, retries, the request id)
is the file's own, so the tests exercise what operators deploy.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from tests.support.stack import REPO, free_port, wait_listening

SHIPPED = REPO / "deploy" / "haproxy" / "haproxy.cfg"
_LOGGED = re.compile(r" (\S+)/(\S+) \S+ (-?\d+) .* retries=\+?(-?\d+) id=(\S+) ")


def haproxy_binary() -> str:
    """The haproxy program, or skip the test that needs it."""
    found = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
    if found is None:
        pytest.skip("system package missing: haproxy")
    return found


def config_for(port: int, servers: Mapping[str, int], admin: Path | None = None) -> str:
    """The shipped config, listening on loopback `port`, balancing over loopback `servers` (name: port),
    with its runtime API on the unix socket `admin` if given."""
    lines = []
    for line in SHIPPED.read_text().splitlines():
        stripped = line.strip()
        if stripped == "global" and admin is not None:
            line += f"\n    stats socket {admin} mode 600 level admin"
        elif stripped.startswith("bind "):
            line = f"    bind 127.0.0.1:{port}"
        elif stripped.startswith("server "):
            continue
        lines.append(line)
    lines += [f"    server {name} 127.0.0.1:{server_port}" for name, server_port in servers.items()]
    return "\n".join(lines) + "\n"


@dataclass
class LogLine:
    backend: str
    server: str
    status: int
    retries: int  # sent again after a failed connection or a 503 (retry-on)
    request_id: str


@dataclass
class HAProxy:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    admin: Path

    async def ask(self, command: str) -> str:
        """What HAProxy's runtime API answers to `command` (e.g. `show table mcpvisor`)."""
        stream = await trio.open_unix_socket(str(self.admin))
        async with stream:
            await stream.send_all(command.encode() + b"\n")
            answer = b""
            while data := await stream.receive_some(65536):
                answer += data
        return answer.decode()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> list[LogLine]:
        """The requests HAProxy has logged so far (one line each, once answered or refused)."""
        found = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            match = _LOGGED.search(line)
            if match is not None:
                found.append(LogLine(match[1], match[2], int(match[3]), int(match[4]), match[5]))
        return found


@asynccontextmanager
async def open_haproxy(tmp_path: Path, servers: Mapping[str, int]) -> AsyncIterator[HAProxy]:
    binary = haproxy_binary()
    port = free_port()
    config = tmp_path / "haproxy.cfg"
    admin = tmp_path / "haproxy.sock"
    config.write_text(config_for(port, servers, admin))
    log_path = tmp_path / "haproxy.log"
    with open(log_path, "ab") as out:
        process = subprocess.Popen([binary, "-db", "-f", str(config)], stdout=out, stderr=out)
    try:
        await wait_listening(port, process)
        yield HAProxy(process, port, log_path, admin)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
