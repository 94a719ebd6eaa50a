"""What an upstream's sandbox costs: its start time and tools/call latency, with and without it.

    python tests/bench/bench_upstream_sandbox.py [--starts 10] [--calls 500]

One run measures both, side by side, on the same upstream (tests/upstreams/echo_server.py, or
`mcp-server-time` with --time): the time from spawn to the answer of `initialize`, and the median
and 95th percentile of a `tools/call` round trip over the worker's own stdio channel. As root the
sandbox also gets its cgroup (memory, pids), as a tenant's would.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from mcpvisor.runtime.logs import RotatingFile
from mcpvisor.wire.sandboxing import SandboxPlan, home_dir
from mcpvisor.workers import confine
from mcpvisor.workers.stdio import child_environment, open_stdio_upstream
from tests.support import sandboxes

UPSTREAMS = Path(__file__).resolve().parents[1] / "upstreams"
INIT = (
    b'{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-06-18",'
    b'"capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}\n'
)
INITIALIZED = b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n'


@asynccontextmanager
async def _open(command: list[str], plan: SandboxPlan | None, log: RotatingFile) -> AsyncIterator[tuple[float, Any]]:
    """An initialized upstream: (seconds from spawn to the initialize answer, its stdio channel)."""
    env = {} if plan is not None else child_environment({})
    started = time.perf_counter()
    async with open_stdio_upstream(command[0], command[1:], env, None, log, sandbox=plan, worker_id="bench/up") as (
        read_stream,
        _write,
        channel,
    ):
        await channel.write_line(INIT)
        await read_stream.receive()  # the initialize answer goes to the session's stream
        ready = time.perf_counter() - started
        await channel.write_line(INITIALIZED)
        yield ready, channel


def bare_start(plan: SandboxPlan) -> tuple[list[float], list[float]]:
    """Seconds to run `true` alone and in the sandbox (bwrap, setpriv, the mounts): its own start cost."""
    plain, boxed = [], []
    for _ in range(30):
        t0 = time.perf_counter()
        subprocess.run(["/usr/bin/true"], check=True)
        plain.append(time.perf_counter() - t0)
        # What a worker does at each start: resolve the binds, open the filter, build the argv.
        t0 = time.perf_counter()
        confined = confine.confine(plan, "bench/up", "/usr/bin/true", [], {}, None)
        assert sandboxes.run(confined).returncode == 0
        boxed.append(time.perf_counter() - t0)
    return plain, boxed


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return f"p50 {statistics.median(ordered) * 1000:7.2f} ms   p95 {p95 * 1000:7.2f} ms"


async def main(args: argparse.Namespace) -> None:
    if shutil.which("bwrap") is None:
        print("bwrap is not installed (apt-get install bubblewrap)")
        return
    if args.time:
        installed = Path(sys.executable).parent / "mcp-server-time"
        command = [str(installed), "--local-timezone", "UTC"]
        tool = ("get_current_time", b'{"name":"get_current_time","arguments":{"timezone":"UTC"}}')
    else:
        command = [sys.executable, str(UPSTREAMS / "echo_server.py")]
        tool = ("echo", b'{"name":"echo","arguments":{"text":"hello"}}')
    with tempfile.TemporaryDirectory() as data:
        log = RotatingFile(Path(data) / "bench.stderr.log")
        uid = sandboxes.TEST_UID if os.geteuid() == 0 else None
        plan = SandboxPlan(home=home_dir(data, "bench/up"), hidden=(data,), uid=uid)
        print(f"upstream: {' '.join(Path(c).name for c in command)}; as {'root' if os.geteuid() == 0 else 'a user'}")
        plain, boxed = bare_start(plan)
        print(f"{'':>10}  bwrap alone, /usr/bin/true: without {summary(plain)}   with {summary(boxed)}")
        # Alternate the two, so that the load of a shared machine falls on both alike.
        starts: dict[str, list[float]] = {"no sandbox": [], "sandbox": []}
        calls: dict[str, list[float]] = {"no sandbox": [], "sandbox": []}
        for _ in range(args.starts):
            for label, each in (("no sandbox", None), ("sandbox", plan)):
                async with _open(command, each, log) as (ready, _channel):
                    starts[label].append(ready)
        async with _open(command, None, log) as (_, bare), _open(command, plan, log) as (_, boxed_channel):
            for _ in range(args.calls // 50):
                for label, channel in (("no sandbox", bare), ("sandbox", boxed_channel)):
                    for _ in range(50):
                        t0 = time.perf_counter()
                        await channel.request("tools/call", tool[1])
                        calls[label].append(time.perf_counter() - t0)
        for label in starts:
            print(f"{label:>10}  start to initialize: {summary(starts[label])}   tools/call: {summary(calls[label])}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--time", action="store_true", help="use mcp-server-time instead of the echo test server")
    trio.run(main, parser.parse_args())
