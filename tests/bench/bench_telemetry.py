"""What tracing costs a tool call: off, on with every trace sampled, and on with a collector that
cannot be reached, side by side with a direct connection to the same upstream, in one run.

    python tests/bench/bench_telemetry.py [--calls 500] [--clients 16] [--per-client 100]
                                          [--mode auto|legacy] [--protocol http/protobuf|grpc]

Each mcpvisor is a whole stack (supervisor, frontend, a worker, tests/upstreams/echo_server.py
over stdio) configured only by the standard `OTEL_*` variables; the collector is
tests/support/otlp_receiver.py in a process of its own, and "unreachable" is a loopback port
nothing listens on. The client is the SDK's `Client` over streamable HTTP. After the run the
receiver's span count and the unreachable stack's `mcpvisor_telemetry_spans_dropped_total` show
that tracing was really on, and what it lost.
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
from pathlib import Path

import httpx2
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.bench.bench_latency import concurrent, direct_upstream, percentile, sequential
from tests.support.stack import echo_server, free_port, open_stack


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


async def measure(url: str, tool: str, args: argparse.Namespace, processes: dict[str, int]) -> dict[str, float]:
    """p50 and p99 latency (ms), calls/s, and CPU per call (ms) of mcpvisor's processes, which a busy
    machine disturbs less than it does wall-clock times."""
    samples, cpu = await sequential(url, tool, args.calls, args.mode, processes)
    rate = await concurrent(url, tool, args.clients, args.per_client, args.mode)
    spent = sum(ms for name, ms in cpu.items() if name in ("frontend", "worker"))
    return {"p50": statistics.median(samples), "p99": percentile(samples, 0.99), "rate": rate, "cpu": spent}


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


REPO = Path(__file__).resolve().parents[2]


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
    rows = {
        "tracing off": {},
        "on, sampled 1.0": collector_env(collector, args.protocol),
        "on, collector unreachable": collector_env(free_port(), args.protocol),
    }
    results: dict[str, dict[str, float]] = {}
    lost = 0.0
    try:
        async with direct_upstream() as (_, direct_url):
            print("measuring direct ...", file=sys.stderr)
            results["direct"] = await measure(direct_url, "echo", args, {})
        for label, env in rows.items():
            with tempfile.TemporaryDirectory() as tmp:
                async with open_stack(Path(tmp), {"echo": echo_server()}, env=env) as stack:
                    print(f"measuring mcpvisor, {label} ...", file=sys.stderr)
                    processes = {"worker": stack.status()["echo"]["pid"], "frontend": stack.status()["frontend"]["pid"]}
                    results[label] = await measure(stack.direct_url, "echo:echo", args, processes)
                    if "unreachable" in label:
                        lost = await settled_drops(stack.base_url)
    finally:
        receiver.send_signal(signal.SIGTERM)
        received, _ = receiver.communicate(timeout=30)

    era = "2026-07-28" if args.mode == "auto" else "2025-11-25"
    print(
        f"\ntools/call through mcpvisor ({era}, export {args.protocol}): {args.calls} sequential calls; "
        f"{args.clients} clients x {args.per_client} calls concurrently"
    )
    print(
        f"{'':<28} {'p50 (ms)':>9} {'p99 (ms)':>9} {'calls/s':>8} {'p50 vs off':>11} {'calls/s vs off':>15}"
        f" {'CPU/call (ms)':>14}"
    )
    off = results["tracing off"]
    for label, row in results.items():
        cpu = f"{row['cpu']:>14.2f}" if label != "direct" else f"{'-':>14}"
        print(
            f"{label:<28} {row['p50']:>9.2f} {row['p99']:>9.2f} {row['rate']:>8.0f}"
            f" {row['p50'] / off['p50']:>10.2f}x {row['rate'] / off['rate']:>14.2f}x {cpu}"
        )
    print("(CPU/call: the frontend's and the worker's, in the sequential run)")
    print(f"\ncollector: {received.strip().splitlines()[-1] if received.strip() else 'nothing received'}")
    print(f"unreachable collector: {lost:.0f} spans dropped (mcpvisor_telemetry_spans_dropped_total)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--per-client", type=int, default=100)
    parser.add_argument("--mode", default="auto", choices=["auto", "legacy"], help="client protocol era")
    parser.add_argument("--protocol", default="http/protobuf", choices=["http/protobuf", "grpc"])
    with contextlib.suppress(KeyboardInterrupt):
        trio.run(main, parser.parse_args())
