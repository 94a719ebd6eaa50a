"""Calls per second through HAProxy with 1, 2 and 3 mcpvisor replicas sharing one PostgreSQL store.

    python tests/bench/bench_replicas.py [--clients 8] [--per-client 150] [--calls 300] [--replicas 1,2,3]

For each count: a throwaway PostgreSQL cluster (Debian's `postgresql`, tests/support/postgres.py)
with a fresh database, that many `mcpvisor serve` replicas of one config (the `echo` server of
tests/upstreams/) with `state_url` pointing at it, and HAProxy running the shipped
deploy/haproxy/haproxy.cfg in front of them. The client is bench_floor's raw keep-alive HTTP/1.1
client posting stateless 2026-07-28 `tools/call`s of `echo:echo` to /mcp/direct through HAProxy:
`--clients` connections calling at once for the rate, one connection for the latency.

Every call is written to the shared activity log in PostgreSQL. On a machine with two cores the
replicas compete for the same cores, so more replicas cannot mean more calls per second; what the
table shows is whether the shared store serializes them: the rate should hold as replicas are
added, the calls should spread evenly over the replicas, and the store's CPU per call should not
grow. `--control` measures each count a second time with SQLite in each replica's data dir
(nothing shared): if the shared store serialized the replicas, its rows would fall behind these.
The CPU column `pg` is the PostgreSQL server's processes' per call; `no proxy` is the p50 of
the same sequential calls sent to one replica directly.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import trio

REPO = Path(__file__).resolve().parents[2]


def postgres_pids(directory: Path) -> list[int]:
    """The cluster's server processes: those whose command line names its data directory or were
    started by its postmaster (the backends)."""
    postmaster = int((directory / "data" / "postmaster.pid").read_text().split()[0])
    pids = [postmaster]
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if parent == postmaster:
            pids.append(int(entry))
    return pids


@asynccontextmanager
async def replicas_of(where: Path, count: int, url: str | None) -> AsyncIterator[list[Any]]:
    """`count` replicas sharing the store at `url`, or each with SQLite of its own when None."""
    from tests.support.stack import echo_server, open_replicas, open_stack

    if url is not None:
        async with open_replicas(where, count, {"echo": echo_server()}, state_url=url) as replicas:
            yield replicas
        return
    async with AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(open_stack(where / f"replica{i}", {"echo": echo_server()}))
            for i in range(count)
        ]


async def measure(count: int, cluster: Any, tmp: Path, args: argparse.Namespace, shared: bool) -> dict[str, Any]:
    from tests.bench.bench_floor import CpuMeter, RawClient, check_answer, concurrent, sequential
    from tests.support.haproxy import open_haproxy

    url = cluster.create_database(f"bench{count}") if shared else None
    where = tmp / f"replicas{count}{'pg' if shared else 'sqlite'}"
    async with replicas_of(where, count, url) as replicas:
        servers = {f"replica{i}": replica.port for i, replica in enumerate(replicas, 1)}
        async with open_haproxy(where, servers) as proxy:
            # Until HAProxy's health checks have every replica in rotation.
            async with RawClient.open(proxy.port, "/mcp/direct", "echo:echo") as client:
                with trio.fail_after(30):
                    while len({line.server for line in proxy.log() if line.status == 200}) < count:
                        await check_answer(client)
                        await trio.sleep(0.05)
            before = Counter(line.server for line in proxy.log())
            groups = {
                "replicas": [pid for replica in replicas for pid in replica.pids()],
                "store": postgres_pids(cluster.directory),
                "haproxy": [proxy.process.pid],
            }
            rate, cpu = await concurrent(
                proxy.port, "/mcp/direct", "echo:echo", args.clients, args.per_client, CpuMeter(groups)
            )
            spread = Counter(line.server for line in proxy.log()) - before
            latency, _ = await sequential(proxy.port, "/mcp/direct", "echo:echo", args.calls, 50, CpuMeter({}))
            # The same calls to one replica without HAProxy: what the proxy adds to a call.
            alone, _ = await sequential(replicas[0].port, "/mcp/direct", "echo:echo", args.calls, 50, CpuMeter({}))
    logged = cluster.psql("SELECT count(*) FROM calls", url.rsplit("/", 1)[1]).strip() if url else "0"
    return {
        "rate": rate,
        "p50": statistics.median(latency),
        "alone": statistics.median(alone),
        "cpu": cpu,
        "spread": [spread[name] for name in servers],
        "logged": int(logged),
    }


async def main(args: argparse.Namespace) -> None:
    from tests.support.postgres import running_postgres

    counts = [int(n) for n in args.replicas.split(",")]
    results = {}
    with tempfile.TemporaryDirectory(prefix="replicas", dir="/tmp") as tmp, running_postgres() as cluster:
        for count in counts:
            for shared in (True, False) if args.control else (True,):
                store = "postgres" if shared else "sqlite"
                print(f"measuring {count} replicas, {store} ...", file=sys.stderr)
                results[(count, store)] = await measure(count, cluster, Path(tmp), args, shared)
    print(
        f"\nstateless 2026-07-28 tools/call of echo through HAProxy, replicas sharing one PostgreSQL:"
        f" {args.clients} clients x {args.per_client} calls; p50 of {args.calls} sequential calls; {os.cpu_count()} cores"
    )
    print(
        f"{'replicas':>8} {'store':>8} {'calls/s':>8} {'p50 ms':>8} {'no proxy':>8} {'replicas':>9} {'pg':>7} {'haproxy':>8}"
        f"  calls per replica        rows in the activity log"
    )
    print(f"{'':>8} {'':>8} {'':>8} {'':>8} {'':>8} {'CPU ms per call':>26}")
    for (count, store), row in results.items():
        cpu = row["cpu"]
        assert isinstance(cpu, dict)
        print(
            f"{count:>8} {store:>8} {row['rate']:>8.0f} {row['p50']:>8.2f} {row['alone']:>8.2f} {cpu['replicas']:>9.3f} {cpu['store']:>7.3f}"
            f" {cpu['haproxy']:>8.3f}  {row['spread']!s:<24} {row['logged']}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients, one connection each")
    parser.add_argument("--per-client", type=int, default=150, help="calls by each concurrent client")
    parser.add_argument("--calls", type=int, default=300, help="sequential calls for the latency")
    parser.add_argument("--replicas", default="1,2,3", help="the replica counts measured, in order")
    parser.add_argument(
        "--control", action="store_true", help="also measure each count with SQLite per replica (nothing shared)"
    )
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    trio.run(main, args)
