"""Calls while workers and upstreams are killed: does every call come back, and does mcpvisor recover?

    python tests/bench/bench_chaos.py [--calls 1000] [--runs 3] [--seed 1] [--clients 4] [--pace 0.1] [--pollers 0]

Each run starts a stack with two stdio upstreams (`calc` and `other`, tests/upstreams/echo_server.py)
and has `--clients` SDK clients call `calc:add` and `other:add` on /mcp/direct until `--calls`
calls have come back (each client waits `--pace` seconds between calls), while a killer sends SIGKILL every 0.5-2 s (drawn from the seed) to a
worker or to an upstream process, of either server. Meanwhile `status` is read every 0.2 s on
the control socket; a process the supervisor calls RUNNING whose pid is 0 or names no live
process is a phantom (STARTING too: the spawn takes moments), and one that lasts over 10 s is
reported: a supervisor that believes in a process it cannot name. After the calls, the killing stops and the run waits up to 60 s for
both servers to be RUNNING, ready, and answering a call.

`--pollers N` adds N threads that ask for `status` without pause: a supervisor busy answering is
one that collects a dead child's status from a status read rather than from its lifecycle loop,
the unlucky moment that used to leave a phantom behind.

Printed per run: calls ok and failed, the slowest call, phantoms seen, `status` questions the
supervisor left unanswered for 30 s, and the recovery time.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

import httpx2
import trio
from mcp.shared.exceptions import MCPError

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from mcpvisor.supervisor.ctl import NoDaemon
from tests.support.stack import alive, descendants, echo_server, open_stack

SERVERS = ("calc", "other")
PHANTOM_AFTER = 10.0


async def one_run(seed: int, calls: int, clients: int, pace: float, pollers: int) -> dict[str, object]:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        # A kill during a start is a failed start, and supervisord's rules make a server FATAL after
        # `startretries` of them in a row; here the kills are the test's, so retries are plenty.
        servers = {name: echo_server(name, policy={"startretries": 1000}) for name in SERVERS}
        async with open_stack(Path(tmp), servers) as stack:
            done = 0
            ok = 0
            failed: dict[str, int] = {}
            slowest = 0.0
            kills: list[str] = []
            phantom_since: dict[str, float] = {}
            phantoms: list[str] = []
            silences = 0  # status questions the supervisor left unanswered for 30 s
            finished = trio.Event()

            def status() -> dict[str, dict[str, object]]:
                nonlocal silences
                try:
                    return stack.status()
                except NoDaemon:
                    silences += 1
                    print("  the supervisor did not answer `status` within 30 s", file=sys.stderr)
                    return {}

            async def caller(index: int) -> None:
                nonlocal done, ok, slowest
                async with stack.client(mode="legacy") as client:
                    turn = index
                    while done < calls:
                        server = SERVERS[turn % 2]
                        turn += 1
                        started = time.monotonic()
                        try:
                            with trio.fail_after(60):
                                result = await client.call_tool(f"{server}:add", {"a": turn, "b": 1})
                            if result.is_error:
                                text = result.content[0].text if result.content else "?"
                                failed[text[:60]] = failed.get(text[:60], 0) + 1
                            else:
                                ok += 1
                        except MCPError as exc:
                            failed[exc.error.message[:60]] = failed.get(exc.error.message[:60], 0) + 1
                            await trio.sleep(0.05)
                        except (OSError, httpx2.HTTPError, trio.TooSlowError) as exc:
                            # The connection itself failed: mcpvisor's frontend is not what is killed here.
                            failed[f"client: {type(exc).__name__}"] = failed.get(f"client: {type(exc).__name__}", 0) + 1
                            break
                        slowest = max(slowest, time.monotonic() - started)
                        done += 1
                        await trio.sleep(pace)
                finished.set()

            async def killer() -> None:
                while not finished.is_set():
                    await trio.sleep(rng.uniform(0.5, 2.0))
                    rows = await trio.to_thread.run_sync(status)
                    server = rng.choice(SERVERS)
                    worker = rows.get(server, {}).get("pid")
                    if not worker:
                        continue
                    target = worker
                    if rng.random() < 0.5:
                        below = sorted(descendants(worker))
                        if below:
                            target = below[0]
                    kind = "worker" if target == worker else "upstream"
                    try:
                        os.kill(target, signal.SIGKILL)
                        kills.append(f"{kind}:{server}")
                    except ProcessLookupError:
                        pass

            async def watcher() -> None:
                while not finished.is_set():
                    rows = await trio.to_thread.run_sync(status)
                    now = time.monotonic()
                    for name in SERVERS:
                        if name not in rows:
                            continue
                        row = rows[name]
                        # RUNNING or STARTING with no live process behind it: a spawn takes moments,
                        # so only one that lasts is a phantom.
                        ghost = row["state"] in ("RUNNING", "STARTING") and (not row["pid"] or not alive(row["pid"]))
                        if not ghost:
                            phantom_since.pop(name, None)
                            continue
                        since = phantom_since.setdefault(name, now)
                        if now - since > PHANTOM_AFTER and name not in phantoms:
                            phantoms.append(name)
                            print(
                                f"  phantom: {name} {row['state']} pid {row['pid']} for over {PHANTOM_AFTER} s",
                                file=sys.stderr,
                            )
                    await trio.sleep(0.2)

            async def poller() -> None:
                def ask_until_finished() -> None:
                    while not finished.is_set():
                        status()

                await trio.to_thread.run_sync(ask_until_finished)

            started = time.monotonic()
            async with trio.open_nursery() as nursery:
                for index in range(clients):
                    nursery.start_soon(caller, index)
                nursery.start_soon(killer)
                nursery.start_soon(watcher)
                for _ in range(pollers):
                    nursery.start_soon(poller)
            wall = time.monotonic() - started
            # Recovery: both RUNNING with a live pid, ready, and answering.
            recovered_at = time.monotonic()
            recovery = None
            deadline = recovered_at + 60
            while time.monotonic() < deadline:
                try:
                    await stack.wait_ready(list(SERVERS), timeout=2)
                    rows = await trio.to_thread.run_sync(status)
                    if rows and all(
                        rows[n]["state"] == "RUNNING" and rows[n]["pid"] and alive(rows[n]["pid"]) for n in SERVERS
                    ):
                        async with stack.client(mode="legacy") as client:
                            with trio.fail_after(10):
                                for name in SERVERS:
                                    result = await client.call_tool(f"{name}:add", {"a": 1, "b": 1})
                                    assert not result.is_error
                        recovery = time.monotonic() - recovered_at
                        break
                except (TimeoutError, MCPError, AssertionError, trio.TooSlowError):
                    pass
                await trio.sleep(0.5)
            if recovery is None:
                print(f"  not recovered within 60 s: {await trio.to_thread.run_sync(status)}", file=sys.stderr)
    return {
        "seed": seed,
        "calls": done,
        "ok": ok,
        "failed": sum(failed.values()),
        "errors": failed,
        "slowest": slowest,
        "kills": len(kills),
        "phantoms": phantoms,
        "silences": silences,
        "recovery": recovery,
        "wall": wall,
    }


async def main(args: argparse.Namespace) -> None:
    results = []
    for run in range(args.runs):
        seed = args.seed + run
        print(f"run {run + 1}/{args.runs} (seed {seed})", file=sys.stderr)
        result = await one_run(seed, args.calls, args.clients, args.pace, args.pollers)
        results.append(result)
        recovery = "NOT RECOVERED" if result["recovery"] is None else f"recovered in {result['recovery']:.1f} s"
        print(
            f"seed {seed}: {result['calls']} calls in {result['wall']:.0f} s, {result['ok']} ok, "
            f"{result['failed']} failed, slowest {result['slowest']:.1f} s, {result['kills']} kills, "
            f"phantoms {result['phantoms'] or 'none'}, unanswered status {result['silences']}, {recovery}"
        )
        for message, count in sorted(result["errors"].items(), key=lambda item: -item[1])[:4]:
            print(f"    {count:5d} x {message}")
    bad = [r["seed"] for r in results if r["phantoms"] or r["recovery"] is None or r["silences"]]
    print(
        f"{len(results)} runs, {len(bad)} with a phantom, a silent supervisor or no recovery"
        f"{': seeds ' + str(bad) if bad else ''}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--pace", type=float, default=0.1)
    parser.add_argument("--pollers", type=int, default=0)
    trio.run(main, parser.parse_args())
