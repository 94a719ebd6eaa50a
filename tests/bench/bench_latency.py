"""Latency and throughput of a tool call: directly to an upstream, and through mcpvisor.

    python tests/bench/bench_latency.py [--calls 500] [--clients 16] [--per-client 100]

Starts tests/upstreams/echo_server.py twice: once serving streamable HTTP (the direct
connection), once over stdio behind an mcpvisor worker. Both are driven by the SDK's `Client`
over streamable HTTP, in this one run, and the figures are printed side by side.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio
from mcp import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.support.stack import UPSTREAMS, echo_server, free_port, open_stack

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used so far, from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def role(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline") as cmdline:
        argv = cmdline.read()
    for module in ("frontend", "workers"):
        if f"mcpvisor.{module}" in argv:
            return module.removesuffix("s")
    return "upstream"


async def sequential(
    url: str, tool: str, calls: int, mode: str, processes: dict[str, int]
) -> tuple[list[float], dict[str, float]]:
    """Latency samples (ms), and the CPU each process spent per call (ms), the client included."""
    async with Client(url, mode=mode) as client:
        for _ in range(min(50, calls)):
            await client.call_tool(tool, {"text": "warm-up"})
        samples = []
        before = {name: cpu_seconds(pid) for name, pid in processes.items()}
        client_before = time.process_time()
        for i in range(calls):
            start = time.perf_counter()
            await client.call_tool(tool, {"text": f"call {i}"})
            samples.append((time.perf_counter() - start) * 1000)
        cpu = {"client": time.process_time() - client_before}
        cpu.update({name: cpu_seconds(pid) - before[name] for name, pid in processes.items()})
        return samples, {name: seconds * 1000 / calls for name, seconds in cpu.items()}


async def concurrent(url: str, tool: str, clients: int, per_client: int, mode: str) -> float:
    """Calls per second with `clients` connected clients calling at once."""
    ready = trio.Event()
    connected = 0

    async def one(index: int) -> None:
        nonlocal connected
        async with Client(url, mode=mode) as client:
            await client.call_tool(tool, {"text": "warm-up"})
            connected += 1
            if connected == clients:
                ready.set()
            await ready.wait()
            for i in range(per_client):
                await client.call_tool(tool, {"text": f"{index}/{i}"})

    start = 0.0
    async with trio.open_nursery() as nursery:
        for index in range(clients):
            nursery.start_soon(one, index)
        await ready.wait()
        start = time.perf_counter()
    return clients * per_client / (time.perf_counter() - start)


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def wait_http(url: str) -> None:
    for _ in range(100):
        try:
            async with Client(url, mode="legacy"):
                return
        except Exception:  # not up yet; any connection failure means "try again"
            await trio.sleep(0.1)
    raise TimeoutError(url)


@asynccontextmanager
async def direct_upstream() -> AsyncIterator[tuple[subprocess.Popen[bytes], str]]:
    """The echo upstream serving streamable HTTP on loopback, ready for clients: (process, url)."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(UPSTREAMS / "echo_server.py"), "--http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        await wait_http(url)
        yield process, url
    finally:
        process.kill()
        process.wait()


async def main(args: argparse.Namespace) -> None:
    results: dict[str, dict[str, float]] = {}
    cpu: dict[str, dict[str, float]] = {}
    async with direct_upstream() as (direct, direct_url):
        with tempfile.TemporaryDirectory() as tmp:
            async with open_stack(Path(tmp), {"echo": echo_server()}) as stack:
                behind = {role(pid): pid for pid in stack.pids() if pid != stack.process.pid}
                for mode in args.modes:
                    for label, url, tool, processes in (
                        ("direct", direct_url, "echo", {"upstream": direct.pid}),
                        ("mcpvisor", stack.direct_url, "echo:echo", behind),
                    ):
                        print(f"measuring {label} ({mode}) ...", file=sys.stderr)
                        samples, cpu[f"{label}/{mode}"] = await sequential(url, tool, args.calls, mode, processes)
                        rate = await concurrent(url, tool, args.clients, args.per_client, mode)
                        results[f"{label}/{mode}"] = {
                            "p50": statistics.median(samples),
                            "p99": percentile(samples, 0.99),
                            "rate": rate,
                        }

    print(
        f"\ntools/call of a small upstream tool: {args.calls} sequential calls; "
        f"{args.clients} clients x {args.per_client} calls concurrently"
    )
    print(f"{'protocol':<12} {'metric':<22} {'direct':>10} {'mcpvisor':>10} {'ratio':>7}  target")
    for mode in args.modes:
        d, m = results[f"direct/{mode}"], results[f"mcpvisor/{mode}"]
        era = "2026-07-28" if mode == "auto" else "2025-11-25"
        print(
            f"{era:<12} {'p50 latency (ms)':<22} {d['p50']:>10.2f} {m['p50']:>10.2f} {m['p50'] / d['p50']:>6.2f}x  <= 1.5x"
        )
        print(f"{era:<12} {'p99 latency (ms)':<22} {d['p99']:>10.2f} {m['p99']:>10.2f} {m['p99'] / d['p99']:>6.2f}x")
        print(
            f"{era:<12} {f'calls/s, {args.clients} clients':<22} {d['rate']:>10.0f} {m['rate']:>10.0f} "
            f"{m['rate'] / d['rate']:>6.2f}x  >= 0.7x"
        )
    # Where a call's time goes: on a machine with few cores every process of the chain competes
    # for them, so the sum bounds throughput and the chain's length shows in latency.
    print("\nCPU per call in the sequential run (ms), by process")
    print(f"{'protocol':<12} {'path':<10} {'client':>8} {'frontend':>9} {'worker':>8} {'upstream':>9} {'total':>8}")
    for mode in args.modes:
        era = "2026-07-28" if mode == "auto" else "2025-11-25"
        for label in ("direct", "mcpvisor"):
            row = cpu[f"{label}/{mode}"]
            cells = [f"{row[name]:>{width}.2f}" if name in row else f"{'-':>{width}}" for name, width in _COLUMNS]
            print(f"{era:<12} {label:<10} {' '.join(cells)} {sum(row.values()):>8.2f}")


_COLUMNS = (("client", 8), ("frontend", 9), ("worker", 8), ("upstream", 9))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--per-client", type=int, default=100)
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["auto", "legacy"],
        choices=["auto", "legacy"],
        help="client protocol: auto (2026-07-28) and/or legacy (handshake era)",
    )
    trio.run(main, parser.parse_args())
