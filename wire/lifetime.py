"""Child processes that cannot outlive their parent.

`PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not the process. trio's
`open_process` forks from a worker thread that its thread cache retires after 10 idle seconds,
which would kill every child at that moment. So children are forked here, from the thread that
runs trio (it lives as long as the process), and waited for through a pidfd.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import IO

import trio

_PR_SET_PDEATHSIG = 1


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
        popen: subprocess.Popen[bytes],
        stdin: trio.lowlevel.FdStream | None,
        stdout: trio.lowlevel.FdStream | None,
        output: trio.lowlevel.FdStream | None = None,
    ) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.stdin = stdin
        self.stdout = stdout
        self.output = output  # stderr (and stdout unless piped separately), when captured
        self._pidfd = os.pidfd_open(popen.pid)
        self._exited = trio.Event()
        self._waiting = False

    @property
    def returncode(self) -> int | None:
        if self._popen.returncode is None:
            self._poll()
        return self._popen.returncode

    def _poll(self) -> None:
        if self._popen.poll() is not None and not self._exited.is_set():
            self._exited.set()
            os.close(self._pidfd)

    async def wait(self) -> int:
        """Wait for the child to exit and return its status (negative: killed by that signal)."""
        if not self._waiting and not self._exited.is_set():
            self._waiting = True
            try:
                while self.returncode is None:
                    await trio.lowlevel.wait_readable(self._pidfd)
            finally:
                self._waiting = False
        await self._exited.wait()
        assert self._popen.returncode is not None
        return self._popen.returncode

    def send_signal_to_group(self, signum: int) -> bool:
        """Signal the child's process group; False when nothing is left in it."""
        try:
            os.killpg(self.pid, signum)
        except ProcessLookupError:
            return False
        return True


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
) -> Child:
    """Fork/exec a child in its own process group; it gets SIGKILL if this process dies.

    `capture_output` pipes stderr (and stdout, unless `stdout_pipe`) to `Child.output`.
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
    return Child(popen, stdin, stdout, captured)
