"""Replicas behind a real HAProxy (the shipped config): one leaves gracefully, one dies.

Given two `mcpvisor serve` replicas of the same config sharing one PostgreSQL store, behind HAProxy, and SDK clients calling
through it: SIGTERM to one replica reports it not-ready at once, fails no call and ends it once its
calls are done; `kill -9` of one fails only the calls in flight on it, and the handshake-era
sessions it held get 404 (with "Session not found"), or their connection closed when a call met
a kept-alive connection to the dead replica, and start again on the other replica.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.support.haproxy import HAProxy, open_haproxy
from tests.support.postgres import cluster_fixture, database_fixture
from tests.support.stack import Stack, alive, echo_server, open_replicas, open_stack

MODERN = "2026-07-28"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
}
ACCEPT = {"accept": "application/json, text/event-stream"}
LEAVE_DELAY = 3.0  # more than HAProxy's health check needs to take a replica out (inter 1s, fall 1)


postgres_cluster = cluster_fixture()
postgres_url = database_fixture()


@asynccontextmanager
async def replicas_behind_haproxy(
    tmp_path: Path, count: int, state_url: str
) -> AsyncIterator[tuple[list[Stack], HAProxy]]:
    """`count` replicas sharing one PostgreSQL store, behind HAProxy running the shipped config."""
    async with AsyncExitStack() as stack:
        replicas = await stack.enter_async_context(
            open_replicas(
                tmp_path, count, {"echo": echo_server()}, state_url=state_url, settings={"leave_delay": LEAVE_DELAY}
            )
        )
        servers = {f"replica{i}": replica.port for i, replica in enumerate(replicas, 1)}
        proxy = await stack.enter_async_context(open_haproxy(tmp_path, servers))
        await wait_in_rotation(proxy, len(replicas))
        yield replicas, proxy


async def wait_in_rotation(proxy: HAProxy, count: int) -> None:
    """Until HAProxy has sent calls to `count` replicas (its health checks found them up)."""
    seen: set[str] = set()
    with trio.fail_after(30):
        async with Client(f"{proxy.base_url}/mcp/direct", mode=MODERN) as client:
            while len(seen) < count:
                await client.call_tool("echo:echo", {"text": "up?"})
                seen = {line.server for line in proxy.log() if line.status == 200}
                await trio.sleep(0.1)


def text_of(result: Any) -> str:
    assert not result.is_error, result
    return result.content[0].text


async def steady_load(url: str, failures: list[str], done: trio.Event, counts: dict[str, int]) -> None:
    """One 2026-07-28 client calling without pause (a slow call now and then) until `done`."""
    async with Client(url, mode=MODERN) as client:
        n = 0
        while not done.is_set():
            n += 1
            try:
                if n % 10 == 0:
                    assert text_of(await client.call_tool("echo:slow", {"seconds": 0.5})).startswith("slept")
                else:
                    assert text_of(await client.call_tool("echo:echo", {"text": f"call {n}"})) == f"call {n}"
                counts["ok"] = counts.get("ok", 0) + 1
            except (MCPError, httpx2.HTTPError, AssertionError) as exc:
                failures.append(f"{type(exc).__name__}: {exc}")


async def test_sigterm_to_one_replica_under_steady_load_fails_no_call(tmp_path: Path, postgres_url: str) -> None:
    async with replicas_behind_haproxy(tmp_path, 2, postgres_url) as (replicas, proxy):
        leaving, staying = replicas
        failures: list[str] = []
        counts: dict[str, int] = {}
        done = trio.Event()
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(steady_load, f"{proxy.base_url}/mcp/direct", failures, done, counts)
            await trio.sleep(1.5)
            served_before = {line.server for line in proxy.log() if line.status == 200}
            leaving.process.send_signal(signal.SIGTERM)
            # Not ready at once, while it still serves calls.
            with trio.fail_after(5):
                while True:
                    async with httpx2.AsyncClient(timeout=5) as http:
                        health = await http.get(f"{leaving.base_url}/healthz")
                    if health.status_code == 503:
                        break
                    await trio.sleep(0.02)
            assert health.json() == {"status": "leaving"}
            async with httpx2.AsyncClient(timeout=5) as http:
                refused = await http.post(f"{leaving.base_url}/mcp/direct", json=INITIALIZE, headers=ACCEPT)
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            assert "stopping" in refused.json()["error"]["message"]
            # Through HAProxy, new sessions start meanwhile: on the other replica, or retried there
            # when the leaving one refused them before HAProxy's health check took it out.
            async with httpx2.AsyncClient(timeout=10) as http:
                for _ in range(6):
                    started = await http.post(f"{proxy.base_url}/mcp/direct", json=INITIALIZE, headers=ACCEPT)
                    assert started.status_code == 200, started.text
                    assert started.headers["mcp-session-id"]
            with trio.fail_after(LEAVE_DELAY + 30):
                while leaving.process.poll() is None:
                    await trio.sleep(0.1)
            ok_at_exit = counts["ok"]
            await trio.sleep(1)
            done.set()
        assert leaving.process.returncode == 0, leaving.supervisor_output()
        assert served_before == {"replica1", "replica2"}
        assert failures == []
        assert counts["ok"] > ok_at_exit  # the other replica went on serving
        async with Client(staying.direct_url, mode=MODERN) as client:
            assert text_of(await client.call_tool("echo:echo", {"text": "still here"})) == "still here"


@asynccontextmanager
async def busy_machine(processes: int) -> AsyncIterator[None]:
    """As many processes spinning on the CPU, so the replicas and HAProxy wait for their turns."""
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for process in spinning:
            process.kill()
            process.wait()


async def test_sigterm_to_one_replica_of_a_busy_machine_under_many_clients_fails_no_call(
    tmp_path: Path, postgres_url: str
) -> None:
    async with replicas_behind_haproxy(tmp_path, 2, postgres_url) as (replicas, proxy), busy_machine(2):
        leaving, _staying = replicas
        failures: list[str] = []
        counts: dict[str, int] = {}
        done = trio.Event()
        async with trio.open_nursery() as nursery:
            for _ in range(12):
                nursery.start_soon(steady_load, f"{proxy.base_url}/mcp/direct", failures, done, counts)
            await trio.sleep(2)
            leaving.process.send_signal(signal.SIGTERM)
            with trio.fail_after(LEAVE_DELAY + 60):
                while leaving.process.poll() is None:
                    await trio.sleep(0.1)
            ok_at_exit = counts["ok"]
            await trio.sleep(2)  # and after it: the calls go on, on the other replica
            done.set()
        assert leaving.process.returncode == 0, leaving.supervisor_output()
        assert failures == []
        assert counts["ok"] > ok_at_exit > 0


async def test_a_call_begun_while_leaving_and_outlasting_the_delay_is_answered(tmp_path: Path) -> None:
    settings = {"leave_delay": LEAVE_DELAY}
    async with open_stack(tmp_path, {"echo": echo_server()}, settings=settings) as stack:
        async with Client(stack.direct_url, mode=MODERN) as client:
            assert text_of(await client.call_tool("echo:echo", {"text": "up"})) == "up"
            stack.process.send_signal(signal.SIGTERM)  # nothing in flight: the replica is idle now
            with trio.fail_after(5):
                while (await stack.health()) != {"status": "leaving"}:
                    await trio.sleep(0.02)
            # Begun within the delay (the balancer may still send calls), it ends after the delay.
            seconds = LEAVE_DELAY + 2
            assert text_of(await client.call_tool("echo:slow", {"seconds": seconds})) == f"slept {seconds}"
        with trio.fail_after(30):
            while stack.process.poll() is None:
                await trio.sleep(0.1)
        assert stack.process.returncode == 0, stack.supervisor_output()


async def replica_of(client: Client, replicas: list[Stack]) -> int:
    """Which replica serves this session: the one whose process tree holds the upstream answering."""
    pid = int(text_of(await client.call_tool("echo:pid", {})))
    return next(i for i, replica in enumerate(replicas) if pid in replica.pids())


@dataclass
class Session:
    """One handshake-era session through HAProxy, held by a task of its own (see `hold_session`)."""

    home: int = -1
    outcome: str = ""  # after the kill: "replicaN" answered, "refused: ..." (an MCP error), "dropped: ..."


async def hold_session(
    url: str,
    replicas: list[Stack],
    session: Session,
    killed: trio.Event,
    *,
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    """Open a session, learn its replica and check affinity, then call once more after `killed`.

    A task of its own, because the SDK's client ends, with its caller, when a request's connection
    breaks: HAProxy closes a keep-alive client connection without an answer when the request it
    carried met a server connection that had just died ("the client is required to retry"). For a
    session of the replica that died, that is as good an answer as a 404.
    """
    try:
        async with Client(url, mode="legacy") as client:
            session.home = await replica_of(client, replicas)
            for _ in range(3):  # affinity: every call of a session goes to the replica that created it
                assert await replica_of(client, replicas) == session.home
            task_status.started()
            await killed.wait()
            try:
                session.outcome = f"replica{await replica_of(client, replicas)}"
            except MCPError as exc:
                session.outcome = f"refused: {exc}"
    except* httpx2.HTTPError as group:
        if session.outcome:
            raise  # it broke after its answer: not what this test tells apart
        session.outcome = f"dropped: {group.exceptions[0]!r}"


async def test_kill_9_of_one_replica_costs_only_its_own_sessions(tmp_path: Path, postgres_url: str) -> None:
    async with replicas_behind_haproxy(tmp_path, 2, postgres_url) as (replicas, proxy):
        url = f"{proxy.base_url}/mcp/direct"
        sessions = [Session() for _ in range(4)]
        killed = trio.Event()
        async with trio.open_nursery() as holders:
            for session in sessions:
                await holders.start(hold_session, url, replicas, session, killed)
            homes = [session.home for session in sessions]
            if len(set(homes)) < 2:
                pytest.fail(f"HAProxy put every session on one replica: {homes}")
            doomed = homes[0]
            in_flight: list[str] = []
            calling = trio.Event()

            async def slow_call_on_doomed_replica() -> None:
                # A session of its own: the SDK's client ends when a request's connection breaks.
                try:
                    while True:
                        async with Client(url, mode="legacy") as client:
                            if await replica_of(client, replicas) != doomed:
                                continue
                            calling.set()
                            await client.call_tool("echo:slow", {"seconds": 10})
                            in_flight.append("answered")
                            return
                except (MCPError, httpx2.HTTPError, BaseExceptionGroup) as exc:
                    in_flight.append(f"failed: {exc!r}")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(slow_call_on_doomed_replica)
                with trio.fail_after(30):
                    await calling.wait()
                await trio.sleep(1)
                victims = replicas[doomed].pids()
                for pid in victims:
                    os.kill(pid, signal.SIGKILL)
            assert in_flight and in_flight[0].startswith("failed"), in_flight
            with trio.fail_after(10):  # SIGKILL is delivered at once, the exits take a moment
                while any(alive(pid) for pid in victims):
                    await trio.sleep(0.05)
            killed.set()

        survivor = 1 - doomed
        for session in sessions:
            if session.home == survivor:
                # The other replica's sessions never noticed.
                assert session.outcome == f"replica{survivor}", session
            else:
                assert re.match(r"refused: Session (not found|terminated)|dropped: ", session.outcome), session
        if any(session.outcome.startswith("refused") for session in sessions):
            lost = [line for line in proxy.log() if line.status == 404 and line.server == f"replica{survivor + 1}"]
            assert lost, "the sessions of the replica that died were answered 404 by the other one"
        # A client whose session ended starts a new one, as the MCP specification asks: it lands
        # on the replica that is left.
        async with Client(url, mode="legacy") as again:
            assert await replica_of(again, replicas) == survivor
        # Stateless 2026-07-28 calls go on too.
        async with Client(url, mode=MODERN) as modern:
            for n in range(5):
                assert text_of(await modern.call_tool("echo:echo", {"text": f"n{n}"})) == f"n{n}"
