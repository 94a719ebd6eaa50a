"""Child processes that cannot outlive their parent.

`PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not the process. trio's
`open_process` forks from a worker thread that its thread cache retires after 10 idle seconds,
which would kill every child at that moment. So children are forked here, from the thread that
runs trio (it lives as long as the process), and waited for through a pidfd.

A process can also take on children it did not fork: as a subreaper it inherits the orphans of its
descendants, which is how workers forked by the forkserver become the supervisor's own children
(`Child.adopt`). Orphans nobody adopts are reaped by `reap_orphans`.

Every child is stopped the same way, by `stop_group`: its stdin closed (when it speaks over it),
its stop signal to its process group, a wait, then SIGKILL to the group.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import IO, Protocol

import trio

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
KILL_WAIT = 5.0  # after SIGKILL: only a process stuck in the kernel (a dead NFS mount) takes longer

# Children a `Child` owns: their exit status is theirs to collect, never the orphan reaper's.
_owned: set[int] = set()
_adopting = 0  # forks in flight whose pid is not known yet: the reaper must not take them


def die_with_parent(expected_parent: int | None = None) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux); exit if it already has."""
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # The parent may have died between our fork and the prctl: then we were reparented already.
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)


class Child:
    """A child process: its pid, pipes as trio streams, and an awaitable exit."""

    def __init__(
        self,
        pid: int,
        stdin: trio.lowlevel.FdStream | None = None,
        stdout: trio.lowlevel.FdStream | None = None,
        output: trio.lowlevel.FdStream | None = None,
        *,
        popen: subprocess.Popen[bytes] | None = None,
    ) -> None:
        self._popen = popen
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.output = output  # stderr (and stdout unless piped separately), when captured
        self._pidfd = os.pidfd_open(pid)
        self._returncode: int | None = None
        self._exited = trio.Event()
        self._waiting = False
        _owned.add(pid)

    @classmethod
    def adopt(cls, pid: int, output: trio.lowlevel.FdStream | None = None) -> Child:
        """Own a child this process inherited (as a subreaper) rather than forked itself."""
        return cls(pid, output=output)

    @property
    def returncode(self) -> int | None:
        if self._returncode is None:
            self._poll()
        return self._returncode

    def _poll(self) -> None:
        if self._popen is not None:
            code = self._popen.poll()
        else:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                code = 255  # collected by someone else: gone, with its status
            else:
                code = os.waitstatus_to_exitcode(status) if pid else None
        if code is not None and not self._exited.is_set():
            self._returncode = code
            self._exited.set()
            _owned.discard(self.pid)
            self._close_pidfd()

    def _close_pidfd(self) -> None:
        # Whoever collects the status (a `pid` read in another task, say) may do so while `wait`
        # sleeps on the pidfd: closing it under a sleeper without telling trio would leave that
        # sleeper waiting forever, with the process gone (the kernel drops a closed fd from epoll).
        fd, self._pidfd = self._pidfd, -1
        if fd < 0:
            return
        with contextlib.suppress(RuntimeError):  # not inside trio: nobody can be waiting on it
            trio.lowlevel.notify_closing(fd)
        os.close(fd)

    async def wait(self) -> int:
        """Wait for the child to exit and return its status (negative: killed by that signal)."""
        if not self._waiting and not self._exited.is_set():
            self._waiting = True
            try:
                while self.returncode is None:
                    # Closed: collected meanwhile by another task, and returncode says so now.
                    with contextlib.suppress(trio.ClosedResourceError):
                        await trio.lowlevel.wait_readable(self._pidfd)
            finally:
                self._waiting = False
        await self._exited.wait()
        assert self._returncode is not None
        return self._returncode

    def send_signal_to_group(self, signum: int) -> bool:
        """Signal the child's process group; False when nothing is left in it."""
        try:
            os.killpg(self.pid, signum)
        except ProcessLookupError:
            return False
        return True


class Group(Protocol):
    """What `stop_group` needs of a child (`Child` is one)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...

    def send_signal_to_group(self, signum: int) -> bool: ...


async def stop_group(
    child: Group,
    stopsignal: int = signal.SIGTERM,
    wait: float = 10.0,
    *,
    stdin: trio.lowlevel.FdStream | None = None,
    stdin_grace: float = 0.0,
    name: str = "",
) -> int | None:
    """Stop a child and whatever is left in its process group; its exit status (None: it survived).

    With `stdin`, that pipe is closed first and the child gets `stdin_grace` seconds to leave by
    itself (the MCP way to end a stdio server). Then `stopsignal` to the group and `wait` seconds,
    then SIGKILL to the group. The group is signalled even when the child itself has exited: a
    launcher (npx, uvx, sh) may have left the real program behind in it.
    """
    if stdin is not None:
        with contextlib.suppress(OSError, trio.ClosedResourceError, trio.BrokenResourceError):
            await stdin.aclose()
        with trio.move_on_after(stdin_grace):
            await child.wait()
    for signum, grace in ((stopsignal, wait), (signal.SIGKILL, KILL_WAIT)):
        if not child.send_signal_to_group(signum):
            break
        if child.returncode is None:
            with trio.move_on_after(grace):
                await child.wait()
    if child.returncode is None:
        log.error("%s pid %d survived SIGKILL (stuck in the kernel?)", name or "process", child.pid)
    return child.returncode


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | None = None,
    stdin_pipe: bool = False,
    stdout_pipe: bool = False,
    output: IO[bytes] | int | None = None,
    capture_output: bool = False,
    die_with_us: bool = True,
    pass_fds: Sequence[int] = (),
    before_exec: Callable[[], None] | None = None,
) -> Child:
    """Fork/exec a child in its own process group; it gets SIGKILL if this process dies.

    `capture_output` pipes stderr (and stdout, unless `stdout_pipe`) to `Child.output`.
    `before_exec` runs in the child between fork and exec (joining a cgroup, setting a limit).
    """
    parent = os.getpid()
    child_in = parent_in = child_out = parent_out = child_err = parent_err = None
    if stdin_pipe:
        child_in, parent_in = os.pipe()
    if stdout_pipe:
        parent_out, child_out = os.pipe()
    if capture_output:
        parent_err, child_err = os.pipe()
        output = child_err

    def setup() -> None:
        if die_with_us:
            die_with_parent(parent)
        if before_exec is not None:
            before_exec()

    try:
        popen = subprocess.Popen(
            list(argv),
            stdin=child_in if stdin_pipe else subprocess.DEVNULL,
            stdout=child_out if stdout_pipe else output,
            stderr=output,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
            preexec_fn=setup,
            close_fds=True,
            pass_fds=tuple(pass_fds),
        )
    except BaseException:
        for fd in (child_in, parent_in, child_out, parent_out, child_err, parent_err):
            if fd is not None:
                os.close(fd)
        raise
    for fd in (child_in, child_out, child_err):
        if fd is not None:
            os.close(fd)
    stdin = trio.lowlevel.FdStream(parent_in) if parent_in is not None else None
    stdout = trio.lowlevel.FdStream(parent_out) if parent_out is not None else None
    captured = trio.lowlevel.FdStream(parent_err) if parent_err is not None else None
    return Child(popen.pid, stdin, stdout, captured, popen=popen)


def become_subreaper() -> bool:
    """Inherit the orphans of this process's descendants (Linux); False where unsupported."""
    if sys.platform != "linux":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def wait_for_reparent(old_parent: int, timeout: float = 5.0) -> None:
    """In a double-forked child: wait until the intermediate parent's exit has re-parented us."""
    deadline = time.monotonic() + timeout
    while os.getppid() == old_parent and time.monotonic() < deadline:
        time.sleep(0.0002)


@contextlib.contextmanager
def adopting() -> Iterator[None]:
    """While a fork is in flight its pid is not owned yet: keep the orphan reaper off it."""
    global _adopting
    _adopting += 1
    try:
        yield
    finally:
        _adopting -= 1


def _children() -> list[int]:
    pids: list[int] = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as listing:
                pids.extend(int(pid) for pid in listing.read().split())
        except OSError:
            continue
    return pids


def reap_orphans() -> int:
    """Collect exited children that no `Child` owns (orphans a subreaper inherited); how many."""
    if _adopting or sys.platform != "linux":
        return 0
    reaped = 0
    for pid in _children():
        if pid in _owned:
            continue
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            continue
        reaped += bool(done)
    return reaped


def _zombie_or_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def strays() -> list[int]:
    """Live children no `Child` owns: orphans of descendants this subreaper inherited (none while a
    fork is in flight, whose child is not owned yet)."""
    if _adopting or sys.platform != "linux":
        return []
    return [pid for pid in _children() if pid not in _owned and not _zombie_or_gone(pid)]


def command_line(pid: int) -> list[str]:
    """A process's argv, [] when it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return [part.decode(errors="replace") for part in cmdline.read().split(b"\0")[:-1]]
    except OSError:
        return []


def kill_stray(pid: int) -> bool:
    """SIGKILL a stray, and its process group when it leads one; whether it was there."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def kill_strays(wait: float = 1.0) -> list[int]:
    """SIGKILL every stray and collect it (within `wait`); their pids."""
    killed = [pid for pid in strays() if kill_stray(pid)]
    deadline = time.monotonic() + wait
    left = set(killed)
    while left and time.monotonic() < deadline:
        for pid in list(left):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    continue
            left.discard(pid)
        if left:
            time.sleep(0.01)
    return killed
