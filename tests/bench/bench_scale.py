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
   tools on /mcp/direct, every page, p50 over repeats, for each protocol era; and retrieve_tools
   on /mcp, p50. Each twice: with the SDK's `Client` (whose own validation of 10,000 tool
   models is most of its time), and with a bare HTTP/1.1 client that decodes each answer with
   msgspec (the frontend's cost plus the transfer); with the frontend's CPU per listing or call
   (from /proc/PID/stat), and the search and its answer's encoding timed in this process.
With `--peer`, the same figures for FastMCP's proxy (fastmcp==4.1.2, installed by this script
into its own virtualenv under ~/.cache/mcpvisor-bench) on the same upstreams. `--lists-only`
measures part 3 alone.
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

import msgspec
import trio
from mcp import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "upstreams"))
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


# -- a bare HTTP/1.1 client ---------------------------------------------------------------------

MODERN = "2026-07-28"
HANDSHAKE = "2025-11-25"
_MODERN_META = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}
_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used so far, from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


class BareHTTP:
    """One keep-alive connection speaking just enough HTTP/1.1 for MCP's JSON and SSE answers, so
    that what is timed is the server and the transfer, not a client library's own work."""

    def __init__(self, stream: trio.SocketStream, host: str) -> None:
        self.stream = stream
        self.host = host
        self.buffer = bytearray()

    @classmethod
    @asynccontextmanager
    async def open(cls, url: str) -> AsyncIterator[BareHTTP]:
        host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
        stream = await trio.open_tcp_stream(host, int(port))
        try:
            yield cls(stream, f"{host}:{port}")
        finally:
            await stream.aclose()

    async def post(self, path: str, headers: dict[str, str], body: bytes) -> tuple[dict[str, str], bytes]:
        lines = [f"POST {path} HTTP/1.1", f"host: {self.host}", f"content-length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        await self.stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        head = await self._until(b"\r\n\r\n")
        status, *fields = head.decode("latin-1").split("\r\n")
        found = {name.lower(): value.strip() for name, _, value in (f.partition(":") for f in fields)}
        if "content-length" in found:
            data = await self._exactly(int(found["content-length"]))
        elif found.get("transfer-encoding") == "chunked":
            data = b""
            while size := int(await self._until(b"\r\n"), 16):
                data += await self._exactly(size)
                await self._until(b"\r\n")
            await self._until(b"\r\n")
        else:
            raise RuntimeError(f"unexpected answer: {status}")
        if found.get("content-type", "").startswith("text/event-stream"):
            # The one JSON-RPC answer in the stream (a cancelled call has none).
            events = [line[5:].strip() for line in data.split(b"\n") if line.startswith(b"data:")]
            data = next((event for event in events if event), b"")
        return found, data

    async def _until(self, end: bytes) -> bytes:
        while (at := self.buffer.find(end)) < 0:
            await self._fill()
        found = bytes(self.buffer[:at])
        del self.buffer[: at + len(end)]
        return found

    async def _exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            await self._fill()
        found = bytes(self.buffer[:size])
        del self.buffer[:size]
        return found

    async def _fill(self) -> None:
        chunk = await self.stream.receive_some(1 << 20)
        if not chunk:
            raise RuntimeError("the server closed the connection")
        self.buffer += chunk


class BareClient:
    """An MCP client on `BareHTTP`: 2026-07-28 requests without a session, or a 2025-11-25 session."""

    def __init__(self, http: BareHTTP, path: str, era: str) -> None:
        self.http = http
        self.path = path
        self.era = era
        self.headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
        self.next_id = 0

    @classmethod
    @asynccontextmanager
    async def open(cls, url: str, era: str) -> AsyncIterator[BareClient]:
        async with BareHTTP.open(url) as http:
            client = cls(http, "/" + url.split("//", 1)[1].split("/", 1)[1], era)
            if era == HANDSHAKE:
                await client._initialize()
            yield client

    async def _initialize(self) -> None:
        capabilities = {
            "protocolVersion": HANDSHAKE,
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"},
        }
        opening = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": capabilities}
        headers, _ = await self.http.post(self.path, self.headers, msgspec.json.encode(opening))
        self.headers.update({"mcp-session-id": headers["mcp-session-id"], "mcp-protocol-version": HANDSHAKE})
        await self.http.post(self.path, self.headers, b'{"jsonrpc":"2.0","method":"notifications/initialized"}')

    async def request(self, method: str, params: dict[str, Any], name: str | None = None) -> Any:
        answer = msgspec.json.decode(await self._post(method, params, name))
        if "result" not in answer:
            raise RuntimeError(f"{method}: {answer.get('error')}")
        return answer["result"]

    async def _post(self, method: str, params: dict[str, Any], name: str | None = None) -> bytes:
        self.next_id += 1
        headers = self.headers
        if self.era == MODERN:
            params = {**params, "_meta": _MODERN_META}
            headers = {**headers, "mcp-protocol-version": MODERN, "mcp-method": method}
            if name is not None:
                headers["mcp-name"] = name
        message = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        _, data = await self.http.post(self.path, headers, msgspec.json.encode(message))
        return data

    async def list_tools(self) -> int:
        """Every page of tools/list: how many tools.

        Each page is parsed whole (msgspec checks it is JSON), but the tools are kept as their
        bytes: building 10,000 Python dicts is a client's own work, not the gateway's.
        """
        count, cursor = 0, None
        while True:
            answer = _decode_page(await self._post("tools/list", {"cursor": cursor} if cursor else {}))
            if answer.result is None:
                raise RuntimeError(f"tools/list: {answer.error}")
            count += len(answer.result.tools)
            cursor = answer.result.nextCursor
            if not cursor:
                return count


class _Page(msgspec.Struct):
    tools: list[msgspec.Raw]
    nextCursor: str | None = None


class _PageAnswer(msgspec.Struct):
    result: _Page | None = None
    error: Any = None


_decode_page = msgspec.json.Decoder(_PageAnswer).decode


# -- 10,000 tools ------------------------------------------------------------------------------


async def timed(operation: Any, repeats: int, pid: int) -> tuple[float, float]:
    """(p50 ms, the process `pid`'s CPU ms per operation) of `await operation(i)` run `repeats` times."""
    await operation(0)
    samples = []
    cpu = cpu_seconds(pid)
    for i in range(repeats):
        start = time.perf_counter()
        await operation(i)
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples), (cpu_seconds(pid) - cpu) * 1000 / repeats


async def settle(pid: int, timeout: float = 120) -> None:
    """Wait until the process is (almost) idle: the search index has taken in every server."""
    with trio.move_on_after(timeout):
        while True:
            cpu = cpu_seconds(pid)
            await trio.sleep(1)
            if cpu_seconds(pid) - cpu < 0.03:
                return


async def measure_catalog(stack: Stack, repeats: int) -> dict[str, Any]:
    """The list and search figures of part 3, on a stack whose upstreams are all listed."""
    figures: dict[str, Any] = {}
    pid = stack.status()["frontend"]["pid"]
    async with Client(stack.url, mode="legacy") as client:
        await client.call_tool("retrieve_tools", {"query": QUERIES[0]})  # waits for the index
    await settle(pid)
    for era, mode in ((HANDSHAKE, "legacy"), (MODERN, "auto")):
        async with Client(stack.direct_url, mode=mode) as client:
            figures["tools"] = len(await list_all_tools(client))

            async def sdk_list(_: int, client: Client = client) -> None:
                await list_all_tools(client)

            figures[f"list_sdk_{era}"], figures[f"list_sdk_cpu_{era}"] = await timed(sdk_list, repeats, pid)
        async with BareClient.open(stack.direct_url, era) as bare:

            async def bare_list(_: int, bare: BareClient = bare) -> None:
                await bare.list_tools()

            figures[f"list_bare_{era}"], figures[f"list_bare_cpu_{era}"] = await timed(bare_list, repeats, pid)
        print(
            f"  tools/list ({era}): {figures[f'list_sdk_{era}']:.1f} ms SDK, {figures[f'list_bare_{era}']:.1f} ms bare",
            file=sys.stderr,
        )
    async with Client(stack.url, mode="legacy") as client:

        async def sdk_search(i: int) -> None:
            await client.call_tool("retrieve_tools", {"query": QUERIES[i % len(QUERIES)]})

        figures["search_sdk"], figures["search_sdk_cpu"] = await timed(sdk_search, repeats * 5, pid)
    for era in (HANDSHAKE, MODERN):
        async with BareClient.open(stack.url, era) as bare:

            async def bare_search(i: int, bare: BareClient = bare) -> None:
                arguments = {"name": "retrieve_tools", "arguments": {"query": QUERIES[i % len(QUERIES)]}}
                result = await bare.request("tools/call", arguments, name="retrieve_tools")
                assert not result.get("isError") and result["structuredContent"]["tools"], result

            figures[f"search_bare_{era}"], figures[f"search_cpu_{era}"] = await timed(bare_search, repeats * 5, pid)
    print(
        f"  retrieve_tools: {figures['search_sdk']:.1f} ms SDK, {figures[f'search_bare_{HANDSHAKE}']:.1f} / "
        f"{figures[f'search_bare_{MODERN}']:.1f} ms bare",
        file=sys.stderr,
    )
    figures.update(search_stages(repeats * 5))
    # Other processes on the machine stretch wall times, not the CPU figures: say how loaded it was.
    figures["load"] = os.getloadavg()[0]
    return figures


def search_stages(repeats: int) -> dict[str, float]:
    """The search and the encoding of its answer, timed in this process over the same 10,000 tools."""
    from many_tools_server import tools

    from mcpvisor.frontend.door.search import ToolIndex
    from mcpvisor.frontend.tool_args import json_result

    index = ToolIndex()
    definitions = {}
    for server in many_names():
        listed = tools(server, 500)
        index.set_server_tools(server, listed)
        definitions.update({(server, tool["name"]): tool for tool in listed})
    servers = many_names()
    search, encode = [], []
    for i in range(repeats):
        start = time.perf_counter()
        hits = index.search(QUERIES[i % len(QUERIES)], 15, servers=servers)
        searched = time.perf_counter()
        entries = [
            {
                "name": f"{hit.server}:{hit.tool}",
                "server": hit.server,
                "description": definitions[hit.server, hit.tool]["description"],
                "inputSchema": definitions[hit.server, hit.tool]["inputSchema"],
                "score": round(hit.score, 4),
                "call_with": "call_tool_write",
            }
            for hit in hits
        ]
        json_result({"query": QUERIES[i % len(QUERIES)], "tools": entries, "total": len(entries)})
        search.append((searched - start) * 1000)
        encode.append((time.perf_counter() - searched) * 1000)
    return {"search_index": statistics.median(search), "search_encode": statistics.median(encode)}


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
        # A worker is RUNNING once it has lived `startsecs`; one killed before that counts as a
        # failed start, and the next is delayed by the backoff, which is not what this measures.
        rows = await stack.wait_status(lambda rows: rows[server]["state"] == "RUNNING", timeout=120)
        old = rows[server]["pid"]
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
    figures: dict[str, Any] = {"listed": None, "memory": {}, "respawn": None}
    if not args.lists_only:
        figures.update(await measure_upstreams(args))
    with tempfile.TemporaryDirectory() as tmp:
        print("mcpvisor: 20 upstreams x 500 tools ...", file=sys.stderr)
        servers = {name: many_tools(name) for name in many_names()}
        async with open_stack(Path(tmp), servers, wait_for=[]) as stack:
            await wait_listed(stack.direct_url, many_names(), ":", args.timeout)
            figures.update(await measure_catalog(stack, args.repeats))
    return figures


async def measure_upstreams(args: argparse.Namespace) -> dict[str, Any]:
    """Parts 1 and 2: N small upstreams started, listed, weighed; a worker killed and respawned."""
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
    n, tools = args.upstreams, ours["tools"]
    mem, peer_mem, theirs = ours["memory"], (peer or {}).get("memory", {}), peer or {}
    rows: list[tuple[str, Any, Any, str, str]] = []
    if not args.lists_only:
        rows += [
            (f"{n} stdio upstreams: start to every tool listed (s)", ours["listed"], theirs.get("listed"), ".1f", ""),
            ("PSS, median worker (MB)", mem["worker"], None, ".1f", "<= 12"),
            ("PSS, largest worker (MB)", mem["worker_max"], None, ".1f", ""),
            ("PSS, frontend (MB)", mem["frontend"], None, ".1f", ""),
            ("PSS, supervisor (MB)", mem["supervisor"], None, ".1f", ""),
            ("PSS, forkserver (MB)", mem["forkserver"], None, ".1f", ""),
            ("PSS, all gateway processes (MB)", mem["total"], peer_mem.get("total"), ".0f", ""),
            ("PSS, the upstreams themselves (MB)", mem["upstreams"], peer_mem.get("upstreams"), ".0f", ""),
            ("kill -9 worker -> upstream starting again (ms)", ours["respawn"] * 1000, None, ".0f", "<= 300"),
        ]
    for era, peer_key in ((HANDSHAKE, "list_legacy"), (MODERN, "list_auto")):
        rows += [
            (
                f"tools/list of {tools} tools, all pages, {era}, SDK Client (ms p50)",
                ours[f"list_sdk_{era}"],
                theirs.get(peer_key),
                ".1f",
                "<= 50",
            ),
            ("  the same, bare HTTP client (ms p50)", ours[f"list_bare_{era}"], None, ".1f", "<= 50"),
            (
                "  frontend CPU per listing, SDK / bare client (ms)",
                f"{ours[f'list_sdk_cpu_{era}']:.0f} / {ours[f'list_bare_cpu_{era}']:.0f}",
                None,
                "",
                "",
            ),
        ]
    rows += [
        (
            f"retrieve_tools over {tools} tools, 2025-11-25, SDK Client (ms p50)",
            ours["search_sdk"],
            None,
            ".1f",
            "<= 5",
        ),
        (
            "  bare HTTP client, 2025-11-25 / 2026-07-28 (ms p50)",
            f"{ours[f'search_bare_{HANDSHAKE}']:.1f} / {ours[f'search_bare_{MODERN}']:.1f}",
            None,
            "",
            "<= 5",
        ),
        (
            "  frontend CPU per call, SDK / bare 2025-11-25 / bare 2026-07-28 (ms)",
            f"{ours['search_sdk_cpu']:.1f} / {ours[f'search_cpu_{HANDSHAKE}']:.1f} / {ours[f'search_cpu_{MODERN}']:.1f}",
            None,
            "",
            "",
        ),
        ("  of which the search itself, in-process (ms p50)", ours["search_index"], None, ".2f", ""),
        ("  and the encoding of its answer, in-process (ms p50)", ours["search_encode"], None, ".2f", ""),
        ("load average (1 min) at the end of these figures", ours["load"], None, ".1f", ""),
    ]
    print()
    print(f"{'figure':<76} {'mcpvisor':>16} {'FastMCP':>10}  target")
    for label, value, peer_value, fmt, target in rows:
        print(f"{label:<76} {cell(value, fmt):>16} {cell(peer_value, fmt) if peer else '':>10}  {target}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstreams", type=int, default=50)
    parser.add_argument("--tries", type=int, default=5, help="kill -9 respawns to take the median of")
    parser.add_argument("--repeats", type=int, default=20, help="full listings to take the p50 of")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for every upstream")
    parser.add_argument("--peer", action="store_true", help=f"also measure FastMCP {PEER_VERSION}'s proxy")
    parser.add_argument("--peer-only", action="store_true", help="measure FastMCP's proxy alone")
    parser.add_argument("--lists-only", action="store_true", help="only the 10,000-tool list and search (part 3)")
    trio.run(main, parser.parse_args())
