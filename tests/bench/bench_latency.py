"""Latency, throughput and CPU of a tool call: directly to an upstream, and through mcpvisor.

    python tests/bench/bench_latency.py [--calls 500] [--clients 16] [--per-client 100]
                                        [--upstreams stdio http] [--modes auto legacy] [--rounds 1]
                                        [--before PYTHON] [--peer] [--profile DIR]

Each row compares paths to the same upstream (tests/upstreams/echo_server.py), measured in this
one run, with the SDK's `Client` in the protocol era of the row (`auto`: 2026-07-28, `legacy`:
2025-11-25):

- a stdio upstream: `direct` is the client starting the upstream itself over stdio (one process
  per client); `mcpvisor` is /mcp/direct with the upstream behind a worker, over stdio;
- a streamable-HTTP upstream: `direct` is the client talking to it; `mcpvisor` is /mcp/direct
  with a worker connected to that same upstream process.

`--before PYTHON` adds the same paths through another build of mcpvisor, run by PYTHON (the
interpreter of a checkout's virtualenv, e.g. a worktree of the main branch); `--peer` adds
FastMCP's proxy in front of the stdio upstream (installed into a virtualenv of its own, see
bench_scale.py). With `--rounds N` every measurement is taken N times, the paths interleaved, and
the median is printed: on a machine shared with other work, ratios of one run are what to read.

`--profile DIR` samples mcpvisor's frontend with py-spy (`pip install py-spy`) during each
sequential run (CPU only: `--gil`) and writes its stacks, collapsed, to DIR, then prints the
functions that held the most samples.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.bench.bench_scale import open_peer
from tests.support.stack import UPSTREAMS, echo_server, free_port, open_stack

_TICKS = os.sysconf("SC_CLK_TCK")
ERAS = {"auto": "2026-07-28", "legacy": "2025-11-25"}
ECHO = [sys.executable, str(UPSTREAMS / "echo_server.py")]


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


def children_of(pid: int) -> set[int]:
    """The processes whose parent is `pid`, from /proc."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/stat") as stat:
                if int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.add(int(entry))
    return found


@dataclass
class Path_:
    """One way to reach the echo tool: what a client connects to, the tool's name there, and the
    processes whose CPU counts (the client's own is measured in this process)."""

    label: str
    target: str | StdioServerParameters
    tool: str
    processes: dict[str, int] = field(default_factory=dict)
    spawns_upstream: bool = False  # a stdio client starts its own upstream: its pid is found once started


async def sequential(path: Path_, calls: int, mode: str, profile: Path | None) -> tuple[list[float], dict[str, float]]:
    """Latency samples (ms), and the CPU each process spent per call (ms), the client included."""
    before_children = children_of(os.getpid())
    async with Client(path.target, mode=mode) as client:
        processes = dict(path.processes)
        if path.spawns_upstream:
            started = children_of(os.getpid()) - before_children
            if started:
                processes["upstream"] = min(started)
        for _ in range(min(50, calls)):
            await client.call_tool(path.tool, {"text": "warm-up"})
        samples = []
        async with profiled(processes.get("frontend"), profile):
            before = {name: cpu_seconds(pid) for name, pid in processes.items()}
            client_before = time.process_time()
            for i in range(calls):
                start = time.perf_counter()
                await client.call_tool(path.tool, {"text": f"call {i}"})
                samples.append((time.perf_counter() - start) * 1000)
            cpu = {"client": time.process_time() - client_before}
            cpu.update({name: cpu_seconds(pid) - before[name] for name, pid in processes.items()})
        return samples, {name: seconds * 1000 / calls for name, seconds in cpu.items()}


@asynccontextmanager
async def profiled(pid: int | None, out: Path | None) -> AsyncIterator[None]:
    """py-spy sampling `pid`'s CPU (GIL holders) while the block runs, its collapsed stacks written to `out`."""
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
            "--gil",
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


async def concurrent(path: Path_, clients: int, per_client: int, mode: str) -> float:
    """Calls per second with `clients` connected clients calling at once."""
    ready = trio.Event()
    connected = 0
    finished: list[float] = []

    async def one(index: int) -> None:
        nonlocal connected
        async with Client(path.target, mode=mode) as client:
            await client.call_tool(path.tool, {"text": "warm-up"})
            connected += 1
            if connected == clients:
                ready.set()
            await ready.wait()
            for i in range(per_client):
                await client.call_tool(path.tool, {"text": f"{index}/{i}"})
            finished.append(time.perf_counter())  # before the client's teardown, which is not a call

    start = 0.0
    async with trio.open_nursery() as nursery:
        for index in range(clients):
            nursery.start_soon(one, index)
        await ready.wait()
        start = time.perf_counter()
    return clients * per_client / (max(finished) - start)


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
async def http_upstream() -> AsyncIterator[tuple[subprocess.Popen[bytes], str]]:
    """The echo upstream serving streamable HTTP on loopback, ready for clients: (process, url)."""
    port = free_port()
    process = subprocess.Popen(
        [*ECHO, "--http", str(port)],
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


async def through(
    exits: contextlib.AsyncExitStack, label: str, workdir: Path, server: dict[str, Any], python: str
) -> Path_:
    """mcpvisor (the build `python` runs) in front of `server` as `echo`: its path and processes."""
    stack = await exits.enter_async_context(open_stack(workdir, {"echo": server}, python=python))
    processes = {role(pid): pid for pid in stack.pids() if pid != stack.process.pid and role(pid) != "worker"}
    processes["worker"] = stack.status()["echo"]["pid"]
    return Path_(label, stack.direct_url, "echo:echo", processes)


async def main(args: argparse.Namespace) -> None:
    results: dict[tuple[str, str, str], list[dict[str, float]]] = {}
    cpu: dict[tuple[str, str, str], list[dict[str, float]]] = {}
    async with contextlib.AsyncExitStack() as exits:
        tmp = Path(exits.enter_context(tempfile.TemporaryDirectory()))
        builds = {"mcpvisor": sys.executable, **({"before": args.before} if args.before else {})}
        paths: dict[str, list[Path_]] = {}
        if "stdio" in args.upstreams:
            found = [
                Path_("direct", StdioServerParameters(command=ECHO[0], args=ECHO[1:]), "echo", spawns_upstream=True)
            ]
            for label, python in builds.items():
                found.append(await through(exits, label, tmp / f"{label}-stdio", echo_server(), python))
            if args.peer:
                (tmp / "peer").mkdir()
                peer, peer_url = await exits.enter_async_context(open_peer({"echo": echo_server()}, tmp / "peer"))
                # The proxy starts a process of its upstream for each client's session and ends it with
                # the session, so only the proxy's own CPU can be followed from here.
                found.append(Path_("fastmcp", peer_url, await peer_target(peer_url), {"frontend": peer.pid}))
            paths["stdio"] = found
        if "http" in args.upstreams:
            upstream, url = await exits.enter_async_context(http_upstream())
            found = [Path_("direct", url, "echo", {"upstream": upstream.pid})]
            for label, python in builds.items():
                server = {"url": url, "transport": "streamable-http"}
                built = await through(exits, label, tmp / f"{label}-http", server, python)
                built.processes["upstream"] = upstream.pid
                found.append(built)
            paths["http"] = found
        for round_ in range(args.rounds):
            for upstream_kind, found in paths.items():
                for mode in args.modes:
                    for path in found:
                        key = (upstream_kind, mode, path.label)
                        print(f"round {round_ + 1}: {upstream_kind} {ERAS[mode]} {path.label} ...", file=sys.stderr)
                        out = None
                        if args.profile and path.label == "mcpvisor" and round_ == 0:
                            out = args.profile / f"frontend-{upstream_kind}-{ERAS[mode]}.txt"
                        samples, used = await sequential(path, args.calls, mode, out)
                        rate = await concurrent(path, args.clients, args.per_client, mode)
                        results.setdefault(key, []).append(
                            {"p50": statistics.median(samples), "p99": percentile(samples, 0.99), "rate": rate}
                        )
                        cpu.setdefault(key, []).append(used)
        report(args, paths, results, cpu)


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    keys = {key for run in runs for key in run}
    return {key: statistics.median(run[key] for run in runs if key in run) for key in keys}


def report(
    args: argparse.Namespace,
    paths: dict[str, list[Path_]],
    results: dict[tuple[str, str, str], list[dict[str, float]]],
    cpu: dict[tuple[str, str, str], list[dict[str, float]]],
) -> None:
    print(
        f"\ntools/call of a small upstream tool: {args.calls} sequential calls; "
        f"{args.clients} clients x {args.per_client} calls concurrently; median of {args.rounds} round(s)"
    )
    targets = {
        ("stdio", "p50"): "<= 1.3x",
        ("stdio", "rate"): ">= 0.8x",
        ("http", "p50"): "<= 1.5x",
    }
    for upstream_kind, found in paths.items():
        labels = [path.label for path in found]
        others = labels[1:]
        header = "".join(f" {label:>9} {'ratio':>6}" for label in others)
        print(f"\n{upstream_kind} upstream")
        print(f"{'protocol':<11} {'metric':<21} {'direct':>8}{header}  target")
        for mode in args.modes:
            direct = median_of(results[(upstream_kind, mode, "direct")])
            for metric, key, fmt in (
                ("p50 latency (ms)", "p50", ".2f"),
                ("p99 latency (ms)", "p99", ".2f"),
                (f"calls/s, {args.clients} clients", "rate", ".0f"),
            ):
                cells = ""
                for label in others:
                    value = median_of(results[(upstream_kind, mode, label)])[key]
                    cells += f" {value:>9{fmt}} {value / direct[key]:>5.2f}x"
                target = targets.get((upstream_kind, key), "") if mode == "auto" else ""
                print(f"{ERAS[mode]:<11} {metric:<21} {direct[key]:>8{fmt}}{cells}  {target}")
    print("\nCPU per call in the sequential run (ms), by process (the frontend's: mcpvisor's own work)")
    print(
        f"{'upstream':<9} {'protocol':<11} {'path':<9} {'client':>7} {'frontend':>9} {'worker':>7} {'upstream':>9} {'total':>7}"
    )
    for upstream_kind, found in paths.items():
        for mode in args.modes:
            for path in found:
                row = median_of(cpu[(upstream_kind, mode, path.label)])
                cells = [f"{row[name]:>{width}.2f}" if name in row else f"{'-':>{width}}" for name, width in _COLUMNS]
                total = sum(row.values())
                print(f"{upstream_kind:<9} {ERAS[mode]:<11} {path.label:<9} {' '.join(cells)} {total:>7.2f}")
    print("\ntargets (2026-07-28 unless said)")
    for line in verdicts(args, paths, results, cpu):
        print(line)
    for path in sorted(args.profile.glob("frontend-*.txt")) if args.profile else ():
        print(f"\n{path.name}: share of samples (on the stack / at its top)")
        for frame, anywhere, top in hottest(path):
            print(f"{anywhere:>6.1%} {top:>6.1%}  {frame}")


def verdicts(
    args: argparse.Namespace,
    paths: dict[str, list[Path_]],
    results: dict[tuple[str, str, str], list[dict[str, float]]],
    cpu: dict[tuple[str, str, str], list[dict[str, float]]],
) -> list[str]:
    """One line per target: what was measured, the target, and whether it was met."""

    def of(kind: str, mode: str, label: str, key: str) -> float | None:
        runs = results.get((kind, mode, label))
        return median_of(runs)[key] if runs else None

    lines = []

    def check(text: str, now: float | None, then: float | None, limit: float, at_most: bool) -> None:
        if now is None or then is None:
            return
        ratio = now / then
        met = ratio <= limit if at_most else ratio >= limit
        sign = "<=" if at_most else ">="
        lines.append(f"{text:<58} {ratio:>5.2f}x  {sign} {limit}x  {'met' if met else 'NOT met'}")

    auto = "auto" if "auto" in args.modes else None
    if auto:
        check("stdio p50, mcpvisor / direct over stdio", *_pair(of, "stdio", auto, "p50"), 1.3, True)
        check("stdio calls/s, mcpvisor / direct over stdio", *_pair(of, "stdio", auto, "rate"), 0.8, False)
        if "http" in paths and "stdio" in paths:
            # The baseline the figures before this bench were taken against: the same echo server,
            # reached directly over streamable HTTP.
            check(
                "stdio p50, mcpvisor / the echo server direct over HTTP",
                of("stdio", auto, "mcpvisor", "p50"),
                of("http", auto, "direct", "p50"),
                1.3,
                True,
            )
            check(
                "stdio calls/s, mcpvisor / the echo server direct over HTTP",
                of("stdio", auto, "mcpvisor", "rate"),
                of("http", auto, "direct", "rate"),
                0.8,
                False,
            )
        check("http p50, mcpvisor / direct", *_pair(of, "http", auto, "p50"), 1.5, True)
    if args.before:
        for kind in paths:
            for mode in args.modes:
                now = median_of(cpu[(kind, mode, "mcpvisor")])["frontend"]
                then = median_of(cpu[(kind, mode, "before")])["frontend"]
                check(f"{kind} {ERAS[mode]} frontend CPU per call, this build / before", now, then, 0.5, True)
        if "legacy" in args.modes:
            for kind in paths:
                now, then = of(kind, "legacy", "mcpvisor", "p50"), of(kind, "legacy", "before", "p50")
                check(f"{kind} 2025-11-25 p50, this build / before", now, then, 1.0, True)
                now, then = of(kind, "legacy", "mcpvisor", "rate"), of(kind, "legacy", "before", "rate")
                check(f"{kind} 2025-11-25 calls/s, this build / before", now, then, 1.0, False)
    return lines


def _pair(of: Any, kind: str, mode: str, key: str) -> tuple[float | None, float | None]:
    return of(kind, mode, "mcpvisor", key), of(kind, mode, "direct", key)


_COLUMNS = (("client", 7), ("frontend", 9), ("worker", 7), ("upstream", 9))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--per-client", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=1, help="measure everything this many times, interleaved")
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["auto", "legacy"],
        choices=["auto", "legacy"],
        help="client protocol: auto (2026-07-28) and/or legacy (handshake era)",
    )
    parser.add_argument("--upstreams", nargs="+", default=["stdio", "http"], choices=["stdio", "http"])
    parser.add_argument("--before", help="the python of another mcpvisor build to measure beside this one")
    parser.add_argument("--peer", action="store_true", help="also measure FastMCP's proxy on the same upstream")
    parser.add_argument("--profile", type=Path, help="sample the frontend with py-spy into this folder")
    args = parser.parse_args()
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    trio.run(main, args)
