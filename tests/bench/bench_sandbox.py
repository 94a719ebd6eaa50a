"""What a code_execution sandbox process costs: memory, start time, run and inner-call overhead.

    python tests/bench/bench_sandbox.py [--runs 20] [--calls 500]

Prints the resident memory (RSS, and PSS where the kernel reports it) of one sandbox process when
idle, after a JavaScript run, and after the TypeScript compiler was loaded; the time to start a
process and the median wall time of a trivial run, each inside bubblewrap (as the frontend runs
them where bwrap works) and in V8 alone; and the round trip of one inner call_tool (the callback
answers at once, so the figure is the sandbox's own overhead).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from mcpvisor.frontend.tools.code_execution import Confinement, Limits, SandboxPool, SandboxProcess, execute_code
from mcpvisor.runtime import script_runner


def memory_mb(pid: int) -> tuple[float, float | None]:
    rss = pss = None
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("Pss:"):
                pss = int(line.split()[1]) / 1024
    except OSError:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
    assert rss is not None
    return rss, pss


def interpreter(pid: int) -> int:
    """The process running V8: `pid` itself, or the one inside bwrap when `pid` is bwrap."""
    while os.path.basename(os.readlink(f"/proc/{pid}/exe")) == "bwrap":
        pid = int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])
    return pid


async def answer(server: str, tool: str, args: dict, intent: dict | None) -> tuple[bool, dict]:
    return True, {"content": [{"type": "text", "text": "ok"}]}


async def main(runs: int, calls: int) -> None:
    limits = Limits(timeout_ms=60000)
    decision = script_runner.decide(sys.executable, (), required=False)
    if decision.warning:
        print(decision.warning)
    for label, chosen in (("inside bwrap", decision), ("V8 alone", None)):
        if label == "inside bwrap" and not decision.confined:
            continue
        starts = []
        for _ in range(5):
            t0 = time.perf_counter()
            process = await SandboxProcess.start(decision=chosen)
            starts.append(time.perf_counter() - t0)
            await process.aclose()
        print(f"start a sandbox process, {label}: median {statistics.median(starts) * 1000:.0f} ms over {len(starts)}")
        pool = SandboxPool(size=1, confinement=Confinement(enabled=chosen is not None))
        try:
            await execute_code({"code": "1"}, answer, pool=pool, limits=limits)
            times = []
            for _ in range(runs):
                t0 = time.perf_counter()
                await execute_code({"code": "1 + 1"}, answer, pool=pool, limits=limits)
                times.append(time.perf_counter() - t0)
            print(f"trivial run, {label}: p50 {statistics.median(times) * 1000:.1f} ms over {runs}")
        finally:
            await pool.aclose()

    pool = SandboxPool(size=1)
    try:
        await execute_code({"code": "1"}, answer, pool=pool, limits=limits)
        pid = interpreter(pool._idle[0].pid)
        rss, pss = memory_mb(pid)
        print(f"memory after a first JavaScript run: RSS {rss:.1f} MB" + (f", PSS {pss:.1f} MB" if pss else ""))

        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            await execute_code(
                {"code": "({sum: input.a + input.b})", "input": {"a": 1, "b": 2}}, answer, pool=pool, limits=limits
            )
            times.append(time.perf_counter() - t0)
        print(f"trivial run (fresh isolate each): median {statistics.median(times) * 1000:.1f} ms over {runs}")

        code = f"for (var i = 0; i < {calls}; i++) call_tool('s', 't', {{i: i}}); i"
        t0 = time.perf_counter()
        outcome = await execute_code({"code": code}, answer, pool=pool, limits=limits)
        elapsed = time.perf_counter() - t0
        assert not outcome.is_error, outcome.text
        print(f"inner call_tool round trip: {elapsed / calls * 1e6:.0f} us per call over {calls} calls")

        code = "call_tools(Array.from({length: 100}, (_, i) => ({server: 's', tool: 't', args: {i}}))).length"
        t0 = time.perf_counter()
        for _ in range(10):
            outcome = await execute_code({"code": code}, answer, pool=pool, limits=limits)
            assert outcome.data["value"] == 100, outcome.text
        print(f"call_tools batch of 100: {(time.perf_counter() - t0) / 10 * 1000:.1f} ms per run")

        t0 = time.perf_counter()
        await execute_code(
            {"code": "const x: number = 1; x", "language": "typescript"}, answer, pool=pool, limits=limits
        )
        print(f"first TypeScript run (loads the compiler): {(time.perf_counter() - t0) * 1000:.0f} ms")
        t0 = time.perf_counter()
        await execute_code(
            {"code": "const y: number = 2; y", "language": "typescript"}, answer, pool=pool, limits=limits
        )
        print(f"next TypeScript run: {(time.perf_counter() - t0) * 1000:.0f} ms")
        rss, pss = memory_mb(pid)
        print(f"memory with the TypeScript compiler loaded: RSS {rss:.1f} MB" + (f", PSS {pss:.1f} MB" if pss else ""))
    finally:
        await pool.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--calls", type=int, default=500)
    args = parser.parse_args()
    trio.run(main, args.runs, args.calls)
