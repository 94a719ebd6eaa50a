"""How fast mcpvisor recovers and tells clients: the figures of supervision.

    python tests/bench/bench_recovery.py [--tries 20]

1. kill -9 of a worker -> its upstream ready again behind the frontend (polled on /healthz every
   5 ms), minus the upstream's own start time (transport opened to initialize answered, as the
   worker measured it), over N tries.
2. an admin `disable` (sent on the control socket) -> a connected client's
   notifications/tools/list_changed, over N tries (each followed by an `enable`).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import mcp_types as types
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from mcpvisor.supervisor.ctl import Connection, control_endpoint
from tests.support.stack import echo_server, open_stack


def summary(label: str, samples: list[float]) -> str:
    ms = [s * 1000 for s in samples]
    return f"{label:<58} median {statistics.median(ms):7.1f} ms   max {max(ms):7.1f} ms   (n={len(ms)})"


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with open_stack(Path(tmp), {"echo": echo_server(), "other": echo_server("other")}) as stack:
            os.environ["XDG_RUNTIME_DIR"] = stack.env["XDG_RUNTIME_DIR"]
            control = Connection(control_endpoint(stack.config_path), timeout=30)
            try:
                totals, upstream_starts = await restart_times(stack, args.tries)
                notices = await disable_notice_times(stack, control, args.tries)
            finally:
                control.close()
    print()
    print(summary("kill -9 worker -> upstream ready (total)", totals))
    print(summary("  of which the upstream's own start", upstream_starts))
    print(
        summary(
            "kill -9 worker -> ready, upstream start excluded",
            [t - u for t, u in zip(totals, upstream_starts, strict=True)],
        )
    )
    print(summary("admin disable -> client's tools/list_changed", notices))


async def restart_times(stack: Any, tries: int) -> tuple[list[float], list[float]]:
    totals: list[float] = []
    starts: list[float] = []
    for attempt in range(tries):
        before = stack.status()["echo"]
        os.kill(before["pid"], signal.SIGKILL)
        killed = time.perf_counter()
        while True:
            health = await stack.health()
            view = health["servers"].get("echo", {})
            if view.get("alive") and view.get("state") == "ready":
                now = time.perf_counter()
                rows = stack.status()
                if rows["echo"]["pid"] != before["pid"]:
                    break
            await trio.sleep(0.005)
        totals.append(now - killed)
        starts.append(rows["echo"]["connect_seconds"])
        print(f"restart {attempt + 1}/{tries}: {totals[-1] * 1000:.0f} ms", file=sys.stderr)
    return totals, starts


async def disable_notice_times(stack: Any, control: Connection, tries: int) -> list[float]:
    samples: list[float] = []
    arrived = trio.Event()
    arrived_at = 0.0

    async def on_message(message: Any) -> None:
        nonlocal arrived_at
        if (
            isinstance(message, types.ServerNotification)
            and message.method == "notifications/tools/list_changed"
            and not arrived.is_set()
        ):
            # Stamped here: the control reply itself only comes once the worker has stopped.
            arrived_at = time.perf_counter()
            arrived.set()

    async with stack.client(mode="legacy", message_handler=on_message) as client:
        await client.list_tools()
        for attempt in range(tries):
            await stack.wait_ready(["echo"])
            await trio.sleep(0.3)  # let the enable's own notices pass
            arrived = trio.Event()
            start = time.perf_counter()
            reply = await trio.to_thread.run_sync(control.call, "disable", ["echo"])
            assert reply.ok, reply.error
            with trio.fail_after(10):
                await arrived.wait()
            samples.append(arrived_at - start)
            print(f"disable {attempt + 1}/{tries}: {samples[-1] * 1000:.0f} ms", file=sys.stderr)
            reply = await trio.to_thread.run_sync(control.call, "enable", ["echo"])
            assert reply.ok, reply.error
    return samples


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tries", type=int, default=20)
    trio.run(main, parser.parse_args())
