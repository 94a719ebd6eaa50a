"""One mcpvisor per data dir: a lock taken before anything else, and where its sockets are.

`serve` holds an exclusive `flock` on `mcpvisor.lock` in its data dir and in its runtime dir for
its whole life, before it binds a socket: a second `serve` of the same config (or data dir) is
refused at once, instead of taking the first one's control socket over. The kernel drops a lock
when its holder dies however it dies, so a lock file or socket left by a killed instance is
simply taken over by the next one.

The runtime dir is shared by every instance of a user (`$XDG_RUNTIME_DIR/mcpvisor`). The first
instance takes it; another instance with a different data dir takes a sibling of its own,
`mcpvisor-<hash of its data dir>`, so instances of different configs run side by side. Each lock
file says who holds it (pid, control socket, data dir), which is how `ctl` finds the instance of
its config and how a refused `serve` names the one that runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from mcpvisor.wire.endpoints import Endpoints, ensure_private_dir, private_dirs, runtime_dir

LOCK_NAME = "mcpvisor.lock"


class AlreadyRunning(Exception):
    """Another mcpvisor holds the lock of this data dir (or of the runtime dir it would use)."""


@dataclass(frozen=True)
class Holder:
    """What a lock file says about the instance that holds it."""

    pid: int = 0
    control: str = ""
    data_dir: str = ""


def read_holder(directory: Path) -> Holder:
    """Who holds (or last held) the lock in `directory`; an empty Holder when unknown."""
    try:
        data = json.loads((directory / LOCK_NAME).read_text())
        return Holder(int(data.get("pid", 0)), str(data.get("control", "")), str(data.get("data_dir", "")))
    except (OSError, ValueError, TypeError, AttributeError):
        return Holder()


def own_runtime_dir(data_dir: Path) -> Path:
    """The runtime dir of a data dir whose instance found the shared one taken."""
    plain = runtime_dir(data_dir)
    digest = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:12]
    return plain.with_name(f"{plain.name}-{digest}")


def find_runtime_dir(data_dir: Path) -> Path:
    """Where the instance of `data_dir` keeps its sockets (for `ctl`): the runtime dir whose lock
    file names this data dir, the shared one when neither does."""
    plain, own = runtime_dir(data_dir), own_runtime_dir(data_dir)
    mine = str(data_dir.resolve())
    if read_holder(plain).data_dir == mine:
        return plain
    if read_holder(own).data_dir == mine:
        return own
    return plain


class InstanceLock:
    """The locks of a running instance: held until `release` or the process's end."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir.resolve()
        self.run_dir = runtime_dir(data_dir)
        self._held: dict[Path, int] = {}  # directory -> the descriptor holding its lock

    @property
    def endpoints(self) -> Endpoints:
        return Endpoints.in_dir(self.run_dir)

    def acquire(self) -> InstanceLock:
        """Take the data dir's lock, then a runtime dir's; AlreadyRunning naming the holder if taken."""
        private_dirs(self.data_dir)
        try:
            self._lock(self.data_dir, "this data dir")
            ensure_private_dir(self.run_dir)
            if not self._try(self.run_dir):
                # Another data dir's instance holds the shared runtime dir: take one of our own.
                self.run_dir = own_runtime_dir(self.data_dir)
                ensure_private_dir(self.run_dir)
                self._lock(self.run_dir, "the runtime dir")
        except BaseException:
            self.release()
            raise
        record = {"pid": os.getpid(), "control": self.endpoints.control, "data_dir": str(self.data_dir)}
        for fd in self._held.values():
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(record).encode() + b"\n", 0)
        return self

    def _lock(self, directory: Path, what: str) -> None:
        if not self._try(directory):
            holder = read_holder(directory)
            pid = f"pid {holder.pid}" if holder.pid else "pid unknown"
            control = holder.control or Endpoints.in_dir(directory).control
            raise AlreadyRunning(
                f"mcpvisor is already running with {what} ({directory}): {pid}, control socket {control}"
            )

    def _try(self, directory: Path) -> bool:
        directory = directory.resolve()
        if directory in self._held:
            return True
        fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._held[directory] = fd
        return True

    def release(self) -> None:
        for fd in self._held.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._held = {}
