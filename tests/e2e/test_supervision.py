"""Supervision end to end: restarts, backoff, hangs, config updates, orphans, sd_notify."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
import trio
from mcp.shared.exceptions import MCPError

from tests.support.stack import alive, echo_server, open_stack, write_config


class ListChanged:
    """Collects tools/list_changed notifications a client receives."""

    def __init__(self) -> None:
        self.count = 0
        self.event = trio.Event()

    async def __call__(self, message: Any) -> None:
        if isinstance(message, types.ServerNotification) and message.method == "notifications/tools/list_changed":
            self.count += 1
            self.event.set()

    def arm(self) -> None:
        """Forget notices received so far: `until` waits for new ones."""
        self.event = trio.Event()

    async def until(self, holds: Callable[[], Awaitable[bool]], timeout: float) -> None:
        """Wait for notices until `holds()` is true after one; at least one must come.

        The frontend coalesces a burst of changes into one notice, so "gone" and "back" may
        arrive as two notices or as one.
        """
        with trio.fail_after(timeout):
            while True:
                await self.event.wait()
                self.event = trio.Event()
                if await holds():
                    return


async def test_kill_9_of_worker_and_upstream_under_load(tmp_path: Path) -> None:
    """Given 8 clients calling, when the worker and later the upstream are SIGKILLed, calls fail fast
    or succeed, the restart shows in ctl status and in a list_changed notice, and calls recover."""
    async with open_stack(tmp_path, {"echo": echo_server(), "other": echo_server("other")}) as stack:
        notices = ListChanged()
        outcomes: list[tuple[str, float]] = []
        stop = trio.Event()

        async def caller(index: int) -> None:
            async with stack.client(mode="legacy") as client:
                while not stop.is_set():
                    start = trio.current_time()
                    try:
                        await client.call_tool("echo:echo", {"text": f"{index}"})
                        outcomes.append(("ok", trio.current_time() - start))
                    except MCPError as exc:
                        assert "echo" in exc.error.message, exc.error.message
                        outcomes.append(("error", trio.current_time() - start))
                        await trio.sleep(0.05)

        async with stack.client(mode="legacy", message_handler=notices) as watcher:
            await watcher.list_tools()
            before = stack.status()["echo"]
            async with trio.open_nursery() as nursery:
                for index in range(8):
                    nursery.start_soon(caller, index)
                await trio.sleep(1.0)

                async def echo_listed() -> bool:
                    return "echo:echo" in {t.name for t in (await watcher.list_tools()).tools}

                # 1. the worker process dies: the client is told, and its tools come back
                notices.arm()
                os.kill(before["pid"], signal.SIGKILL)
                rows = await stack.wait_status(
                    lambda r: r["echo"]["pid"] not in (0, before["pid"]) and r["echo"]["upstream"] == "ready"
                )
                await notices.until(echo_listed, timeout=15)
                assert rows["other"]["pid"] == stack.status()["other"]["pid"]  # the other server was not touched

                # 2. the upstream dies under the new worker
                upstream_pid = int((await watcher.call_tool("echo:pid", {})).content[0].text)
                notices.arm()
                os.kill(upstream_pid, signal.SIGKILL)
                await stack.wait_status(lambda r: r["echo"]["upstream"] == "ready")
                await notices.until(echo_listed, timeout=15)
                recovered_at = len(outcomes)
                await trio.sleep(1.0)
                stop.set()
        assert outcomes, "the callers never ran"
        errors = [duration for kind, duration in outcomes if kind == "error"]
        assert all(duration < 3.0 for duration in errors), f"a failing call hung: {max(errors)}"
        after = outcomes[recovered_at + 16 :]  # a call or two per client may still be in flight
        assert after and all(kind == "ok" for kind, _ in after)


async def test_upstream_that_exits_at_once_backs_off_then_is_fatal_until_started(tmp_path: Path) -> None:
    flag = tmp_path / "broken"
    flag.write_text("while this file exists the upstream exits")
    servers = {
        "flaky": echo_server("flaky", "--exit-if-exists", str(flag), policy={"startretries": 2, "startsecs": 0.5}),
    }
    async with open_stack(tmp_path, servers, wait_for=[]) as stack:
        seen: list[str] = []

        def fatal(rows: dict[str, Any]) -> bool:
            state = rows["flaky"]["state"]
            if not seen or seen[-1] != state:
                seen.append(state)
            return state == "FATAL"

        rows = await stack.wait_status(fatal, timeout=30)
        assert "BACKOFF" in seen
        assert "exited with status 3: exiting at once, as asked" in rows["flaky"]["description"]
        code, text = await stack.actl("status", json_output=False)
        assert code == 3
        assert "FATAL" in text
        log = stack.log("../supervisor.out")
        delays = _backoff_delays(log)
        assert delays == sorted(delays) and len(delays) >= 2, log  # growing delays

        flag.unlink()
        code, result = await stack.actl("start", "flaky")
        assert code == 0, result
        rows = stack.status()
        assert rows["flaky"]["state"] == "RUNNING"
        await stack.wait_ready(["flaky"])


def _backoff_delays(log: str) -> list[float]:
    """Seconds spent in BACKOFF for each retry, from the supervisor's state-change log lines."""
    import datetime

    entered: datetime.datetime | None = None
    delays = []
    for line in log.splitlines():
        if "worker:flaky:" not in line:
            continue
        stamp = datetime.datetime.strptime(line.split()[0], "%Y-%m-%dT%H:%M:%S.%fZ")
        if line.endswith("-> BACKOFF"):
            entered = stamp
        elif "BACKOFF -> STARTING" in line and entered is not None:
            delays.append((stamp - entered).total_seconds())
    return delays


async def test_hung_upstream_is_detected_and_replaced(tmp_path: Path) -> None:
    servers = {"echo": echo_server(policy={"ping_interval": 0.5, "ping_timeout": 1, "call_timeout": 60})}
    async with open_stack(tmp_path, servers) as stack, stack.client() as client:
        upstream_pid = int((await client.call_tool("echo:pid", {})).content[0].text)
        os.kill(upstream_pid, signal.SIGSTOP)
        try:
            with trio.fail_after(10):
                # A call in flight when the hang is noticed fails, and quickly, not after call_timeout.
                with pytest.raises(MCPError, match="echo"):
                    await client.call_tool("echo:echo", {"text": "into the void"})
            await stack.wait_ready(["echo"], timeout=20)
            new_pid = int((await client.call_tool("echo:pid", {})).content[0].text)
            assert new_pid != upstream_pid
            with trio.fail_after(10):
                while alive(upstream_pid):
                    await trio.sleep(0.1)
        finally:
            if alive(upstream_pid):
                os.kill(upstream_pid, signal.SIGKILL)


async def test_a_burst_of_list_changed_causes_at_most_two_discoveries(tmp_path: Path) -> None:
    async with open_stack(tmp_path, {"echo": echo_server()}) as stack, stack.client() as client:
        before = await _discoveries(stack)
        result = await client.call_tool("echo:notify_changes", {"count": 1000})
        assert result.content[0].text == "sent 1000"
        await trio.sleep(2.0)  # let every notification arrive and any discovery finish
        after = await _discoveries(stack)
        assert 1 <= after - before <= 2, (before, after)


async def _discoveries(stack: Any) -> int:
    _code, rows = await stack.actl("status", "echo")
    return rows[0]["discoveries"]


async def test_update_restarts_only_the_changed_server(tmp_path: Path) -> None:
    servers = {"a": echo_server("a"), "b": echo_server("b"), "c": echo_server("c")}
    async with open_stack(tmp_path, servers) as stack:
        before = stack.status()
        changed = {**servers, "b": echo_server("b-changed"), "d": echo_server("d")}
        del changed["c"]
        settings = {
            "listen": f"127.0.0.1:{stack.port}",
            "enable_direct_endpoint": True,
            "data_dir": str(stack.data_dir),
        }
        write_config(stack.config_path, changed, settings)
        code, diff = await stack.actl("reread")
        assert code == 0
        assert diff == {
            "added": ["d"],
            "changed": ["b"],
            "removed": ["c"],
            "settings_changed": False,
            "telemetry_changed": False,
        }
        assert stack.status()["b"]["pid"] == before["b"]["pid"]  # reread changes nothing

        code, diff = await stack.actl("update")
        assert code == 0, diff
        await stack.wait_ready(["a", "b", "d"])
        after = stack.status()
        assert after["a"]["pid"] == before["a"]["pid"]
        assert after["b"]["pid"] != before["b"]["pid"]
        assert "c" not in after
        assert not alive(before["c"]["pid"])
        async with stack.client() as client:
            prompt = await client.get_prompt("b:greet", {"who": "x"})
            assert "b-changed" in prompt.messages[0].content.text


async def test_sighup_with_a_broken_config_keeps_the_running_one(tmp_path: Path) -> None:
    async with open_stack(tmp_path, {"echo": echo_server()}) as stack:
        before = stack.status()
        stack.config_path.write_text("[servers.echo]\ncomand = 'typo'\n")
        stack.process.send_signal(signal.SIGHUP)
        with trio.fail_after(10):
            while "config not reloaded" not in stack.supervisor_output():
                await trio.sleep(0.1)
        assert "unknown key `servers.echo.comand`" in stack.supervisor_output()
        assert stack.status()["echo"]["pid"] == before["echo"]["pid"]
        async with stack.client() as client:
            assert (await client.call_tool("echo:echo", {"text": "alive"})).content[0].text == "alive"


async def test_disable_and_enable_persist_and_notify_clients(tmp_path: Path) -> None:
    async with open_stack(tmp_path, {"echo": echo_server(), "other": echo_server("other")}) as stack:
        notices = ListChanged()
        async with stack.client(mode="legacy", message_handler=notices) as client:
            await client.list_tools()

            async def names() -> set[str]:
                return {t.name for t in (await client.list_tools()).tools}

            async def echo_gone() -> bool:
                listed = await names()
                return not any(n.startswith("echo:") for n in listed) and "other:echo" in listed

            async def echo_back() -> bool:
                return "echo:echo" in await names()

            notices.arm()
            code, result = await stack.actl("disable", "echo")
            assert code == 0 and result == {"name": "echo", "enabled": False}
            await notices.until(echo_gone, timeout=10)
            assert "enabled = false" in stack.config_path.read_text()
            assert (stack.config_path.parent / "mcpvisor.toml.bak").exists()
            code, text = await stack.actl("status", json_output=False)
            assert code == 3 and "disabled" in text

            notices.arm()
            code, result = await stack.actl("enable", "echo")
            assert code == 0
            await stack.wait_ready(["echo"])
            await notices.until(echo_back, timeout=10)
            assert "enabled = false" not in stack.config_path.read_text()


async def test_ctl_commands_and_lsb_exit_codes(tmp_path: Path) -> None:
    async with open_stack(tmp_path, {"echo": echo_server()}) as stack:
        code, text = await stack.actl("status", json_output=False)
        assert code == 0
        lines = text.splitlines()
        assert lines[0].startswith("frontend  ") and "RUNNING" in lines[0]
        assert "echo" in lines[1] and "RUNNING" in lines[1] and "ready" in lines[1] and "tools" in lines[1]
        assert (await stack.actl("status", "nope"))[0] == 4
        assert (await stack.actl("restart", "nope"))[0] == 4
        code, pids = await stack.actl("pid", "all")
        assert set(pids) == {"frontend", "echo"} and all(pid > 0 for pid in pids.values())
        code, text = await stack.actl("pid", json_output=False)
        assert int(text) == stack.process.pid
        code, result = await stack.actl("stop", "echo")
        assert result == [{"name": "echo", "outcome": "stopped", "state": "STOPPED"}]
        assert not alive(pids["echo"])
        assert (await stack.actl("status", "echo"))[0] == 3
        code, result = await stack.actl("start", "echo")
        assert code == 0 and result[0]["outcome"] == "started"
        # RUNNING means the worker reported in; its upstream may reach "ready" a moment later.
        with trio.fail_after(20):
            while True:
                code, tail = await stack.actl("tail", "echo", "-n", "5")
                assert [s["stream"] for s in tail["streams"]] == ["worker", "stderr"]
                if "upstream echo: ready" in tail["streams"][0]["text"]:
                    break
                await trio.sleep(0.1)
        code, text = await stack.actl("help", "tail", json_output=False)
        assert code == 0 and "the upstream's stderr" in text
        # The supervisor's own log in the data dir: one JSON event per line.
        events = [json.loads(line) for line in stack.log("supervisor.log").splitlines()]
        assert any(
            e.get("event") == "state" and e.get("name") == "worker:echo" and e.get("to") == "RUNNING" for e in events
        )
        assert any(e.get("event") == "command" and e.get("command") == "stop" for e in events)
        code, result = await stack.actl("shutdown")
        assert code == 0
        with trio.fail_after(20):
            while stack.process.poll() is None:
                await trio.sleep(0.1)
        assert stack.process.returncode == 0
    missing = stack.ctl("status")
    assert missing[0] == 4  # no daemon answering


async def test_tail_follow_prints_new_lines(tmp_path: Path) -> None:
    async with open_stack(tmp_path, {"echo": echo_server()}) as stack:
        out_path = tmp_path / "follower.out"
        command = [sys.executable, "-m", "mcpvisor.supervisor", "ctl", "-c", str(stack.config_path)]
        with out_path.open("w") as out:
            follower = subprocess.Popen([*command, "tail", "-f", "echo", "worker"], stdout=out, env=stack.env)
        try:
            with trio.fail_after(20):
                while "upstream echo: ready" not in out_path.read_text():
                    await trio.sleep(0.1)
            assert "received SIGTERM" not in out_path.read_text()
            await stack.actl("restart", "echo")
            with trio.fail_after(20):
                while "received SIGTERM" not in out_path.read_text():  # written after the follower started
                    await trio.sleep(0.1)
            # SIGTERM ends following as Ctrl-C does (SIGINT may be ignored by whatever started us).
            follower.terminate()
            assert follower.wait(timeout=10) == 0
        finally:
            if follower.poll() is None:
                follower.kill()
                follower.wait()


async def test_sigkill_of_the_supervisor_leaves_no_process_behind(tmp_path: Path) -> None:
    async with open_stack(tmp_path, {"a": echo_server("a"), "b": echo_server("b")}) as stack:
        async with stack.client() as client:
            upstream = int((await client.call_tool("a:pid", {})).content[0].text)
        tree = stack.pids()
        assert upstream in tree and len(tree) >= 6  # supervisor, frontend, 2 workers, 2 upstreams
        stack.process.kill()
        with trio.fail_after(10):
            while any(alive(pid) for pid in tree):
                await trio.sleep(0.1)


async def test_graceful_stop_lets_calls_in_flight_finish(tmp_path: Path) -> None:
    servers = {"echo": echo_server(policy={"stopwaitsecs": 10})}
    async with open_stack(tmp_path, servers) as stack, stack.client() as client:
        results: list[str] = []

        async def slow() -> None:
            result = await client.call_tool("echo:slow", {"seconds": 1.5})
            results.append(result.content[0].text)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(slow)
            await trio.sleep(0.5)
            nursery.start_soon(stack.actl, "stop", "echo")
        assert results == ["slept 1.5"]


async def test_sd_notify_ready_and_stopping(tmp_path: Path) -> None:
    directory = tempfile.mkdtemp(prefix="sd", dir="/tmp")
    address = os.path.join(directory, "notify")
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    await sock.bind(address)
    messages: list[str] = []

    async def collect() -> None:
        while True:
            data = await sock.recv(4096)
            messages.extend(data.decode().splitlines())

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect)
            async with open_stack(tmp_path, {"echo": echo_server()}, env={"NOTIFY_SOCKET": address}):
                with trio.fail_after(10):
                    while "READY=1" not in messages:
                        await trio.sleep(0.05)
                assert any(m.startswith("STATUS=") and "upstreams ready" in m for m in messages)
            with trio.fail_after(5):
                while "STOPPING=1" not in messages:
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
    finally:
        sock.close()
    assert messages.index("READY=1") < messages.index("STOPPING=1")


async def test_a_hung_worker_is_killed_and_restarted(tmp_path: Path) -> None:
    """Given a worker that stops answering (SIGSTOP), the supervisor kills it and starts a new one."""
    servers = {"echo": echo_server(policy={"heartbeat_timeout": 2})}
    async with open_stack(tmp_path, servers) as stack:
        before = stack.status()["echo"]["pid"]
        os.kill(before, signal.SIGSTOP)
        try:
            await stack.wait_status(
                lambda r: (
                    r["echo"]["pid"] not in (0, before)
                    and r["echo"].get("upstream") == "ready"
                    and r["echo"]["state"] == "RUNNING"
                ),
                timeout=30,
            )
        finally:
            if alive(before):
                os.kill(before, signal.SIGKILL)
        with trio.fail_after(10):
            while alive(before):
                await trio.sleep(0.1)
        assert "worker:echo: no report for" in stack.supervisor_output()
        async with stack.client() as client:
            assert (await client.call_tool("echo:echo", {"text": "back"})).content[0].text == "back"
