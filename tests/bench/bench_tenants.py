"""Tenants started on use: memory and start time of T tenants x S servers (default 10 x 5).

    python tests/bench/bench_tenants.py [--tenants 10] [--servers 5] [--idle 20]

Starts mcpvisor with S small stdio upstreams (tests/upstreams/echo_server.py) and T tenants that
may each use all of them, then prints one table:

- mcpvisor started and listening, no tenant active: processes and PSS;
- each tenant's first request (a tools/list that waits for its workers), in turn: the time it
  took, and the PSS once every tenant is active (T x S workers and as many upstreams);
- after the tenants' idle time: the workers stopped, the PSS again.

PSS is read from /proc/PID/smaps_rollup of every process in mcpvisor's tree.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2
import trio

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.bench.bench_scale import pss_mb, tree  # noqa: E402
from tests.support.stack import Stack, echo_server, open_stack  # noqa: E402

MODERN = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "bench-tenants", "version": "1"},
}


def memory(stack: Stack) -> dict[str, Any]:
    """PSS (MB) of mcpvisor's own processes and of the upstreams under its workers."""
    supervisor = stack.process.pid
    workers = [row["pid"] for name, row in stack.status().items() if name != "frontend" and row["pid"]]
    upstreams = set().union(*(tree(pid) for pid in workers)) if workers else set()
    everything = tree(supervisor) | {supervisor}
    own = everything - upstreams
    worker_pss = [pss_mb(pid) for pid in workers]
    return {
        "processes": len(everything),
        "workers": len(workers),
        "mcpvisor_mb": sum(pss_mb(pid) for pid in own),
        "worker_median_mb": statistics.median(worker_pss) if worker_pss else 0.0,
        "upstreams_mb": sum(pss_mb(pid) for pid in upstreams),
    }


async def first_request(http: httpx2.AsyncClient, url: str, token: str) -> tuple[float, int]:
    """A tenant's first tools/list, all pages: (seconds, tools listed)."""
    started = time.perf_counter()
    tools, cursor = 0, None
    while True:
        params: dict[str, Any] = {"_meta": META, **({"cursor": cursor} if cursor else {})}
        response = await http.post(
            url,
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": params},
            headers={
                "Authorization": f"Bearer {token}",
                "Accept": "application/json, text/event-stream",
                "MCP-Protocol-Version": MODERN,
                "Mcp-Method": "tools/list",
            },
        )
        page = response.json()["result"]
        tools += len(page["tools"])
        cursor = page.get("nextCursor")
        if not cursor:
            return time.perf_counter() - started, tools


async def main(args: argparse.Namespace) -> None:
    servers = {f"s{i}": echo_server(f"s{i}") for i in range(args.servers)}
    tokens = {f"t{i}": secrets.token_urlsafe(32) for i in range(args.tenants)}
    with tempfile.TemporaryDirectory(prefix="bench-tenants") as tmp:
        tmp_path = Path(tmp)
        secret_dir = tmp_path / "secrets"
        secret_dir.mkdir()
        tenants = {}
        for tenant, token in tokens.items():
            (secret_dir / tenant).write_text(token)
            tenants[tenant] = {"servers": list(servers), "token_files": [str(secret_dir / tenant)]}
        settings = {"tenant_idle_stop": args.idle}
        started = time.perf_counter()
        async with open_stack(tmp_path, servers, settings=settings, wait_for=[], tables={"tenants": tenants}) as stack:
            listening = time.perf_counter() - started
            await trio.sleep(2)
            idle_before = await trio.to_thread.run_sync(memory, stack)
            firsts = []
            async with httpx2.AsyncClient(timeout=120) as http:
                for token in tokens.values():
                    firsts.append(await first_request(http, stack.direct_url, token))
                again = [(await first_request(http, stack.direct_url, token))[0] for token in tokens.values()]
            await trio.sleep(2)
            active = await trio.to_thread.run_sync(memory, stack)
            # The idle check runs every 5 s: wait the idle time and two checks.
            await trio.sleep(args.idle + 12)
            idle_after = await trio.to_thread.run_sync(memory, stack)
        seconds = [first for first, _tools in firsts]
        print(f"{args.tenants} tenants x {args.servers} stdio servers (tests/upstreams/echo_server.py)")
        print(f"{'':44}{'processes':>10}{'workers':>9}{'mcpvisor PSS':>14}{'worker p50':>12}{'upstreams':>11}")
        for label, row in (
            (f"started, no tenant active ({listening:.1f} s to listen)", idle_before),
            (f"all {args.tenants} tenants active", active),
            (f"after {args.idle:g} s idle", idle_after),
        ):
            print(
                f"{label:44}{row['processes']:>10}{row['workers']:>9}{row['mcpvisor_mb']:>11.1f} MB"
                f"{row['worker_median_mb']:>9.1f} MB{row['upstreams_mb']:>8.1f} MB"
            )
        print(
            f"a tenant's first request (starts its {args.servers} workers, lists their tools): "
            f"p50 {statistics.median(seconds):.2f} s, max {max(seconds):.2f} s; "
            f"tools listed per tenant: {sorted({tools for _s, tools in firsts})}"
        )
        print(f"a tenant's next request (its workers running): p50 {statistics.median(again) * 1000:.1f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--servers", type=int, default=5)
    parser.add_argument(
        "--idle",
        type=float,
        default=120.0,
        help="tenant_idle_stop for the run (seconds; longer than starting them all)",
    )
    trio.run(main, parser.parse_args())
