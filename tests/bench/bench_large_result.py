"""Large results through mcpvisor: do they arrive, how long do they take, how much memory do they cost?

    python tests/bench/bench_large_result.py [--sizes 1,20,64] [--pause 0] [--over] [--no-direct]

For each size (MiB of the result's JSON), a 2026-07-28 SDK client calls `bulk:big` on /mcp/direct
of a stack whose upstream is tests/upstreams/raw_server.py: it writes the result in 1 MiB pieces
(`--pause` seconds apart: an upstream slow to write), so the upstream itself holds little. Printed
side by side with a direct connection (the same SDK client talking to the same server over stdio,
in a process of its own): seconds per call, and the peak resident memory (VmHWM, reset before each
call through /proc/PID/clear_refs) of mcpvisor's worker and frontend, and of the direct client.
Memory a process holds before the call is shown apart ("base"), so the result's cost is the
difference. The upstream must still be the same process after every call: a big answer is not a
hang. With `--over`, a result one byte over `max_result_bytes` must come back as an error naming
its size and the limit, with the upstream still running.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio
from mcp.shared.exceptions import MCPError

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.support.stack import UPSTREAMS, descendants, open_stack, python_server

MIB = 1024 * 1024

DIRECT = r"""
import json, sys, time, anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

async def main(size, pause):
    params = StdioServerParameters(command=sys.executable, args=[sys.argv[1]])
    async with Client(params) as client:
        await client.list_tools()
        base = peak()
        open("/proc/self/clear_refs", "w").write("5")
        started = time.perf_counter()
        result = await client.call_tool("big", {"size": size, "pause": pause})
        took = time.perf_counter() - started
        length = len(result.content[0].text)
    print(json.dumps({"seconds": took, "peak": peak(), "base": base, "text": length}))

anyio.run(main, int(sys.argv[2]), float(sys.argv[3]))
"""


def memory(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as refs:
        refs.write("5")


def direct(size: int, pause: float) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", DIRECT, str(UPSTREAMS / "raw_server.py"), str(size), str(pause)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


async def main(args: argparse.Namespace) -> None:
    sizes = [int(float(s) * MIB) for s in args.sizes.split(",")]
    settings = {"max_result_bytes": args.limit * MIB} if args.limit else {}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        servers = {"bulk": python_server("raw_server.py", policy={"call_timeout": 600})}
        async with open_stack(Path(tmp), servers, settings=settings) as stack:
            status = stack.status()
            worker, frontend = status["bulk"]["pid"], status["frontend"]["pid"]
            (upstream,) = descendants(worker)
            async with stack.client() as client:
                for size in sizes:
                    bases = {"worker": memory(worker, "VmRSS"), "frontend": memory(frontend, "VmRSS")}
                    for pid in (worker, frontend):
                        reset_peak(pid)
                    started = time.perf_counter()
                    outcome = "?"
                    try:
                        with trio.fail_after(300):
                            result = await client.call_tool("bulk:big", {"size": size, "pause": args.pause})
                        length = len(result.content[0].text) if result.content else 0
                        outcome = "error: " + result.content[0].text[:120] if result.is_error else f"{length} chars"
                    except Exception as exc:  # the figure to print is what the client saw, whatever it was
                        outcome = f"{type(exc).__name__}: {str(exc)[:160]}"
                    took = time.perf_counter() - started
                    peaks = {"worker": memory(worker, "VmHWM"), "frontend": memory(frontend, "VmHWM")}
                    await trio.sleep(3)  # an upstream taken for hung would be replaced by now
                    same = stack.status()["bulk"]["pid"] == worker and descendants(worker) == {upstream}
                    here = direct(size, args.pause) if args.direct else None
                    rows.append((size, took, outcome, bases, peaks, same, here))
                    print(
                        f"{size / MIB:6.1f} MiB  mcpvisor {took:6.2f} s  worker peak {peaks['worker'] / MIB:6.0f} MiB "
                        f"(base {bases['worker'] / MIB:4.0f})  frontend peak {peaks['frontend'] / MIB:6.0f} MiB "
                        f"(base {bases['frontend'] / MIB:4.0f})  upstream kept: {same}  -> {outcome}",
                        flush=True,
                    )
                    if here is not None:
                        print(
                            f"{'':10} direct   {here['seconds']:6.2f} s  client peak {here['peak'] / MIB:6.0f} MiB "
                            f"(base {here['base'] / MIB:4.0f})",
                            flush=True,
                        )
                if args.over:
                    limit = args.limit * MIB if args.limit else 64 * MIB
                    try:
                        result = await client.call_tool("bulk:big", {"size": limit + 1})
                        refused, text = result.is_error, result.content[0].text if result.content else ""
                    except MCPError as exc:
                        refused, text = True, exc.error.message
                    same = stack.status()["bulk"]["pid"] == worker and upstream in descendants(worker)
                    print(f"{limit / MIB:6.1f} MiB + 1 byte: refused: {refused}, upstream kept: {same}: {text}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,20,64", help="result sizes in MiB, comma-separated")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds between the upstream's 1 MiB pieces")
    parser.add_argument("--limit", type=int, default=0, help="max_result_bytes in MiB (default: mcpvisor's)")
    parser.add_argument("--over", action="store_true", help="also one byte over the limit")
    parser.add_argument(
        "--no-direct",
        dest="direct",
        action="store_false",
        help="skip the direct client (the SDK's takes minutes at 64 MiB)",
    )
    trio.run(main, parser.parse_args())
