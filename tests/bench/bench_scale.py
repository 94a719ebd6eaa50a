"""How mcpvisor scales with the number of upstreams and tools, and what it costs in memory.

    python tests/bench/bench_scale.py [--upstreams 50] [--tries 5] [--peer]

Prints one table:
1. N stdio upstreams (tests/upstreams/echo_server.py): from `mcpvisor serve` to every upstream's
   tools listed on /mcp/direct, and the PSS (from /proc/PID/smaps_rollup) of every mcpvisor
   process: the median worker, the frontend, the supervisor, the forkserver, and their total.
   The upstreams' own memory is printed apart: it is the same whoever runs them.
2. kill -9 of a worker to its replacement connected and starting its upstream (the moment the
   new worker's upstream process exists; the upstream's own start is excluded), median of tries.
3. 20 upstreams x 500 tools (tests/upstreams/many_tools_server.py): tools/list of all 10,000
   tools on /mcp/direct, every page, p50 over repeats; and retrieve_tools on /mcp, p50.
With `--peer`, the same figures for FastMCP's proxy (fastmcp==4.1.2, installed by this script
into its own virtualenv under ~/.cache/mcpvisor-bench) on the same upstreams.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import trio
from mcp import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.support.stack import Stack, echo_server, free_port, open_stack, python_server, wait_listening

PEER_VERSION = "4.1.2"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mcpvisor-bench"
QUERIES = ("list invoices", "create a calendar entry", "weather report", "search tickets", "export database rows")


# -- /proc --------------------------------------------------------------------------------------


def pss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def children(pid: int) -> set[int]:
    found: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as listing:
                found.update(int(child) for child in listing.read().split())
        except OSError:
            continue
    return found


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            return file.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def tree(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        for child in children(todo.pop()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


# -- clients ------------------------------------------------------------------------------------


async def list_all_tools(client: Client) -> list[Any]:
    tools: list[Any] = []
    cursor: str | None = None
    while True:
        page = await client.list_tools(cursor=cursor, cache_mode="bypass")
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools


async def wait_listed(url: str, servers: list[str], separator: str, timeout: float) -> float | None:
    """Poll tools/list until every server has tools in it: when that happened (perf_counter), or
    None when `timeout` passed first."""
    wanted = set(servers)
    seen: set[str] = set()
    with trio.move_on_after(timeout):
        while True:
            try:
                async with Client(url, mode="legacy") as client:
                    while True:
                        seen = {tool.name.split(separator, 1)[0] for tool in await list_all_tools(client)}
                        if wanted <= seen:
                            return time.perf_counter()
                        await trio.sleep(0.1)
            except Exception as exc:  # not serving yet, or restarting: any failure means "try again"
                print(f"  waiting for {url}: {type(exc).__name__}", file=sys.stderr)
                await trio.sleep(0.2)
    print(f"  gave up after {timeout:g} s: {len(wanted & seen)} of {len(wanted)} servers listed", file=sys.stderr)
    return None


def since(started: float, listed: float | None, timeout: float) -> float | str:
    return listed - started if listed is not None else f"> {timeout:g}"


async def time_list(url: str, repeats: int, mode: str) -> tuple[float, int]:
    """p50 (ms) of listing every tool, all pages, on one connected client; and how many tools."""
    async with Client(url, mode=mode) as client:
        count = len(await list_all_tools(client))
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            await list_all_tools(client)
            samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples), count


async def time_search(url: str, repeats: int) -> float:
    async with Client(url, mode="legacy") as client:
        await client.call_tool("retrieve_tools", {"query": QUERIES[0]})
        samples = []
        for i in range(repeats):
            start = time.perf_counter()
            await client.call_tool("retrieve_tools", {"query": QUERIES[i % len(QUERIES)]})
            samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


# -- mcpvisor -----------------------------------------------------------------------------------


def mcpvisor_memory(stack: Stack) -> dict[str, float]:
    rows = stack.status()
    workers = {row["pid"] for name, row in rows.items() if name != "frontend" and row["pid"]}
    supervisor = stack.process.pid
    own = children(supervisor)
    forkservers = [pid for pid in own if pid not in workers and "mcpvisor.workers.forkserver" in cmdline(pid)]
    upstreams = set().union(*(tree(pid) for pid in workers)) if workers else set()
    worker_pss = sorted(pss_mb(pid) for pid in workers)
    memory = {
        "worker": statistics.median(worker_pss),
        "worker_max": worker_pss[-1],
        "frontend": pss_mb(rows["frontend"]["pid"]),
        "supervisor": pss_mb(supervisor),
        "forkserver": sum(pss_mb(pid) for pid in forkservers),
        "upstreams": sum(pss_mb(pid) for pid in upstreams),
    }
    memory["total"] = sum(worker_pss) + memory["frontend"] + memory["supervisor"] + memory["forkserver"]
    return memory


async def respawn_times(stack: Stack, server: str, tries: int) -> list[float]:
    """kill -9 of the worker -> the new worker's upstream process exists (seconds)."""
    samples = []
    supervisor = stack.process.pid
    for attempt in range(tries):
        await stack.wait_ready([server], timeout=120)
        old = stack.status()[server]["pid"]
        others = children(supervisor) - {old}
        os.kill(old, signal.SIGKILL)
        killed = time.perf_counter()
        with trio.fail_after(60):
            while True:
                fresh = children(supervisor) - others - {old}
                if any(children(pid) for pid in fresh):
                    break
                await trio.sleep(0.002)
        samples.append(time.perf_counter() - killed)
        print(f"  respawn {attempt + 1}/{tries}: {samples[-1] * 1000:.0f} ms", file=sys.stderr)
    return samples


async def measure_mcpvisor(args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    names = [f"echo{i}" for i in range(args.upstreams)]
    with tempfile.TemporaryDirectory() as tmp:
        print(f"mcpvisor: starting {args.upstreams} upstreams ...", file=sys.stderr)
        started = time.perf_counter()
        async with open_stack(Path(tmp), {name: echo(name) for name in names}, wait_for=[]) as stack:
            listed = await wait_listed(stack.direct_url, names, ":", args.timeout)
            figures["listed"] = since(started, listed, args.timeout)
            await stack.wait_ready(names, timeout=args.timeout)
            await trio.sleep(2)  # let start-up garbage settle before measuring memory
            figures["memory"] = mcpvisor_memory(stack)
            print(f"  listed after {figures['listed']} s; PSS (MB) {figures['memory']}", file=sys.stderr)
            figures["respawn"] = statistics.median(await respawn_times(stack, names[0], args.tries))
    with tempfile.TemporaryDirectory() as tmp:
        print("mcpvisor: 20 upstreams x 500 tools ...", file=sys.stderr)
        servers = {name: many_tools(name) for name in many_names()}
        async with open_stack(Path(tmp), servers, wait_for=[]) as stack:
            await wait_listed(stack.direct_url, many_names(), ":", args.timeout)
            for mode in ("legacy", "auto"):
                figures[f"list_{mode}"], figures["tools"] = await time_list(stack.direct_url, args.repeats, mode)
                print(f"  tools/list ({mode}): {figures[f'list_{mode}']:.1f} ms p50", file=sys.stderr)
            figures["search"] = await time_search(stack.url, args.repeats * 5)
            print(f"  retrieve_tools: {figures['search']:.1f} ms p50", file=sys.stderr)
    return figures


# Twenty upstreams starting at once on a loaded two-core machine need more than the default 30 s.
PATIENT = {"policy": {"init_timeout": 600, "discovery_timeout": 600}}


def echo(name: str) -> dict[str, Any]:
    return echo_server(name, **PATIENT)


def many_names() -> list[str]:
    return [f"many{i}" for i in range(20)]


def many_tools(name: str) -> dict[str, Any]:
    return python_server("many_tools_server.py", "--name", name, "--tools", "500", **PATIENT)


# -- FastMCP's proxy ----------------------------------------------------------------------------


PEER_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from fastmcp.server import create_proxy

    config = json.load(open(sys.argv[1]))
    proxy = create_proxy(config, name="peer")
    proxy.run("http", host="127.0.0.1", port=int(sys.argv[2]), show_banner=False)
    """
)


def peer_python() -> Path:
    """FastMCP in a virtualenv of its own (created on first use), so its SDK never meets ours."""
    venv = CACHE / f"fastmcp-{PEER_VERSION}"
    python = venv / "bin" / "python"
    marker = venv / ".installed"
    if not marker.exists():
        print(f"installing fastmcp=={PEER_VERSION} into {venv} ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"fastmcp=={PEER_VERSION}"], check=True)
        marker.touch()
    return python


@asynccontextmanager
async def open_peer(
    servers: dict[str, dict[str, Any]], workdir: Path
) -> AsyncIterator[tuple[subprocess.Popen[bytes], str]]:
    python = peer_python()
    config = workdir / "peer.json"
    # The same command lines; the policy table is mcpvisor's own.
    tables = {name: {"command": s["command"], "args": s["args"], "transport": "stdio"} for name, s in servers.items()}
    config.write_text(json.dumps({"mcpServers": tables}))
    script = workdir / "peer.py"
    script.write_text(PEER_SCRIPT)
    port = free_port()
    with open(workdir / "peer.log", "ab") as log:
        process = subprocess.Popen(
            [str(python), str(script), str(config), str(port)], stdout=log, stderr=log, start_new_session=True
        )
    try:
        await wait_listening(port, process, timeout=300)
        yield process, f"http://127.0.0.1:{port}/mcp"
    finally:
        for pid in tree(process.pid) | {process.pid}:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait()


async def measure_peer(args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    names = [f"echo{i}" for i in range(args.upstreams)]
    peer_python()
    with tempfile.TemporaryDirectory() as tmp:
        print(f"FastMCP: starting {args.upstreams} upstreams ...", file=sys.stderr)
        started = time.perf_counter()
        async with open_peer({name: echo(name) for name in names}, Path(tmp)) as (process, url):
            listed = await wait_listed(url, names, "_", args.timeout)
            figures["listed"] = since(started, listed, args.timeout)
            # Measured with a client connected: the proxy may close its upstream sessions without one.
            async with Client(url, mode="legacy") as client:
                await list_all_tools(client)
                await trio.sleep(2)
                upstreams = tree(process.pid)
                figures["memory"] = {
                    "total": pss_mb(process.pid),
                    "upstreams": sum(pss_mb(pid) for pid in upstreams),
                }
            print(f"  listed after {figures['listed']} s; PSS (MB) {figures['memory']}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        print("FastMCP: 20 upstreams x 500 tools ...", file=sys.stderr)
        async with open_peer({name: many_tools(name) for name in many_names()}, Path(tmp)) as (_, url):
            try:
                if await wait_listed(url, many_names(), "_", args.timeout) is None:
                    raise TimeoutError(f"not every server listed within {args.timeout:g}s")
                for mode in ("legacy", "auto"):
                    figures[f"list_{mode}"], figures["tools"] = await time_list(url, args.repeats, mode)
            except Exception as exc:  # a peer that cannot list them is a figure too
                print(f"  FastMCP failed to list 10,000 tools: {type(exc).__name__}: {exc}", file=sys.stderr)
                figures["list_legacy"] = figures["list_auto"] = "failed"
    return figures


# -- the table ----------------------------------------------------------------------------------


def cell(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return format(value, fmt)


async def main(args: argparse.Namespace) -> None:
    peer = await measure_peer(args) if args.peer or args.peer_only else None
    if args.peer_only:
        print(json.dumps(peer, indent=1))
        return
    ours = await measure_mcpvisor(args)
    n = args.upstreams
    mem, peer_mem = ours["memory"], (peer or {}).get("memory", {})
    rows = [
        (f"{n} stdio upstreams: start to every tool listed (s)", ours["listed"], (peer or {}).get("listed"), ".1f", ""),
        ("PSS, median worker (MB)", mem["worker"], None, ".1f", "<= 12"),
        ("PSS, largest worker (MB)", mem["worker_max"], None, ".1f", ""),
        ("PSS, frontend (MB)", mem["frontend"], None, ".1f", ""),
        ("PSS, supervisor (MB)", mem["supervisor"], None, ".1f", ""),
        ("PSS, forkserver (MB)", mem["forkserver"], None, ".1f", ""),
        ("PSS, all gateway processes (MB)", mem["total"], peer_mem.get("total"), ".0f", ""),
        ("PSS, the upstreams themselves (MB)", mem["upstreams"], peer_mem.get("upstreams"), ".0f", ""),
        ("kill -9 worker -> upstream starting again (ms)", ours["respawn"] * 1000, None, ".0f", "<= 300"),
        (
            f"tools/list of {ours['tools']} tools, all pages, 2025-11-25 (ms p50)",
            ours["list_legacy"],
            (peer or {}).get("list_legacy"),
            ".1f",
            "<= 50",
        ),
        (
            f"tools/list of {ours['tools']} tools, all pages, 2026-07-28 (ms p50)",
            ours["list_auto"],
            (peer or {}).get("list_auto"),
            ".1f",
            "<= 50",
        ),
        (f"retrieve_tools over {ours['tools']} tools (ms p50)", ours["search"], None, ".1f", "<= 5"),
    ]
    print()
    print(f"{'figure':<66} {'mcpvisor':>10} {'FastMCP':>10}  target")
    for label, value, peer_value, fmt, target in rows:
        print(f"{label:<66} {cell(value, fmt):>10} {cell(peer_value, fmt) if peer else '':>10}  {target}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstreams", type=int, default=50)
    parser.add_argument("--tries", type=int, default=5, help="kill -9 respawns to take the median of")
    parser.add_argument("--repeats", type=int, default=20, help="full listings to take the p50 of")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for every upstream")
    parser.add_argument("--peer", action="store_true", help=f"also measure FastMCP {PEER_VERSION}'s proxy")
    parser.add_argument("--peer-only", action="store_true", help="measure FastMCP's proxy alone")
    trio.run(main, parser.parse_args())
