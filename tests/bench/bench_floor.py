"""The floor of mcpvisor's process layout: what the cheapest Python relay with the same shape costs.

    python tests/bench/bench_floor.py [--calls 2000] [--warmup 200] [--clients 16] [--per-client 200]
                                      [--rounds 1] [--before PYTHON]

mcpvisor carries a call over three hops: the client's HTTP request to a frontend process, a ZeroMQ
message (ipc) to one worker process per upstream, and a JSON-RPC line on the upstream's stdin;
the reply goes back the same way. Each hop costs system calls, wake-ups and a Python event loop
turn in each process, whatever the code around it does. To tell whether a latency or throughput
target is reachable with this layout at all, this script measures, in one run and side by side:

- direct: a raw keep-alive HTTP/1.1 client (written here: a trio socket, Content-Length framing)
  posting a stateless 2026-07-28 `tools/call` of `echo` to tests/upstreams/echo_server.py serving
  streamable HTTP. This is what every other row is compared with.
- floor: the same client talking to a relay this file runs as two more processes of its own. The
  front (`--front`) is a trio HTTP/1.1 server with no HTTP library: it reads the head up to the
  blank line and a Content-Length body, takes the id, tool name and arguments out of the body
  with msgspec, and sends them over a pyzmq DEALER socket driven from trio on the socket's FD.
  The worker (`--worker`, a ROUTER) has done the stdio handshake with the same echo server (at
  2025-11-25) and writes each call to it as a handshake-era `tools/call` line under an id of its
  own, in a plain `zmq.Poller` loop (cheaper than any event loop), and sends the result back; the
  front splices it into the HTTP response. It checks nothing, logs nothing and keeps no state
  beyond the calls in flight: no product can be cheaper in this shape, so its figures are a bound
  on what mcpvisor can reach, not a target for it.
- mcpvisor: the real stack (tests.support.stack.open_stack), tool `echo:echo` on `/mcp/direct`,
  driven by the same raw client; the frontend's MCP engine answers these calls, as it answers every
  request.

`--before PYTHON` adds another build of mcpvisor (the interpreter of a checkout's virtualenv) in
front of its own echo upstream, driven the same way: the raw client leaves the client's own CPU out
of the comparison, which the SDK's client in bench_latency.py does not. With `--rounds N` every
path is measured N times, in turns, and medians are printed.

For each: p50/p90 latency of sequential calls, calls per second with `--clients` concurrent
clients (each its own keep-alive connection), and CPU per call of each process (from
/proc/PID/stat, the client's own from `time.process_time()`). "added" is the CPU of everything
but the client and the upstream: what the relay costs per call. On a machine with few cores every
process competes for them, so added CPU bounds throughput, and each hop's wake-up shows in latency.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import outcome
import trio
import zmq

SELF = Path(__file__).resolve()
REPO = SELF.parents[2]
ECHO_SERVER = REPO / "tests" / "upstreams" / "echo_server.py"
MODERN = "2026-07-28"
_TICKS = os.sysconf("SC_CLK_TCK")


# -- the floor relay: front ------------------------------------------------------------------------


class _Params(msgspec.Struct):
    name: msgspec.Raw  # kept as JSON text: it goes into the upstream's line as it came
    arguments: msgspec.Raw = msgspec.Raw(b"{}")


class _Call(msgspec.Struct):
    """What the floor reads of a client's request; other fields (the 2026 `_meta`) are skipped."""

    id: msgspec.Raw
    params: _Params


_decode_call = msgspec.json.Decoder(_Call)


class Relay:
    """The front's DEALER socket, shared by every connection's calls and driven from trio.

    ZeroMQ's FD is edge-triggered and any call into the socket may consume its edge, so (as in
    wire/zsocket.py, pared down to the one reader this needs) the reader checks EVENTS before it
    waits, and a sender that finds a reply waiting after its send wakes the reader.
    """

    def __init__(self, sock: zmq.Socket) -> None:
        self.sock = sock
        self.fd: int = sock.getsockopt(zmq.FD)
        self.pending: dict[bytes, trio.lowlevel.Task] = {}
        self.next_tag = 0
        self.parked: trio.CancelScope | None = None

    async def call(self, name: bytes, arguments: bytes) -> list[bytes]:
        """[kind, raw] of the upstream's reply: kind is b"result" or b"error"."""
        self.next_tag += 1
        tag = self.next_tag.to_bytes(8, "little")
        while True:
            try:
                self.sock.send_multipart([tag, name, arguments], flags=zmq.NOBLOCK)
                break
            except zmq.Again:  # the worker is at its high-water mark: rare, so poll
                await trio.sleep(0.001)
        if self.parked is not None and self.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            self.parked.cancel()
        # No checkpoint since the send: the reply cannot have been read before this task parks.
        self.pending[tag] = trio.lowlevel.current_task()

        def abort(_: Any) -> trio.lowlevel.Abort:
            del self.pending[tag]
            return trio.lowlevel.Abort.SUCCEEDED

        return await trio.lowlevel.wait_task_rescheduled(abort)

    async def read_replies(self) -> None:
        sock = self.sock
        while True:
            try:
                while True:
                    tag, kind, raw = sock.recv_multipart(flags=zmq.NOBLOCK)
                    task = self.pending.pop(tag, None)
                    if task is not None:
                        trio.lowlevel.reschedule(task, outcome.Value([kind, raw]))
            except zmq.Again:
                pass
            if sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                continue
            with trio.CancelScope() as self.parked:
                await trio.lowlevel.wait_readable(self.fd)
            self.parked = None


def content_length(head: bytes) -> int:
    """The Content-Length of a lower-cased HTTP head; the floor and the client frame bodies by it."""
    at = head.find(b"\r\ncontent-length:")
    if at < 0:
        raise ValueError(f"no Content-Length in {head!r}")
    end = head.find(b"\r\n", at + 2)
    return int(head[at + 17 : end if end > 0 else None])


_RESPONSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"


async def serve_connection(relay: Relay, stream: trio.SocketStream) -> None:
    """Keep-alive HTTP/1.1 in its simplest form: one request at a time, Content-Length bodies."""
    buffer = bytearray()
    while True:
        while (end := buffer.find(b"\r\n\r\n")) < 0:
            data = await stream.receive_some(65536)
            if not data:
                return
            buffer += data
        length = content_length(bytes(buffer[:end]).lower())
        start = end + 4
        while len(buffer) < start + length:
            data = await stream.receive_some(65536)
            if not data:
                return
            buffer += data
        body = bytes(buffer[start : start + length])
        del buffer[: start + length]
        call = _decode_call.decode(body)
        kind, raw = await relay.call(bytes(call.params.name), bytes(call.params.arguments))
        payload = b'{"jsonrpc":"2.0","id":' + bytes(call.id) + b',"' + kind + b'":' + raw + b"}"
        await stream.send_all(_RESPONSE_HEAD % len(payload) + payload)


async def run_front(port: int, endpoint: str) -> None:
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    relay = Relay(sock)

    async def handler(stream: trio.SocketStream) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await serve_connection(relay, stream)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(relay.read_replies)
        await trio.serve_tcp(handler, port, host="127.0.0.1")


# -- the floor relay: worker -----------------------------------------------------------------------


class _Reply(msgspec.Struct):
    id: int | str | None = None
    result: msgspec.Raw = msgspec.Raw(b"")
    error: msgspec.Raw = msgspec.Raw(b"")


_decode_reply = msgspec.json.Decoder(_Reply)


def read_line(fd: int, buffer: bytearray) -> bytes:
    """One line from a blocking fd (the handshake only)."""
    while (end := buffer.find(b"\n")) < 0:
        chunk = os.read(fd, 65536)
        if not chunk:
            raise EOFError("the upstream closed its stdout during the handshake")
        buffer += chunk
    line = bytes(buffer[:end])
    del buffer[: end + 1]
    return line


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def run_worker(endpoint: str) -> None:
    upstream = subprocess.Popen(
        [sys.executable, str(ECHO_SERVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert upstream.stdin is not None and upstream.stdout is not None
    to_upstream, from_upstream = upstream.stdin.fileno(), upstream.stdout.fileno()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # so the upstream is ended below
    try:
        buffer = bytearray()
        initialize = {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "floor", "version": "0"},
            },
        }
        write_all(to_upstream, json.dumps(initialize).encode() + b"\n")
        while json.loads(read_line(from_upstream, buffer)).get("id") != 0:
            pass
        write_all(to_upstream, b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')

        context = zmq.Context()
        router = context.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.bind(endpoint)  # the driver starts the front once this file exists
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(from_upstream, zmq.POLLIN)
        pending: dict[int, tuple[bytes, bytes]] = {}
        next_id = 0
        while True:
            for item, _ in poller.poll():
                if item is router:
                    lines = []
                    while True:
                        try:
                            peer, tag, name, arguments = router.recv_multipart(flags=zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        next_id += 1
                        pending[next_id] = (peer, tag)
                        lines.append(
                            b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%b,"arguments":%b}}\n'
                            % (next_id, name, arguments)
                        )
                    write_all(to_upstream, b"".join(lines))
                else:
                    chunk = os.read(from_upstream, 65536)
                    if not chunk:
                        return
                    buffer += chunk
                    while (end := buffer.find(b"\n")) >= 0:
                        reply = _decode_reply.decode(buffer[:end])
                        del buffer[: end + 1]
                        target = pending.pop(reply.id, None) if isinstance(reply.id, int) else None
                        if target is None:
                            continue  # a notification or a request of the upstream's: not carried
                        kind, raw = (b"result", reply.result) if len(reply.result) else (b"error", reply.error)
                        router.send_multipart([*target, kind, bytes(raw)])
    finally:
        upstream.kill()
        upstream.wait()


# -- the raw client --------------------------------------------------------------------------------


class RawClient:
    """A keep-alive HTTP/1.1 connection posting 2026-07-28 stateless `tools/call`s, as the SDK's
    client writes them (headers and `_meta`), with none of its cost."""

    def __init__(self, stream: trio.SocketStream, port: int, path: str, tool: str) -> None:
        self.stream = stream
        self.port = port
        self.tool = tool
        self.head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "accept: application/json, text/event-stream\r\ncontent-type: application/json\r\n"
            f"mcp-protocol-version: {MODERN}\r\nmcp-method: tools/call\r\nmcp-name: {tool}\r\n"
        ).encode()
        self.buffer = bytearray()
        self.next_id = 0

    @classmethod
    @asynccontextmanager
    async def open(cls, port: int, path: str, tool: str) -> AsyncIterator[RawClient]:
        client = cls(await trio.open_tcp_stream("127.0.0.1", port), port, path, tool)
        try:
            yield client
        finally:
            await client.stream.aclose()

    async def call(self, text: str) -> tuple[int, bytes, bytes]:
        """(status, lower-cased response head, body) of one call of the tool with `text`."""
        self.next_id += 1
        body = msgspec.json.encode(
            {
                "jsonrpc": "2.0",
                "id": self.next_id,
                "method": "tools/call",
                "params": {
                    "name": self.tool,
                    "arguments": {"text": text},
                    "_meta": {
                        "io.modelcontextprotocol/protocolVersion": MODERN,
                        "io.modelcontextprotocol/clientInfo": {"name": "bench_floor", "version": "0"},
                        "io.modelcontextprotocol/clientCapabilities": {},
                    },
                },
            }
        )
        await self.stream.send_all(self.head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        buffer = self.buffer
        while (end := buffer.find(b"\r\n\r\n")) < 0:
            data = await self.stream.receive_some(65536)
            if not data:
                raise ConnectionError("the server closed the connection")
            buffer += data
        head = bytes(buffer[:end]).lower()
        length = content_length(head)
        start = end + 4
        while len(buffer) < start + length:
            data = await self.stream.receive_some(65536)
            if not data:
                raise ConnectionError("the server closed the connection")
            buffer += data
        answer = bytes(buffer[start : start + length])
        del buffer[: start + length]
        if b"\r\nconnection: close" in head:
            # Servers end a connection after so many requests (hypercorn and mcpvisor: 1,000).
            await self.stream.aclose()
            self.stream = await trio.open_tcp_stream("127.0.0.1", self.port)
            buffer.clear()
        return int(head.split(b" ", 2)[1]), head, answer


async def check_answer(client: RawClient) -> None:
    """Fail unless a call comes back as a JSON tool result that echoes the text sent."""
    text = "is this thing on"
    status, head, body = await client.call(text)
    if status != 200 or b"content-type: application/json" not in head:
        raise RuntimeError(f"{client.tool}: HTTP {status}, {head!r}: {body[:300]!r}")
    message = json.loads(body)
    result = message.get("result")
    if not isinstance(result, dict) or result.get("isError") or result.get("content", [{}])[0].get("text") != text:
        raise RuntimeError(f"{client.tool}: not an echo result: {body[:300]!r}")


# -- measuring -------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used so far, from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


class CpuMeter:
    """CPU used between `start` and `stop` by the client (this process) and each group of pids."""

    def __init__(self, groups: dict[str, list[int]]) -> None:
        self.groups = groups

    def start(self) -> None:
        self.before = self._now()

    def stop(self, calls: int) -> dict[str, float]:
        """ms per call, by group."""
        after = self._now()
        return {name: (after[name] - self.before[name]) * 1000 / calls for name in after}

    def _now(self) -> dict[str, float]:
        now = {"client": time.process_time()}
        for name, pids in self.groups.items():
            now[name] = sum(cpu_seconds(pid) for pid in pids)
        return now


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def sequential(
    port: int, path: str, tool: str, calls: int, warmup: int, meter: CpuMeter
) -> tuple[list[float], dict[str, float]]:
    """Latency samples (ms) of one client calling in turn, and CPU per call by process."""
    async with RawClient.open(port, path, tool) as client:
        await check_answer(client)
        for i in range(warmup):
            await client.call(f"warm-up {i}")
        samples = []
        meter.start()
        for i in range(calls):
            start = time.perf_counter()
            await client.call(f"call {i}")
            samples.append((time.perf_counter() - start) * 1000)
        return samples, meter.stop(calls)


async def concurrent(
    port: int, path: str, tool: str, clients: int, per_client: int, meter: CpuMeter
) -> tuple[float, dict[str, float]]:
    """Calls per second with `clients` connections calling at once, and CPU per call by process."""
    ready = trio.Event()
    connected = 0

    async def one(index: int) -> None:
        nonlocal connected
        async with RawClient.open(port, path, tool) as client:
            await check_answer(client)
            connected += 1
            if connected == clients:
                ready.set()
            await ready.wait()
            for i in range(per_client):
                await client.call(f"{index}/{i}")

    async with trio.open_nursery() as nursery:
        for index in range(clients):
            nursery.start_soon(one, index)
        await ready.wait()
        meter.start()
        start = time.perf_counter()
    elapsed = time.perf_counter() - start
    return clients * per_client / elapsed, meter.stop(clients * per_client)


# -- the three paths -------------------------------------------------------------------------------


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """End a process started in a session of its own, and everything it started."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # the upstream too, should it outlive the worker
    process.wait()


@asynccontextmanager
async def spawned(argv: list[str], *, quiet: bool = False) -> AsyncIterator[subprocess.Popen[bytes]]:
    """A process in a session of its own, ended with all it started; `quiet` drops its stderr."""
    stderr = subprocess.DEVNULL if quiet else None
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
    try:
        yield process
    finally:
        kill_group(process)


async def wait_for(predicate: Any, process: subprocess.Popen[bytes], what: str, timeout: float = 30) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            if process.poll() is not None:
                raise RuntimeError(f"{what} exited with {process.returncode}")
            await trio.sleep(0.05)


def children(pid: int) -> list[int]:
    from tests.support.stack import descendants

    return sorted(descendants(pid))


def cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline") as file:
        return file.read().replace("\0", " ")


def stack_path(stack: Any) -> tuple[int, str, str, dict[str, list[int]]]:
    """A running mcpvisor's path to the echo tool, and its processes by role."""
    worker = stack.status()["echo"]["pid"]
    upstream = children(worker)
    frontends = [pid for pid in stack.pids() if "mcpvisor.frontend" in cmdline(pid)]
    others = sorted(stack.pids() - {worker, *upstream, *frontends})
    groups = {"front": frontends, "worker": [worker], "upstream": upstream, "other": others}
    return stack.port, "/mcp/direct", "echo:echo", groups


@asynccontextmanager
async def open_paths(
    tmp: Path, before: str | None = None
) -> AsyncIterator[dict[str, tuple[int, str, str, dict[str, list[int]]]]]:
    """Every path running: label -> (port, HTTP path, tool name, process groups by role). With
    `before` (another build's python), that build's mcpvisor too, as "before"."""
    from tests.support.stack import echo_server, free_port, open_stack, wait_listening

    me = [sys.executable, str(SELF)]
    async with contextlib.AsyncExitStack() as exits:
        direct_port = free_port()
        direct = await exits.enter_async_context(
            spawned([sys.executable, str(ECHO_SERVER), "--http", str(direct_port)], quiet=True)
        )
        await wait_listening(direct_port, direct, timeout=30)

        endpoint = tmp / "floor.ipc"
        worker = await exits.enter_async_context(spawned([*me, "--worker", f"ipc://{endpoint}"]))
        await wait_for(endpoint.exists, worker, "the floor's worker")
        front_port = free_port()
        front = await exits.enter_async_context(spawned([*me, "--front", str(front_port), f"ipc://{endpoint}"]))
        await wait_listening(front_port, front, timeout=30)

        (tmp / "mcpvisor").mkdir()
        stack = await exits.enter_async_context(open_stack(tmp / "mcpvisor", {"echo": echo_server()}))
        builds = {"mcpvisor": stack_path(stack)}
        if before is not None:
            (tmp / "before").mkdir()
            other = await exits.enter_async_context(open_stack(tmp / "before", {"echo": echo_server()}, python=before))
            builds["before"] = stack_path(other)
        yield {
            "direct": (direct_port, "/mcp", "echo", {"upstream": [direct.pid]}),
            "floor": (
                front_port,
                "/",
                "echo",
                {"front": [front.pid], "worker": [worker.pid], "upstream": children(worker.pid)},
            ),
            **builds,
        }


_ROLES = ("client", "front", "worker", "upstream", "other")


def cpu_cells(row: dict[str, float]) -> str:
    cells = [f"{row[name]:>8.3f}" if name in row else f"{'-':>8}" for name in _ROLES]
    added = sum(value for name, value in row.items() if name not in ("client", "upstream"))
    return " ".join(cells) + f" {added:>8.3f} {sum(row.values()):>8.3f}"


async def main(args: argparse.Namespace) -> None:
    labels = ["direct", "floor", "mcpvisor", *(["before"] if args.before else [])]
    p50s: dict[str, list[float]] = {label: [] for label in labels}
    p90s: dict[str, list[float]] = {label: [] for label in labels}
    rates: dict[str, list[float]] = {label: [] for label in labels}
    cpu_seqs: dict[str, list[dict[str, float]]] = {label: [] for label in labels}
    cpu_concs: dict[str, list[dict[str, float]]] = {label: [] for label in labels}
    with tempfile.TemporaryDirectory(prefix="floor", dir="/tmp") as tmp:  # short: ipc paths are limited
        async with open_paths(Path(tmp), args.before) as paths:
            for round_ in range(args.rounds):
                # Each round in another order: what runs first on a machine that warms up is not always the same.
                for label in labels[round_ % len(labels) :] + labels[: round_ % len(labels)]:
                    port, path, tool, groups = paths[label]
                    print(f"round {round_ + 1}: measuring {label} ...", file=sys.stderr)
                    samples, used = await sequential(port, path, tool, args.calls, args.warmup, CpuMeter(groups))
                    p50s[label].append(statistics.median(samples))
                    p90s[label].append(percentile(samples, 0.9))
                    cpu_seqs[label].append(used)
                    rate, used = await concurrent(port, path, tool, args.clients, args.per_client, CpuMeter(groups))
                    rates[label].append(rate)
                    cpu_concs[label].append(used)

    def medians(rows: list[dict[str, float]]) -> dict[str, float]:
        return {name: statistics.median(row[name] for row in rows) for name in rows[0]}

    p50 = {label: statistics.median(p50s[label]) for label in labels}
    p90 = {label: statistics.median(p90s[label]) for label in labels}
    calls_per_second = {label: statistics.median(rates[label]) for label in labels}
    cpu_seq = {label: medians(cpu_seqs[label]) for label in labels}
    cpu_conc = {label: medians(cpu_concs[label]) for label in labels}
    print(
        f"\nstateless {MODERN} tools/call of echo: {args.calls} sequential calls after {args.warmup} warm-up; "
        f"{args.clients} clients x {args.per_client} calls concurrently; {os.cpu_count()} cores; "
        f"median of {args.rounds} round(s)"
    )
    print(f"{'path':<10} {'p50 ms':>8} {'p90 ms':>8} {'x direct':>9} {'calls/s':>8} {'x direct':>9}")
    for label in labels:
        print(
            f"{label:<10} {p50[label]:>8.3f} {p90[label]:>8.3f} {p50[label] / p50['direct']:>8.2f}x"
            f" {calls_per_second[label]:>8.0f} {calls_per_second[label] / calls_per_second['direct']:>8.2f}x"
        )
    columns = " ".join(f"{name:>8}" for name in (*_ROLES, "added", "total"))
    for title, table in (("sequential calls", cpu_seq), (f"{args.clients} concurrent clients", cpu_conc)):
        print(f"\nCPU ms per call, {title} (front: frontend; other: the rest of mcpvisor's processes)")
        print(f"{'path':<10} {columns}")
        for label in labels:
            print(f"{label:<10} {cpu_cells(table[label])}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000, help="sequential calls measured")
    parser.add_argument("--warmup", type=int, default=200, help="sequential calls before measuring")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients, one connection each")
    parser.add_argument("--per-client", type=int, default=200, help="calls by each concurrent client")
    parser.add_argument("--rounds", type=int, default=1, help="measure every path this many times, in turns; medians")
    parser.add_argument(
        "--before", metavar="PYTHON", help="also another build of mcpvisor, run by PYTHON (a checkout's virtualenv)"
    )
    parser.add_argument("--front", nargs=2, metavar=("PORT", "ENDPOINT"), help=argparse.SUPPRESS)
    parser.add_argument("--worker", metavar="ENDPOINT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_worker(args.worker)
    elif args.front:
        trio.run(run_front, int(args.front[0]), args.front[1])
    else:
        sys.path.insert(0, str(REPO))
        trio.run(main, args)
