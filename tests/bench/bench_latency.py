"""Latency and throughput of a tool call: directly to an upstream, and through mcpvisor.

    python tests/bench/bench_latency.py [--calls 500] [--clients 16] [--per-client 100] [--peer]
                                        [--profile DIR]

Starts tests/upstreams/echo_server.py twice: once serving streamable HTTP (the direct
connection), once over stdio behind an mcpvisor worker. With `--peer`, a third time over stdio
behind FastMCP's proxy (installed into a virtualenv of its own, see bench_scale.py). All are
driven by the SDK's `Client` over streamable HTTP, in this one run, and printed side by side.

`--profile DIR` samples mcpvisor's frontend with py-spy (`pip install py-spy`) during each era's
sequential run and writes its stacks, collapsed (flamegraph.pl's input), to DIR/frontend-ERA.txt,
then prints the functions that held the most samples.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
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
from tests.bench.bench_scale import open_peer
from tests.support.stack import UPSTREAMS, echo_server, free_port, open_stack

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used so far, from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def role(pid: int) -> str:
    """frontend, worker or upstream, from a process's command line (a forked worker keeps the
    forkserver's)."""
    with open(f"/proc/{pid}/cmdline") as cmdline:
        argv = cmdline.read()
    if "mcpvisor.frontend" in argv:
        return "frontend"
    if "mcpvisor.workers" in argv:
        return "worker"
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


@asynccontextmanager
async def profiled(pid: int | None, out: Path | None) -> AsyncIterator[None]:
    """py-spy sampling `pid` while the block runs, its collapsed stacks written to `out`."""
    if pid is None or out is None:
        yield
        return
    spy = subprocess.Popen(
        [
            shutil.which("py-spy", path=Path(sys.executable).parent) or "py-spy",
            "record",
            "--pid",
            str(pid),
            "--rate",
            "1000",
            "--format",
            "raw",
            "--nonblocking",
            "--output",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    await trio.sleep(1.0)  # attached before the first measured call
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        _, err = spy.communicate(timeout=30)
        if spy.returncode not in (0, -signal.SIGINT):
            print(f"py-spy failed: {err.decode(errors='replace').strip()}", file=sys.stderr)


def hottest(collapsed: Path, top: int = 25) -> list[tuple[str, float, float]]:
    """(function, share of samples anywhere on the stack, share at its top) from collapsed stacks."""
    total = 0
    inclusive: dict[str, int] = {}
    own: dict[str, int] = {}
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [frame.split(" (")[0] + " " + frame.rsplit("/", 1)[-1].split(":")[0] for frame in stack.split(";")]
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + n
        own[frames[-1]] = own.get(frames[-1], 0) + n
    ranked = sorted(inclusive, key=lambda frame: inclusive[frame], reverse=True)[:top]
    return [(frame, inclusive[frame] / total, own.get(frame, 0) / total) for frame in ranked] if total else []


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


async def peer_target(url: str) -> str:
    """The echo tool's name behind the peer (it may prefix it with the server's name)."""
    async with Client(url, mode="legacy") as client:
        names = [tool.name for tool in (await client.list_tools()).tools]
    return next(name for name in names if name.endswith("echo"))


async def main(args: argparse.Namespace) -> None:
    results: dict[str, dict[str, float]] = {}
    cpu: dict[str, dict[str, float]] = {}
    labels = ["direct", "mcpvisor", *(["fastmcp"] if args.peer else [])]
    async with direct_upstream() as (direct, direct_url), contextlib.AsyncExitStack() as exits:
        tmp = Path(exits.enter_context(tempfile.TemporaryDirectory()))
        stack = await exits.enter_async_context(open_stack(tmp / "mcpvisor", {"echo": echo_server()}))
        behind = {role(pid): pid for pid in stack.pids() if pid != stack.process.pid and role(pid) != "worker"}
        behind["worker"] = stack.status()["echo"]["pid"]
        targets = {
            "direct": (direct_url, "echo", {"upstream": direct.pid}),
            "mcpvisor": (stack.direct_url, "echo:echo", behind),
        }
        if args.peer:
            (tmp / "peer").mkdir()
            peer, peer_url = await exits.enter_async_context(open_peer({"echo": echo_server()}, tmp / "peer"))
            # The proxy starts a process of its upstream for each client's session and ends it with
            # the session, so only the proxy's own CPU can be followed from here.
            targets["fastmcp"] = (peer_url, await peer_target(peer_url), {"frontend": peer.pid})
        for mode in args.modes:
            for label in labels:
                url, tool, processes = targets[label]
                print(f"measuring {label} ({mode}) ...", file=sys.stderr)
                era = "2026-07-28" if mode == "auto" else "2025-11-25"
                out = args.profile / f"frontend-{era}.txt" if args.profile and label == "mcpvisor" else None
                async with profiled(processes.get("frontend"), out):
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
    others = labels[1:]
    header = "".join(f" {label:>10} {'ratio':>7}" for label in others)
    print(f"{'protocol':<12} {'metric':<22} {'direct':>10}{header}  target")
    for mode in args.modes:
        d = results[f"direct/{mode}"]
        era = "2026-07-28" if mode == "auto" else "2025-11-25"
        for metric, key, fmt, target, ratio in (
            ("p50 latency (ms)", "p50", ".2f", "<= 1.3x", lambda m, d: m / d),
            ("p99 latency (ms)", "p99", ".2f", "", lambda m, d: m / d),
            (f"calls/s, {args.clients} clients", "rate", ".0f", ">= 0.9x", lambda m, d: m / d),
        ):
            cells = "".join(
                f" {results[f'{label}/{mode}'][key]:>10{fmt}} {ratio(results[f'{label}/{mode}'][key], d[key]):>6.2f}x"
                for label in others
            )
            print(f"{era:<12} {metric:<22} {d[key]:>10{fmt}}{cells}  {target}")
    # Where a call's time goes: on a machine with few cores every process of the chain competes
    # for them, so the sum bounds throughput and the chain's length shows in latency. FastMCP's
    # proxy is one process: its CPU shows under "frontend".
    print("\nCPU per call in the sequential run (ms), by process")
    print(f"{'protocol':<12} {'path':<10} {'client':>8} {'frontend':>9} {'worker':>8} {'upstream':>9} {'total':>8}")
    for mode in args.modes:
        era = "2026-07-28" if mode == "auto" else "2025-11-25"
        for label in labels:
            row = cpu[f"{label}/{mode}"]
            cells = [f"{row[name]:>{width}.2f}" if name in row else f"{'-':>{width}}" for name, width in _COLUMNS]
            print(f"{era:<12} {label:<10} {' '.join(cells)} {sum(row.values()):>8.2f}")

    for mode in args.modes if args.profile else ():
        era = "2026-07-28" if mode == "auto" else "2025-11-25"
        path = args.profile / f"frontend-{era}.txt"
        if path.exists():
            print(f"\nfrontend, {era}: share of samples (on the stack / at its top), {path}")
            for frame, anywhere, top in hottest(path):
                print(f"{anywhere:>6.1%} {top:>6.1%}  {frame}")


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
    parser.add_argument("--peer", action="store_true", help="also measure FastMCP's proxy on the same upstream")
    parser.add_argument("--profile", type=Path, help="sample the frontend with py-spy into this folder")
    args = parser.parse_args()
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    trio.run(main, args)
