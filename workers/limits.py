"""Limits of one sandbox that no kernel limit holds: its disk, and its memory where no cgroup is.

The cgroup (memory, processes, CPU) is runtime.cgroups'; its names are re-exported here.

`Watchdog` does supervisord's memmon for what no cgroup covers: where there is none (and the
operator chose the watchdog), the memory of the sandbox (`Watchdog.memory_used`); always, its home's size
(`home_mb`, unless a project quota holds it) and the free space left on the volume of mcpvisor's
state and logs (`data_reserve_mb`). Over a limit, it kills the process tree and says why.
Processes are capped by the kernel either way (RLIMIT_NPROC, see runtime.namespaces).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import trio

from mcpvisor.runtime.cgroups import FIX_NO_CGROUP as FIX_NO_CGROUP
from mcpvisor.runtime.cgroups import MIB
from mcpvisor.runtime.cgroups import CgroupLimits as CgroupLimits
from mcpvisor.runtime.cgroups import join_cgroups as join_cgroups
from mcpvisor.runtime.cgroups import open_cgroup as open_cgroup
from mcpvisor.wire.sandboxing import SandboxPlan

log = logging.getLogger(__name__)

WATCH_INTERVAL = 0.25
DISK_INTERVAL = 2.0  # the home is walked this often; the volume's free space is read every look


def tree_pids(root_pid: int) -> list[int]:
    """A process and all its descendants, as found while walking down from it."""
    found: list[int] = []
    queue = [root_pid]
    while queue:
        pid = queue.pop()
        found.append(pid)
        with contextlib.suppress(OSError, ValueError):
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as children:
                    queue.extend(int(child) for child in children.read().split())
    return found


def _status(pid: int) -> dict[str, int]:
    found: dict[str, int] = {}
    with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile"):
                found[key] = int(value.split()[0]) * 1024
    return found


def private_memory(pids: Iterable[int]) -> int:
    """Anonymous and file-backed resident memory of these processes; shared memory is counted apart."""
    return sum(sum(_status(pid).values()) for pid in pids)


def tmpfs_usage(pids: Iterable[int]) -> int:
    """Bytes held by every tmpfs mounted in these processes' mount namespaces (other than this one's).

    Files there are memory that no process's RSS shows: the private /tmp and /dev/shm, and any other
    tmpfs the sandbox holds. Each file system is counted once.
    """
    try:
        own = os.readlink("/proc/self/ns/mnt")
    except OSError:
        return 0
    seen_ns: set[str] = set()
    counted: set[int] = set()
    total = 0
    for pid in pids:
        try:
            namespace = os.readlink(f"/proc/{pid}/ns/mnt")
            if namespace == own or namespace in seen_ns:
                continue
            seen_ns.add(namespace)
            with open(f"/proc/{pid}/mountinfo") as listing:
                mounts = listing.read().splitlines()
        except OSError:
            continue
        for line in mounts:
            fields = line.split()
            dash = fields.index("-")
            if fields[dash + 1] not in ("tmpfs", "ramfs"):
                continue
            point = fields[4].replace("\\040", " ")
            with contextlib.suppress(OSError):
                path = f"/proc/{pid}/root{point}"
                device = os.stat(path).st_dev
                if device not in counted:
                    counted.add(device)
                    usage = os.statvfs(path)
                    total += (usage.f_blocks - usage.f_bfree) * usage.f_frsize
    return total


def _open_files(pids: Iterable[int]) -> Iterator[tuple[str, os.stat_result]]:
    """(where it leads, what it is) of every fd these processes hold; those gone are skipped."""
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            path = f"/proc/{pid}/fd/{fd}"
            with contextlib.suppress(OSError):
                yield os.readlink(path), os.stat(path)


def memfd_usage(pids: Iterable[int]) -> int:
    """Bytes held by the memfds these processes have open (mapped or not), each counted once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for target, info in _open_files(pids):
        if target.startswith("/memfd:") and (info.st_dev, info.st_ino) not in seen:
            seen.add((info.st_dev, info.st_ino))
            total += info.st_blocks * 512
    return total


def sysv_shm_usage(ipc_fd: int | None, userns_fd: int | None) -> int:
    """Resident bytes of the SysV shared memory of the sandbox's IPC namespace, attached or not.

    Only a process in that namespace can list it (/proc/sysvipc/shm shows the reader's): `nsenter`
    joins it (and, as an ordinary user, the user namespace that owns it) and reads the table.
    """
    if ipc_fd is None:
        return 0
    argv = ["nsenter", f"--ipc=/proc/self/fd/{ipc_fd}"]
    keep = [ipc_fd]
    if userns_fd is not None:
        argv += [f"--user=/proc/self/fd/{userns_fd}", "--preserve-credentials"]
        keep.append(userns_fd)
    try:
        done = subprocess.run(
            [*argv, "--", "cat", "/proc/sysvipc/shm"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
            pass_fds=keep,
            env={"PATH": os.defpath},
        )
    except (OSError, subprocess.TimeoutExpired):
        return 0
    total = 0
    lines = done.stdout.splitlines()
    if not lines:
        return 0
    columns = lines[0].split()
    at = columns.index("rss") if "rss" in columns else columns.index("size")
    for line in lines[1:]:
        fields = line.split()
        with contextlib.suppress(IndexError, ValueError):
            total += int(fields[at])
    return total


def deleted_files_on(pids: Iterable[int], device: int) -> int:
    """Bytes of files these processes hold open on `device` that no longer have a name (du misses them)."""
    seen: set[int] = set()
    total = 0
    for _target, info in _open_files(pids):
        if info.st_dev == device and info.st_nlink == 0 and info.st_ino not in seen:
            seen.add(info.st_ino)
            total += info.st_blocks * 512
    return total


def tree_size(root: str) -> int:
    """Bytes the files under `root` take on disk (hard links once), as `du` counts them."""
    total = 0
    seen: set[int] = set()
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            with contextlib.suppress(OSError):
                info = os.lstat(os.path.join(directory, name))
                if info.st_nlink > 1:
                    if info.st_ino in seen:
                        continue
                    seen.add(info.st_ino)
                total += info.st_blocks * 512
    return total


@dataclass
class Watchdog:
    """What no kernel limit holds for a sandbox, looked at four times a second (see the module's docstring).

    `reason` says why it killed, in the words the client and the log get.
    """

    memory_bytes: int | None  # None: a cgroup holds the memory
    home: str = ""
    home_bytes: int | None = None  # None: no limit, or a project quota holds it
    data_dir: str = ""
    reserve_bytes: int = 0
    ipc_fd: int | None = None
    userns_fd: int | None = None
    fired: bool = False
    reason: str = ""
    _home_used: int = 0
    _home_seen: float = float("-inf")

    @classmethod
    def for_plan(cls, plan: SandboxPlan, *, memory: bool, quota: bool = False) -> Watchdog:
        return cls(
            memory_bytes=plan.memory_mb * MIB if memory else None,
            home=plan.home,
            home_bytes=plan.home_mb * MIB if plan.home_mb is not None and not quota else None,
            data_dir=plan.data_dir,
            reserve_bytes=plan.data_reserve_mb * MIB,
        )

    def memory_used(self, pids: list[int]) -> int:
        return (
            private_memory(pids)
            + tmpfs_usage(pids)
            + memfd_usage(pids)
            + (sysv_shm_usage(self.ipc_fd, self.userns_fd) if self.ipc_fd is not None else 0)
        )

    def over(self, root_pid: int, now: float) -> str | None:
        """Why the sandbox must stop now, or None."""
        pids = tree_pids(root_pid)
        if self.memory_bytes is not None:
            used = self.memory_used(pids)
            if used > self.memory_bytes:
                return f"its sandbox went over its memory limit ({self.memory_bytes // MIB} MiB)"
        short = self.reserve_bytes > 0 and self.data_dir and _free(self.data_dir) < self.reserve_bytes
        if not self.home or not (self.home_bytes is not None or short):
            return None
        before = self._home_used
        if short or now - self._home_seen >= DISK_INTERVAL:
            self._home_seen = now
            with contextlib.suppress(OSError):
                self._home_used = tree_size(self.home) + deleted_files_on(pids, os.stat(self.home).st_dev)
        if self.home_bytes is not None and self._home_used > self.home_bytes:
            return f"its home went over its size limit ({self.home_bytes // MIB} MiB)"
        # The volume of the state and logs is nearly full: a home on it that is growing is the cause.
        if short and self._home_used > before and _same_volume(self.home, self.data_dir):
            return (
                f"the volume that holds mcpvisor's state and logs has less than {self.reserve_bytes // MIB} MiB"
                " free (data_reserve_mb), and its home is growing on it"
            )
        return None

    async def watch(self, root_pid: int, kill: Callable[[], None]) -> None:
        while True:
            why = await trio.to_thread.run_sync(self.over, root_pid, time.monotonic())
            if why is not None:
                log.warning("sandbox pid %d: %s: killing it", root_pid, why)
                self.fired = True
                self.reason = why
                kill()
                return
            await trio.sleep(WATCH_INTERVAL)


def _free(path: str) -> int:
    try:
        usage = os.statvfs(path)
    except OSError:
        return 1 << 62
    return usage.f_bavail * usage.f_frsize


def reserve_problem(plan: SandboxPlan, *, quota: bool = False) -> str | None:
    """Why the sandbox must not start: its home is over its size (where no quota holds it), or it shares
    the state's volume, which is below the reserve."""
    if plan.home_mb is not None and not quota and os.path.isdir(plan.home):
        held = tree_size(plan.home)
        if held > plan.home_mb * MIB:
            return (
                f"its home holds {held // MIB} MiB, over its size limit ({plan.home_mb} MiB, home_mb): an operator"
                " must make room in it, or raise home_mb"
            )
    reserve = plan.data_reserve_mb * MIB
    if reserve and plan.data_dir and _same_volume(plan.home, plan.data_dir) and _free(plan.data_dir) < reserve:
        return (
            f"the volume that holds mcpvisor's state and logs has less than {plan.data_reserve_mb} MiB free"
            " (data_reserve_mb): no sandbox whose home is on it starts; free space, or put the homes on a"
            " volume of their own (DATA_DIR/sandboxes)"
        )
    return None


def _same_volume(path: str, other: str) -> bool:
    try:
        return os.stat(path).st_dev == os.stat(other).st_dev
    except OSError:
        return False
