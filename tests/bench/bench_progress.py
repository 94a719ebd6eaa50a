"""Added latency of a progress notification: upstream send to client receive, median over N.

    python tests/bench/bench_progress.py [--count 100]

The upstream (tests/upstreams/echo_server.py) stamps each progress message with the wall-clock
time it sends it; the client notes when it arrives. Measured through mcpvisor (the upstream over
stdio behind a worker) and, for reference, directly to the same upstream over streamable HTTP.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio
from mcp import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import trio.lowlevel

from tests.bench.bench_latency import http_upstream
from tests.support.stack import echo_server, open_stack


async def measure(url: str, tool: str, count: int, mode: str) -> list[float]:
    delays: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        delays.append((time.time() - float(message or 0)) * 1000)

    async with Client(url, mode=mode) as client:
        await client.call_tool(tool, {"count": 5, "interval": 0.01})  # warm-up
        await client.call_tool(tool, {"count": count, "interval": 0.01}, progress_callback=on_progress)
    return delays


async def main(args: argparse.Namespace) -> None:
    rows = []
    async with http_upstream() as (_direct, direct_url):
        with tempfile.TemporaryDirectory() as tmp:
            async with open_stack(Path(tmp), {"echo": echo_server()}) as stack:
                for mode in ("legacy", "auto"):
                    d = await measure(direct_url, "progress_stamps", args.count, mode)
                    m = await measure(stack.direct_url, "echo:progress_stamps", args.count, mode)
                    rows.append((mode, d, m))
    print(f"\nprogress notification, upstream send -> client receive, {args.count} notifications")
    print(f"{'client':<10} {'direct median':>14} {'mcpvisor median':>16} {'added':>9} {'mcpvisor max':>13}")
    for mode, d, m in rows:
        era = "2026-07-28" if mode == "auto" else "2025-11-25"
        added = statistics.median(m) - statistics.median(d)
        print(
            f"{era:<10} {statistics.median(d):>11.2f} ms {statistics.median(m):>13.2f} ms {added:>6.2f} ms {max(m):>10.2f} ms"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=100)
    trio.run(main, parser.parse_args())
