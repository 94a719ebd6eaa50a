"""What a user meets in the first hour: stopping, a second `serve`, a taken port, `check`, `ctl -c`.

Each test is a row of what used to go wrong, played with a real supervisor, frontend and workers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
import tomli_w
import trio

from mcpvisor.supervisor.ctl import NoDaemon
from tests.support.stack import (
    Stack,
    alive,
    echo_server,
    launch_stack,
    open_stack,
    python_server,
    stop_stack,
    wait_stack,
)

GHOST = {"command": "no-such-command-anywhere"}
MCPVISOR = [sys.executable, "-P", "-m", "mcpvisor.supervisor"]


def mcpvisor(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MCPVISOR, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False)


async def exits_within(stack: Stack, seconds: float) -> int:
    with trio.fail_after(seconds):
        while stack.process.poll() is None:
            await trio.sleep(0.05)
    return stack.process.returncode


async def in_state(stack: Stack, name: str, state: str, timeout: float = 30) -> None:
    await stack.wait_status(lambda rows: rows.get(name, {}).get("state") == state, timeout=timeout)


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "ctl shutdown"])
async def test_a_stop_with_a_server_in_backoff_completes_at_once(tmp_path: Path, how: str) -> None:
    """Ctrl-C, SIGTERM or `ctl shutdown` with a server whose command is missing: it used to hang for ever."""
    stack = launch_stack(tmp_path, {"ghost": GHOST, "echo": echo_server()})
    try:
        await wait_stack(stack, ["echo"])
        await in_state(stack, "ghost", "BACKOFF")
        tree = stack.pids()
        if how == "ctl shutdown":
            code, _ = await stack.actl("shutdown")
            assert code == 0
        else:
            stack.process.send_signal(getattr(signal, how))
        assert await exits_within(stack, 15) == 0
        with trio.fail_after(5):
            while any(alive(pid) for pid in tree):
                await trio.sleep(0.05)
        assert "every process stopped" in stack.supervisor_output()
    finally:
        await stop_stack(stack)


async def test_ctl_stop_all_returns_with_a_server_in_backoff_and_start_brings_back_the_rest(tmp_path: Path) -> None:
    async with open_stack(tmp_path, {"ghost": GHOST, "echo": echo_server()}, wait_for=["echo"]) as stack:
        await in_state(stack, "ghost", "BACKOFF")
        with trio.fail_after(30):
            code, rows = await stack.actl("stop", "all")
        assert code == 0, rows
        assert {row["name"]: row["state"] for row in rows} == {
            "frontend": "STOPPED",
            "echo": "STOPPED",
            "ghost": "STOPPED",
        }
        assert (await stack.actl("status"))[0] == 3
        code, rows = await stack.actl("start", "frontend", "echo")
        assert code == 0, rows
        await stack.wait_ready(["echo"])
        assert stack.status()["ghost"]["state"] == "STOPPED"  # a stop is not undone by the others' start


async def call_in_flight(stack: Stack, nursery: trio.Nursery, seconds: float) -> None:
    """Start a call that takes `seconds` and return once it is in flight; mcpvisor may be stopped under it."""

    async def call() -> None:
        # Whatever the stop does to it (an error, a dropped connection) is not what is tested.
        with contextlib.suppress(Exception):
            async with stack.client() as client:
                await client.call_tool("echo:slow", {"seconds": seconds})

    nursery.start_soon(call)
    await trio.sleep(2.0)


async def test_a_second_signal_is_harmless_and_a_third_kills_every_process(tmp_path: Path) -> None:
    """A call in flight holds the worker's stop for its stopwaitsecs; the third signal does not wait."""
    servers = {"echo": echo_server(policy={"stopwaitsecs": 120, "call_timeout": 300})}
    async with open_stack(tmp_path, servers, settings={"leave_timeout": 120}) as stack:
        tree = stack.pids()
        async with trio.open_nursery() as nursery:
            await call_in_flight(stack, nursery, 300)
            stack.process.send_signal(signal.SIGTERM)
            await trio.sleep(1.0)
            stack.process.send_signal(signal.SIGTERM)
            await trio.sleep(2.0)
            assert stack.process.poll() is None, "a second signal must not change the stop"
            stack.process.send_signal(signal.SIGINT)
            assert await exits_within(stack, 15) == 0
            nursery.cancel_scope.cancel()
        output = stack.supervisor_output()
        assert "already stopping" in output
        assert "SIGKILL to every process now" in output
        with trio.fail_after(5):
            while any(alive(pid) for pid in tree):
                await trio.sleep(0.05)


async def test_a_stop_takes_the_largest_stopwaitsecs_and_no_more(tmp_path: Path) -> None:
    """A call that would take minutes, an upstream that ignores SIGTERM: neither holds the stop longer
    than the largest stopwaitsecs (the frontend's, here 10 + leave_timeout) and the moments SIGKILL takes."""
    servers = {
        "echo": echo_server(policy={"stopwaitsecs": 2, "call_timeout": 300}),
        "stubborn": python_server("raw_server.py", "--ignore-term", policy={"stopwaitsecs": 2}),
    }
    async with open_stack(tmp_path, servers, settings={"leave_timeout": 1}) as stack:
        tree = stack.pids()
        async with trio.open_nursery() as nursery:
            await call_in_flight(stack, nursery, 300)
            stack.process.send_signal(signal.SIGTERM)
            assert await exits_within(stack, 11 + 5 + 5) == 0
            nursery.cancel_scope.cancel()
        with trio.fail_after(5):
            while any(alive(pid) for pid in tree):
                await trio.sleep(0.05)


async def test_a_second_serve_of_the_same_config_is_refused_and_the_first_keeps_serving(tmp_path: Path) -> None:
    async with open_stack(tmp_path, {"echo": echo_server()}) as stack:
        started = time.monotonic()
        second = mcpvisor("serve", "-c", str(stack.config_path), env=stack.env, timeout=30)
        assert time.monotonic() - started < 15
        assert second.returncode == 1
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert f"pid {stack.process.pid}" in lines[0] and "control.sock" in lines[0], lines[0]
        # The first is untouched: its control socket answers, its tools work, ctl finds it.
        assert stack.status()["echo"]["state"] == "RUNNING"
        async with stack.client() as client:
            assert (await client.call_tool("echo:echo", {"text": "still here"})).content[0].text == "still here"
        assert (await stack.actl("status"))[0] == 0


async def test_the_lock_and_socket_of_a_killed_instance_are_taken_over(tmp_path: Path) -> None:
    stack = launch_stack(tmp_path, {"echo": echo_server()})
    try:
        await wait_stack(stack, ["echo"])
        tree = stack.pids()
        stack.process.kill()
        stack.process.wait()
        with trio.fail_after(10):
            while any(alive(pid) for pid in tree):
                await trio.sleep(0.05)
        assert (stack.run_dir / "control.sock").exists()  # left behind
        code, _ = await stack.actl("status")
        assert code == 4  # nothing answers on it
        again = launch_stack(tmp_path, {"echo": echo_server()}, port=stack.port)
        try:
            await wait_stack(again, ["echo"])
            assert (await again.actl("status"))[0] == 0
        finally:
            await stop_stack(again)
    finally:
        await stop_stack(stack)


async def test_two_data_dirs_run_side_by_side_in_one_runtime_dir(tmp_path: Path) -> None:
    """A user's second config (another data dir) must not be refused, nor take the first one's sockets."""
    shared = Path(tempfile.mkdtemp(prefix="mv", dir="/tmp"))
    env = {"XDG_RUNTIME_DIR": str(shared)}
    first = launch_stack(tmp_path / "one", {"a": echo_server("a")}, env=env)
    second = launch_stack(tmp_path / "two", {"b": echo_server("b")}, env=env)
    try:
        await wait_stack(first, ["a"])
        await wait_stack(second, ["b"])
        code, rows = await first.actl("status")
        assert code == 0 and {row["name"] for row in rows} == {"frontend", "a"}
        code, rows = await second.actl("status")
        assert code == 0 and {row["name"] for row in rows} == {"frontend", "b"}
    finally:
        await stop_stack(first)
        await stop_stack(second)


async def test_serve_on_a_port_in_use_exits_at_once_naming_the_address(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        stack = launch_stack(tmp_path, {"echo": echo_server()}, port=port)
        try:
            assert await exits_within(stack, 15) == 1
        finally:
            await stop_stack(stack)
    output = stack.supervisor_output()
    assert f"cannot listen on 127.0.0.1:{port}: the address is in use" in output, output
    assert "Traceback" not in output


async def test_a_reload_onto_a_port_in_use_makes_the_frontend_fatal_with_the_reason(tmp_path: Path) -> None:
    async with open_stack(tmp_path, {"echo": echo_server()}) as stack:
        with socket.socket() as squatter:
            squatter.bind(("127.0.0.1", 0))
            squatter.listen()
            taken = squatter.getsockname()[1]
            config = stack.config_path.read_text().replace(f"127.0.0.1:{stack.port}", f"127.0.0.1:{taken}")
            stack.config_path.write_text(config)
            code, result = await stack.actl("update")
            assert code == 0, result
            rows = await stack.wait_status(lambda r: r["frontend"]["state"] == "FATAL", timeout=30)
            assert f"127.0.0.1:{taken}: the address is in use" in rows["frontend"]["description"]
            assert rows["frontend"]["restarts"] == 1  # once, not round a loop
            code, text = await stack.actl("status", "frontend", json_output=False)
            assert code == 3 and "address is in use" in text
            assert stack.process.poll() is None  # mcpvisor goes on; its workers too
            assert stack.status()["echo"]["state"] == "RUNNING"
        assert "frontend: cannot listen on" in stack.supervisor_output()


def write(path: Path, document: dict[str, Any]) -> Path:
    path.write_text(tomli_w.dumps(document))
    return path


def test_check_names_a_command_that_is_missing_or_not_executable(tmp_path: Path) -> None:
    script = tmp_path / "server.sh"
    script.write_text("#!/bin/sh\n")
    config = write(
        tmp_path / "mcpvisor.toml",
        {
            "mcpvisor": {"data_dir": str(tmp_path / "data")},
            "servers": {
                "ghost": GHOST,
                "plain": {"command": str(script)},  # not executable
                "here": {"command": "./server.sh", "cwd": str(tmp_path)},
                "python": {"command": "python3"},
            },
        },
    )
    done = mcpvisor("check", "-c", str(config))
    assert done.returncode == 1
    assert "server ghost: command 'no-such-command-anywhere' is not found in PATH" in done.stderr
    assert f"server plain: command '{script}' is not an executable file" in done.stderr
    assert "server here:" in done.stderr and "server python" not in done.stderr
    script.chmod(0o755)
    del_ghost = config.read_text().replace('[servers.ghost]\ncommand = "no-such-command-anywhere"\n', "")
    config.write_text(del_ghost)
    done = mcpvisor("check", "-c", str(config))
    assert done.returncode == 0, done.stderr


def test_check_finds_a_command_installed_next_to_mcpvisor_as_the_worker_does(tmp_path: Path) -> None:
    config = write(tmp_path / "mcpvisor.toml", {"servers": {"time": {"command": "mcp-server-time"}}})
    env = {**os.environ, "PATH": "/usr/bin:/bin"}  # not the virtualenv's bin: the worker adds it
    done = mcpvisor("check", "-c", str(config), env=env)
    assert done.returncode == 0, done.stderr


def test_ctl_with_a_missing_or_broken_config_is_an_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.toml"
    done = mcpvisor("ctl", "-c", str(missing), "status")
    assert done.returncode == 2
    assert str(missing) in done.stderr and "no mcpvisor" not in done.stderr
    broken = tmp_path / "broken.toml"
    broken.write_text("[mcpvisor\n")
    done = mcpvisor("ctl", "-c", str(broken), "status")
    assert done.returncode == 2 and str(broken) in done.stderr


async def test_ctl_off_the_console_status_columns_apart_and_get_root_to_the_console(tmp_path: Path) -> None:
    servers = {"echo": echo_server(), "stuck": python_server("raw_server.py", "--hang-on-initialize")}
    async with open_stack(tmp_path, servers, wait_for=["echo"]) as stack:
        _, text = await stack.actl("status", json_output=False)
        stuck = next(line for line in text.splitlines() if line.startswith("stuck"))
        assert "connecting  0 tools" in stuck, stuck
        assert "command status" not in stack.supervisor_output()
        # The event log in the data dir still has every command.
        assert '"command":"status"' in stack.log("supervisor.log").replace(" ", "")
        # A browser pointed at the listener is sent on to the console; a program reads where things are.
        async with httpx2.AsyncClient(base_url=stack.base_url) as http:
            front = await http.get("/")
        assert front.status_code == 302 and front.headers["location"] == "/ui/", front.text
        assert front.json()["console"] == "/ui/" and front.json()["health"] == "/healthz"


async def test_ctl_login_right_after_start_hands_out_a_url_only_once_the_frontend_serves(tmp_path: Path) -> None:
    from tests.e2e.test_oauth_upstream import oauth_upstream

    async with oauth_upstream(tmp_path) as upstream:
        stack = launch_stack(tmp_path, {"remote": {"url": upstream.url}})
        try:
            with trio.fail_after(60):
                while True:
                    code, result = await stack.actl("login", "remote", "--no-wait")
                    if code == 0:
                        break
                    await trio.sleep(0.05)  # no mcpvisor yet, or the worker not there yet
            assert result["url"]
            # The redirect is served the moment the URL is out.
            with socket.create_connection(("127.0.0.1", stack.port), timeout=5):
                pass
            assert stack.status()["frontend"]["state"] == "RUNNING"
        finally:
            await stop_stack(stack)


async def test_ctl_calls_right_after_start_waits_for_the_frontend_rather_than_refusing(tmp_path: Path) -> None:
    """The supervisor answers before its frontend has reported: operator commands wait for it."""
    stack = launch_stack(tmp_path, {"echo": echo_server()})
    try:
        with trio.fail_after(60):
            while True:
                try:
                    reply = await trio.to_thread.run_sync(lambda: stack.control("calls", timeout=60))
                    break
                except NoDaemon:
                    await trio.sleep(0.02)  # no control socket yet: the very first moment of serve
        assert reply.ok and reply.result == [], reply
        code, text = await stack.actl("calls", json_output=False)
        assert code == 0 and "No calls are waiting" in text, text
    finally:
        await stop_stack(stack)


async def test_a_stop_with_a_login_in_flight_and_a_proposal_pending_completes(tmp_path: Path) -> None:
    """A login waits for a browser that never comes; a client's proposal waits for an operator."""
    from tests.e2e.test_oauth_upstream import oauth_upstream

    async with oauth_upstream(tmp_path) as upstream:
        stack = launch_stack(tmp_path, {"remote": {"url": upstream.url}, "echo": echo_server()})
        try:
            await wait_stack(stack, ["echo"])
            code, result = await stack.actl("login", "remote", "--no-wait")
            assert code == 0 and result["url"], result
            async with stack.client() as client:
                proposed = await client.call_tool(
                    "upstream_servers", {"operation": "add", "name": "later", "command": "no-such-command-anywhere"}
                )
                assert "pending" in proposed.content[0].text.lower(), proposed.content[0].text
            tree = stack.pids()
            stack.process.send_signal(signal.SIGTERM)
            assert await exits_within(stack, 30) == 0
            with trio.fail_after(5):
                while any(alive(pid) for pid in tree):
                    await trio.sleep(0.05)
        finally:
            await stop_stack(stack)
