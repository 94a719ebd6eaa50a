"""Third-party MCP peers pinned in tests/peers (npm): server-everything, the MCP Inspector and Node 22.

Tests that need them skip with the command to run when they are not installed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

from tests.support.stack import REPO, free_port, wait_listening

PEERS = REPO / "tests" / "peers"
NODE_MODULES = PEERS / "node_modules"
EVERYTHING_PACKAGE = NODE_MODULES / "@modelcontextprotocol" / "server-everything"
INSPECTOR_PACKAGE = NODE_MODULES / "@modelcontextprotocol" / "inspector"
INSTALL_HINT = "run `npm ci --prefix tests/peers` first"


class InspectorCliError(RuntimeError):
    """The Inspector CLI exited with an error (its JSON error envelope is on stderr)."""

    def __init__(self, command: list[str], returncode: int | None, stderr: str) -> None:
        self.returncode = returncode
        self.stderr = stderr
        status = "timed out" if returncode is None else f"exited with {returncode}"
        super().__init__(f"inspector {' '.join(command[2:])} {status}: {stderr.strip()}")


def _installed(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{INSTALL_HINT} ({path.relative_to(REPO)} not found)")
    return path


def _bin(package: Path, name: str) -> Path:
    """The file a package's `bin` entry `name` runs."""
    manifest = json.loads(_installed(package / "package.json").read_text())
    return _installed(package / manifest["bin"][name])


def node22() -> Path:
    """The Node 22 binary from the `node` npm package (the Inspector needs Node >= 22.19)."""
    node = _installed(NODE_MODULES / "node" / "bin" / "node")
    if not os.access(node, os.X_OK):
        pytest.skip(f"{INSTALL_HINT} ({node.relative_to(REPO)} is not executable)")
    return node


def everything_entry() -> Path:
    """server-everything's entry script: `node ENTRY [stdio|sse|streamableHttp]`, stdio by default."""
    return _bin(EVERYTHING_PACKAGE, "mcp-server-everything")


def inspector_entry() -> Path:
    """The Inspector's launcher script; `--cli` as its first argument selects the CLI."""
    return _bin(INSPECTOR_PACKAGE, "mcp-inspector")


def everything_stdio_server(**extra: Any) -> dict[str, Any]:
    """A server table that runs server-everything over stdio."""
    return {"command": str(node22()), "args": [str(everything_entry()), "stdio"], **extra}


@asynccontextmanager
async def open_everything_http(log_dir: Path, *, timeout: float = 15.0) -> AsyncIterator[str]:
    """Run server-everything's streamable HTTP transport on a free port; yield its /mcp URL."""
    port = free_port()
    command = [str(node22()), str(everything_entry()), "streamableHttp"]
    log_path = log_dir / f"everything-http-{port}.log"
    with open(log_path, "wb") as log:
        # It reads its port from PORT; its request log goes to stdout, so keep it out of the test output.
        process = subprocess.Popen(
            command, stdout=log, stderr=log, env={**os.environ, "PORT": str(port)}, start_new_session=True
        )
    try:
        try:
            await wait_listening(port, process, timeout=timeout)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}: {log_path.read_text()}") from None
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        _kill_group(process)


def inspector_cli(
    url: str | Sequence[str], method: str, *args: str, transport: str = "http", timeout: float = 30.0
) -> Any:
    """Run one Inspector CLI request against `url` and return the `result` of its JSON output.

    With transport="stdio", `url` is the server's command line (a list: program and arguments).
    `args` are further CLI flags: `--tool-name NAME`, `--tool-arg key=value`, `--uri URI`,
    `--prompt-name NAME`, `--prompt-args key=value`, ... Raises InspectorCliError with its
    stderr when it fails. The CLI runs in its own process group, killed when it returns, and
    with a throwaway HOME so it never writes to the user's ~/.mcp-inspector.
    """
    command = [
        str(node22()),
        str(inspector_entry()),
        "--cli",
        *([url] if isinstance(url, str) else url),
        "--transport",
        transport,
        "--method",
        method,
        *args,
        "--format",
        "json",
        "--quiet",
    ]
    with tempfile.TemporaryDirectory(prefix="inspector-home-") as home:
        env = {key: value for key, value in os.environ.items() if not key.startswith("MCP_")}
        env.update(HOME=home, USERPROFILE=home, NO_COLOR="1")
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            stdout, stderr = process.communicate()
            raise InspectorCliError(command, None, stderr.decode(errors="replace")) from None
        finally:
            _kill_group(process)
    if process.returncode != 0:
        raise InspectorCliError(command, process.returncode, stderr.decode(errors="replace"))
    try:
        output = json.loads(stdout)
    except json.JSONDecodeError as exc:
        raise InspectorCliError(command, 0, f"stdout is not JSON ({exc}): {stdout[:2000]!r}") from None
    if not isinstance(output, dict) or "result" not in output:
        raise InspectorCliError(command, 0, f"no result in its output: {output!r}")
    return output["result"]


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group led by `process` (it and anything it started), then reap it."""
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
