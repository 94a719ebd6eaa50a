"""What a tenant's own network costs a remote call: p50 of a tool that GETs a remote URL, with and without.

    python tests/bench/bench_sandbox_network.py [--calls 400]

Needs root (it makes the stand-in internet: an HTTP server in a network namespace of its own
behind a veth pair, tests/support/internet.py). One run, the same upstream
(tests/upstreams/fetch_server.py, whose `fetch` opens a connection per call) started by the
worker's own code (workers/stdio.py) three ways, calls alternating between them in blocks so the
load of a shared machine falls on all alike:

- direct: the bench process GETs the URL itself (no MCP, no upstream);
- host network: the upstream sandboxed with `network = "host"` (the host's network namespace);
- own network: the upstream sandboxed with the tenants' default, `network = "outbound"` (its own
  namespace, pasta in between).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from mcpvisor.runtime.logs import RotatingFile
from mcpvisor.wire.sandboxing import SandboxPlan, home_dir
from tests.bench.bench_upstream_sandbox import _open, summary
from tests.support import internet

UPSTREAMS = Path(__file__).resolve().parents[1] / "upstreams"


def direct(url: str) -> None:
    with urllib.request.urlopen(url, timeout=30) as answer:
        answer.read()


async def main(args: argparse.Namespace) -> None:
    if shutil.which("bwrap") is None or shutil.which("pasta") is None or internet.missing() is not None:
        print("needs bwrap, pasta (passt) and root:", internet.missing() or "apt-get install bubblewrap passt")
        return
    command = [sys.executable, str(UPSTREAMS / "fetch_server.py")]
    with internet.internet() as net, tempfile.TemporaryDirectory() as data:
        call = b'{"name":"fetch","arguments":{"url":"' + net.url.encode() + b'"}}'
        log = RotatingFile(Path(data) / "bench.stderr.log")
        uid = (1 << 30) + 4243 if os.geteuid() == 0 else None
        plans = {
            "host network": SandboxPlan(home=home_dir(data, "bench/up"), hidden=(data,), network="host", uid=uid),
            "own network": SandboxPlan(home=home_dir(data, "bench/up"), hidden=(data,), network="outbound", uid=uid),
        }
        print(
            f"remote: {net.url} (a veth pair away); as {'root' if os.geteuid() == 0 else 'a user'}; {args.calls} calls each"
        )
        times: dict[str, list[float]] = {"direct": [], **{label: [] for label in plans}}
        async with (
            _open(command, plans["host network"], log) as (_, host),
            _open(command, plans["own network"], log) as (_, own),
        ):
            channels = {"host network": host, "own network": own}
            for _ in range(args.calls // 20):
                for _ in range(20):
                    t0 = time.perf_counter()
                    await trio.to_thread.run_sync(direct, net.url)
                    times["direct"].append(time.perf_counter() - t0)
                for label, channel in channels.items():
                    for _ in range(20):
                        t0 = time.perf_counter()
                        answer = await channel.request("tools/call", call)
                        times[label].append(time.perf_counter() - t0)
                        assert b"hello from the internet" in answer, answer[:200]
        for label, values in times.items():
            print(f"{label:>13}  {summary(values)}")
        cost = statistics.median(times["own network"]) - statistics.median(times["host network"])
        print(f"the own network's cost per call (p50, own - host): {cost * 1000:+.2f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    trio.run(main, parser.parse_args())
