"""What tracing costs a tool call: off, on with every trace sampled, and on with a collector that
cannot be reached, side by side with a direct connection to the same upstream, in one run.

    python tests/bench/bench_telemetry.py [--rounds 10] [--calls 50] [--clients 16] [--per-client 10]
                                          [--mode auto|legacy] [--protocol http/protobuf|grpc]

Three mcpvisor stacks run at once (supervisor, frontend, a worker, tests/upstreams/echo_server.py
over stdio), configured only by the standard `OTEL_*` variables; the collector is
tests/support/otlp_receiver.py in a process of its own, and "unreachable" is a loopback port
nothing listens on. The measurements take turns, round after round (`--calls` sequential calls,
then `--clients` x `--per-client` concurrent ones, on each target in turn), so that a machine
whose load changes during the run weighs on every row alike. The client is the SDK's `Client`
over streamable HTTP. The receiver's span count and the unreachable stack's
`mcpvisor_telemetry_spans_dropped_total` show that tracing was really on, and what it lost.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2
import trio
from mcp import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.bench.bench_latency import Path_, concurrent, cpu_seconds, http_upstream, percentile
from tests.support.stack import echo_server, free_port, open_stack

REPO = Path(__file__).resolve().parents[2]


def collector_env(port: int, protocol: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_TRACES_SAMPLER": "traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "1.0",
    }


async def dropped_spans(base_url: str) -> float:
    async with httpx2.AsyncClient(timeout=10) as http:
        text = (await http.get(f"{base_url}/metrics")).text
    return sum(
        float(value) for value in re.findall(r"^mcpvisor_telemetry_spans_dropped_total\{.*\} (\S+)$", text, re.M)
    )


async def settled_drops(base_url: str) -> float:
    """The drop count once it stops growing: a failed batch is counted when its retries run out."""
    last, still = -1.0, 0
    with trio.move_on_after(60):
        while still < 6:
            count = await dropped_spans(base_url)
            still = still + 1 if count == last else 0
            last = count
            await trio.sleep(2)
    return last


class Target:
    """One thing measured: a URL and tool, the pids whose CPU counts, and what was measured so far."""

    def __init__(self, url: str, tool: str, pids: dict[str, int]) -> None:
        self.url, self.tool, self.pids = url, tool, pids
        self.samples: list[float] = []
        self.cpu = dict.fromkeys(pids, 0.0)
        self.calls = 0
        self.concurrent_calls = 0
        self.concurrent_seconds = 0.0

    async def sequential(self, client: Client, calls: int) -> None:
        before = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        for i in range(calls):
            start = time.perf_counter()
            await client.call_tool(self.tool, {"text": f"call {i}"})
            self.samples.append((time.perf_counter() - start) * 1000)
        for name, pid in self.pids.items():
            self.cpu[name] += cpu_seconds(pid) - before[name]
        self.calls += calls

    async def burst(self, clients: int, per_client: int, mode: str) -> None:
        rate = await concurrent(Path_("", self.url, self.tool), clients, per_client, mode)
        self.concurrent_calls += clients * per_client
        self.concurrent_seconds += clients * per_client / rate


async def main(args: argparse.Namespace) -> None:
    http_port, grpc_port = free_port(), free_port()
    receiver = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.otlp_receiver",
            "--http",
            str(http_port),
            "--grpc",
            str(grpc_port),
            "--quiet",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert receiver.stdout is not None
    receiver.stdout.readline()  # listening
    collector = http_port if args.protocol == "http/protobuf" else grpc_port
    configs = {
        "tracing off": {},
        "on, sampled 1.0": collector_env(collector, args.protocol),
        "on, collector unreachable": collector_env(free_port(), args.protocol),
    }
    targets: dict[str, Target] = {}
    lost = 0.0
    try:
        async with contextlib.AsyncExitStack() as exits:
            tmp = Path(exits.enter_context(tempfile.TemporaryDirectory()))
            _, direct_url = await exits.enter_async_context(http_upstream())
            targets["direct"] = Target(direct_url, "echo", {})
            stacks = {}
            for index, (label, env) in enumerate(configs.items()):
                stack = await exits.enter_async_context(open_stack(tmp / str(index), {"echo": echo_server()}, env=env))
                status = stack.status()
                stacks[label] = stack
                pids = {"frontend": status["frontend"]["pid"], "worker": status["echo"]["pid"]}
                targets[label] = Target(stack.direct_url, "echo:echo", pids)
            clients = {}
            for label, target in targets.items():
                clients[label] = await exits.enter_async_context(Client(target.url, mode=args.mode))
                for _ in range(30):  # warm-up
                    await clients[label].call_tool(target.tool, {"text": "warm-up"})
            for round_ in range(args.rounds):
                print(f"round {round_ + 1}/{args.rounds} ...", file=sys.stderr)
                for label, target in targets.items():
                    await target.sequential(clients[label], args.calls)
                for target in targets.values():
                    await target.burst(args.clients, args.per_client, args.mode)
            lost = await settled_drops(stacks["on, collector unreachable"].base_url)
    finally:
        receiver.send_signal(signal.SIGTERM)
        received, _ = receiver.communicate(timeout=30)

    era = "2026-07-28" if args.mode == "auto" else "2025-11-25"
    print(
        f"\ntools/call of a small upstream tool ({era}, export {args.protocol}), {args.rounds} rounds taking turns:"
        f" {args.rounds * args.calls} sequential calls and {args.rounds * args.clients * args.per_client}"
        f" concurrent ones ({args.clients} clients) each"
    )
    print(
        f"{'':<28} {'p50 (ms)':>9} {'p99 (ms)':>9} {'calls/s':>8} {'p50 vs off':>11} {'calls/s vs off':>15}"
        f" {'CPU/call: frontend':>19} {'worker':>7}"
    )
    off = targets["tracing off"]
    off_rate = off.concurrent_calls / off.concurrent_seconds
    for label, target in targets.items():
        p50, rate = statistics.median(target.samples), target.concurrent_calls / target.concurrent_seconds
        cpu = " ".join(
            f"{target.cpu[name] * 1000 / target.calls:>{width}.2f}" if target.pids else f"{'-':>{width}}"
            for name, width in (("frontend", 19), ("worker", 7))
        )
        print(
            f"{label:<28} {p50:>9.2f} {percentile(target.samples, 0.99):>9.2f} {rate:>8.0f}"
            f" {p50 / statistics.median(off.samples):>10.2f}x {rate / off_rate:>14.2f}x {cpu}"
        )
    print("(CPU/call, in ms, of the sequential calls, each process's export thread included)")
    print(f"\ncollector: {received.strip().splitlines()[-1] if received.strip() else 'nothing received'}")
    print(f"unreachable collector: {lost:.0f} spans dropped (mcpvisor_telemetry_spans_dropped_total)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=50, help="sequential calls per target and round")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--per-client", type=int, default=10, help="calls per client and round")
    parser.add_argument("--mode", default="auto", choices=["auto", "legacy"], help="client protocol era")
    parser.add_argument("--protocol", default="http/protobuf", choices=["http/protobuf", "grpc"])
    with contextlib.suppress(KeyboardInterrupt):
        trio.run(main, parser.parse_args())
