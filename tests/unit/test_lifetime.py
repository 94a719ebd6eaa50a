"""Children that cannot outlive their parent: waiting for them and stopping them, with real processes."""

from __future__ import annotations

import os
import signal
import sys
import time

import trio

from mcpvisor.runtime import lifetime
from tests.support.stack import alive

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
# Ignores SIGTERM, and says so on stdout once it does (so the test knows the handler is in place).
STUBBORN = [
    sys.executable,
    "-c",
    "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)",
]


async def test_a_waiter_learns_of_the_exit_even_when_another_task_collected_it_first() -> None:
    """The chaos row's root: the child dies while the loop is busy, a status read collects it, and
    the task waiting on it must still wake (before, it slept forever: RUNNING with pid 0)."""
    child = lifetime.spawn(SLEEPER, env=os.environ)
    statuses: list[int] = []
    async with trio.open_nursery() as nursery:

        async def waiter() -> None:
            statuses.append(await child.wait())

        nursery.start_soon(waiter)
        await trio.sleep(0.1)  # the waiter sleeps on the pidfd
        os.kill(child.pid, signal.SIGKILL)
        time.sleep(0.2)  # dead, and the loop has not looked: no epoll wake-up was taken yet
        assert child.returncode == -signal.SIGKILL  # collected here, outside the waiter
        with trio.fail_after(5):
            while not statuses:
                await trio.sleep(0.01)
    assert statuses == [-signal.SIGKILL]


async def test_stop_group_ends_a_child_with_its_stop_signal() -> None:
    child = lifetime.spawn(SLEEPER, env=os.environ)
    with trio.fail_after(10):
        status = await lifetime.stop_group(child, signal.SIGTERM, wait=5)
    assert status == -signal.SIGTERM


async def test_stop_group_kills_a_child_that_ignores_its_stop_signal_after_the_wait() -> None:
    child = lifetime.spawn(STUBBORN, env=os.environ, stdout_pipe=True)
    assert child.stdout is not None
    with trio.fail_after(10):
        assert (await child.stdout.receive_some()).startswith(b"ready")
    started = trio.current_time()
    with trio.fail_after(10):
        status = await lifetime.stop_group(child, signal.SIGTERM, wait=0.5)
    assert status == -signal.SIGKILL
    assert trio.current_time() - started >= 0.5  # it was given its wait first


async def test_stop_group_closes_stdin_first_and_a_child_that_leaves_then_gets_no_signal() -> None:
    reader = [sys.executable, "-c", "import sys; sys.stdin.read(); sys.exit(7)"]
    child = lifetime.spawn(reader, env=os.environ, stdin_pipe=True)
    with trio.fail_after(10):
        status = await lifetime.stop_group(child, signal.SIGTERM, wait=5, stdin=child.stdin, stdin_grace=5)
    assert status == 7


async def test_stop_group_reaches_what_a_launcher_left_behind_in_its_group() -> None:
    """A shell that exits at once leaves its background child in the group: that one is stopped too."""
    launcher = lifetime.spawn(
        ["/bin/sh", "-c", f"{sys.executable} -c 'import time; time.sleep(60)' & echo $!"],
        env=os.environ,
        stdout_pipe=True,
    )
    assert launcher.stdout is not None
    with trio.fail_after(10):
        left = int((await launcher.stdout.receive_some()).split()[0])
        await launcher.wait()
    with trio.fail_after(10):
        await lifetime.stop_group(launcher, signal.SIGTERM, wait=5)
        while alive(left):
            await trio.sleep(0.02)
