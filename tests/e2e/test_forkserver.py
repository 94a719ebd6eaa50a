"""Workers forked from the forkserver stay the supervisor's children, with every supervision rule kept."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import trio

from tests.support.stack import Stack, alive, descendants, echo_server, open_stack

FORKSERVER_MODULE = "mcpvisor.workers.forkserver"


def stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat after the command name: state, ppid, pgrp, ..."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()


def parent(pid: int) -> int:
    return int(stat_fields(pid)[1])


def forked(pid: int) -> bool:
    """A forked worker keeps the template's command line; an exec'd one has its own."""
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return FORKSERVER_MODULE.encode() in cmdline.read()


def forkserver_pid(stack: Stack, workers: set[int]) -> int:
    """The template process: the supervisor's child that runs the forkserver and is no worker."""
    found = [
        pid
        for pid in descendants(stack.process.pid)
        if alive(pid) and pid not in workers and parent(pid) == stack.process.pid and forked(pid)
    ]
    assert len(found) == 1, found
    return found[0]


def process_group(pgid: int) -> set[int]:
    """Live processes in a process group."""
    members = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = stat_fields(int(entry))
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.add(int(entry))
    return members


def zombies_of(pid: int) -> set[int]:
    found = set()
    for child in descendants(pid):
        try:
            if stat_fields(child)[0] == "Z" and parent(child) == pid:
                found.add(child)
        except OSError:
            continue
    return found


async def upstream_pid(stack: Stack, server: str) -> int:
    async with stack.client() as client:
        return int((await client.call_tool(f"{server}:pid", {})).content[0].text)


async def test_a_forked_worker_is_the_supervisors_child_and_dies_with_it(tmp_path: Path) -> None:
    async with open_stack(tmp_path, {"a": echo_server("a"), "b": echo_server("b")}) as stack:
        rows = stack.status()
        workers = {rows["a"]["pid"], rows["b"]["pid"]}
        for pid in workers:
            assert forked(pid)
            assert parent(pid) == stack.process.pid  # re-parented to the supervisor, its subreaper
            assert os.getpgid(pid) == pid  # a process group of its own, for stop signals
        template = forkserver_pid(stack, workers)
        upstream = await upstream_pid(stack, "a")
        tree = stack.pids()
        assert {upstream, template} <= tree

        stack.process.kill()

        with trio.fail_after(10):
            while any(alive(pid) for pid in tree):
                await trio.sleep(0.1)


async def test_stop_signals_reach_the_process_group_and_exit_status_is_reported(tmp_path: Path) -> None:
    servers = {"a": echo_server("a", policy={"autorestart": False})}
    async with open_stack(tmp_path, servers) as stack:
        worker = stack.status()["a"]["pid"]
        assert forked(worker)
        upstream = await upstream_pid(stack, "a")
        assert os.getpgid(upstream) != worker  # the upstream has its own group, below the worker

        # The worker answers SIGTERM by finishing and exiting 0: the supervisor collects that status.
        os.kill(worker, signal.SIGTERM)
        rows = await stack.wait_status(lambda rows: rows["a"]["state"] == "EXITED")
        assert rows["a"]["description"] == "exit status 0"
        assert not alive(upstream)

        code, _ = await stack.actl("start", "a")
        assert code == 0
        worker = stack.status()["a"]["pid"]
        assert forked(worker)
        upstream = await upstream_pid(stack, "a")

        code, _ = await stack.actl("stop", "a")
        assert code == 0
        rows = stack.status()
        assert rows["a"]["state"] == "STOPPED"
        assert not alive(worker) and not alive(upstream)
        assert not process_group(worker)

        with trio.fail_after(10):
            while zombies_of(stack.process.pid):
                await trio.sleep(0.2)


async def test_a_crashed_forkserver_is_restarted_and_running_workers_go_on(tmp_path: Path) -> None:
    async with open_stack(tmp_path, {"a": echo_server("a"), "b": echo_server("b")}) as stack:
        rows = stack.status()
        a, b = rows["a"]["pid"], rows["b"]["pid"]
        template = forkserver_pid(stack, {a, b})

        os.kill(template, signal.SIGKILL)
        with trio.fail_after(10):
            while alive(template):
                await trio.sleep(0.1)

        # Workers are the supervisor's children, not the template's: they keep serving.
        assert alive(a) and alive(b)
        async with stack.client() as client:
            result = await client.call_tool("b:echo", {"text": "still here"})
            assert result.content[0].text == "still here"  # type: ignore[union-attr]

        code, _ = await stack.actl("restart", "a")
        assert code == 0
        await stack.wait_ready(["a"])
        rows: dict[str, dict[str, Any]] = stack.status()
        restarted = rows["a"]["pid"]
        assert restarted != a and rows["a"]["state"] == "RUNNING"
        assert forked(restarted)  # from a new template, not the exec fallback
        assert forkserver_pid(stack, {restarted, b}) != template
        assert rows["b"]["pid"] == b
