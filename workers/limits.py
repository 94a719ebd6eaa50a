"""Limits of one sandbox: memory, processes and CPU in a cgroup; its disk, and memory where no cgroup is.

cgroup v2 (systemd's `Delegate=yes`, a container's own cgroup namespace) or v1 (the memory, pids
and cpu controllers mounted apart): a child cgroup of the worker's own, which the upstream's
process joins before it execs bwrap, so everything it starts is counted. The kernel enforces the
limits; the worker only reads why a process died (the cgroup's OOM kill count). The cgroups are
removed when the sandbox stops, and mcpvisor's own group with the last of them.

`Watchdog` does supervisord's memmon for what no cgroup covers: where there is none (and the
operator chose the watchdog), the memory of the sandbox (see `Usage`); always, its home's size
(`home_mb`, unless a project quota holds it) and the free space left on the volume of mcpvisor's
state and logs (`data_reserve_mb`). Over a limit, it kills the process tree and says why.
Processes are capped by the kernel either way (RLIMIT_NPROC, see runtime.namespaces).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import trio

from mcpvisor.wire.sandboxing import SandboxPlan

log = logging.getLogger(__name__)

MIB = 1024 * 1024
CPU_PERIOD_US = 100_000
WATCH_INTERVAL = 0.25
DISK_INTERVAL = 2.0  # the home is walked this often; the volume's free space is read every look
CLOSE_WAIT = 2.0
_GROUP = "mcpvisor"


def _own_cgroups() -> dict[str, str]:
    """Controller (or "" for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    found: dict[str, str] = {}
    with open("/proc/self/cgroup") as listing:
        for line in listing:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                found[controller] = path
    return found


def _mounts() -> dict[str, tuple[str, str]]:
    """Controller (or "" for the v2 hierarchy) -> (mount point, root of the hierarchy it shows)."""
    found: dict[str, tuple[str, str]] = {}
    with open("/proc/self/mountinfo") as listing:
        for line in listing:
            fields = line.split()
            dash = fields.index("-")
            fstype, options = fields[dash + 1], fields[dash + 3]
            root, point = fields[3], fields[4].replace("\\040", " ")
            if fstype == "cgroup2":
                found.setdefault("", (point, root))
            elif fstype == "cgroup":
                for option in options.split(","):
                    if option in ("memory", "pids", "cpu"):
                        found.setdefault(option, (point, root))
    return found


def _join(point: str, root: str, path: str) -> str:
    relative = os.path.relpath(path, root) if path.startswith(root) else path.lstrip("/")
    return os.path.normpath(os.path.join(point, relative))


def _leaf_name(worker_id: str, home: str) -> str:
    # Two mcpvisors on one host may both run `alice/shell`; the home (under each one's data dir)
    # tells them apart where the hierarchy's root is shared.
    return re.sub(r"[^A-Za-z0-9_.-]", "_", worker_id.replace("/", "+")) + f"-{zlib.crc32(home.encode()):08x}"


def _write(path: str, value: str) -> None:
    with open(path, "w") as knob:
        knob.write(value)


def _read_int(path: str, key: str | None = None) -> int:
    try:
        with open(path) as knob:
            text = knob.read()
    except OSError:
        return 0
    if key is None:
        return int(text.strip() or 0)
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


@dataclass
class CgroupLimits:
    """A sandbox's cgroup (one dir per controller in v1, one in v2)."""

    version: int
    dirs: list[str]
    memory_dir: str
    _oom_at_start: int = 0
    procs_files: list[str] = field(default_factory=list)
    has_pids: bool = False

    def oom_kills(self) -> int:
        """How many processes the kernel killed here for memory since the sandbox started."""
        if self.version == 2:
            count = _read_int(os.path.join(self.memory_dir, "memory.events"), "oom_kill")
        else:
            count = _read_int(os.path.join(self.memory_dir, "memory.oom_control"), "oom_kill")
            # Kernels without the counter: the limit was hit, and the process died.
            count = count or _read_int(os.path.join(self.memory_dir, "memory.failcnt"))
        return count - self._oom_at_start

    def mark(self) -> None:
        self._oom_at_start = 0
        self._oom_at_start = self.oom_kills()

    def close(self) -> bool:
        """Remove the cgroups, and mcpvisor's group above them once empty; False while one is busy."""
        done = True
        for directory in self.dirs:
            try:
                os.rmdir(directory)
            except FileNotFoundError:
                pass
            except OSError:
                done = False
                continue
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(directory))  # the `mcpvisor` group: busy while others remain
        return done

    async def aclose(self) -> None:
        """`close`, waiting a little for the killed processes to leave (the kernel reaps them late)."""
        with trio.move_on_after(CLOSE_WAIT):
            # The kernel says nothing when a cgroup empties (v1 has no event for it): it is retried.
            while not self.close():  # noqa: ASYNC110
                await trio.sleep(0.05)


def _make(directory: str) -> None:
    os.makedirs(directory, exist_ok=True)


FIX_NO_CGROUP = (
    "no writable cgroup for the sandbox's memory and process limits: run mcpvisor under systemd with"
    " Delegate=yes, or give its container a cgroup namespace of its own with the cgroup writable"
    ' (see docs/sandbox-deployment.md); or set limits = "watchdog" in [mcpvisor.sandbox] to accept'
    " limits enforced by a watchdog (no CPU limit)"
)


def cgroup_available() -> str | None:
    """None when a sandbox's cgroup (memory and pids) can be made here, else why not (for start-up)."""
    probe = SandboxPlan(home=f"/probe/{os.getpid()}", memory_mb=64, max_processes=8)
    try:
        found = open_cgroup(probe, "probe", quiet=True)
    except OSError as exc:
        return str(exc)
    if found is None:
        return "no writable cgroup with the memory controller"
    try:
        if not found.has_pids:
            return "no writable cgroup with the pids controller"
        return None
    finally:
        found.close()


def open_cgroup(plan: SandboxPlan, worker_id: str, *, quiet: bool = False) -> CgroupLimits | None:
    """A cgroup for the sandbox with its limits set, or None where none is writable."""
    try:
        own, mounts = _own_cgroups(), _mounts()
    except (OSError, ValueError):
        return None
    leaf = _leaf_name(worker_id, plan.home)
    try:
        if "memory" in mounts and "memory" in own:
            return _open_v1(plan, leaf, own, mounts)
        if "" in mounts and "" in own:
            return _open_v2(plan, leaf, own[""], mounts[""])
    except OSError as exc:
        if not quiet:
            log.info("no writable cgroup for %s (%s)", worker_id, exc.strerror or exc)
    return None


def _open_v1(plan: SandboxPlan, leaf: str, own: dict[str, str], mounts: dict[str, tuple[str, str]]) -> CgroupLimits:
    dirs: list[str] = []
    memory = ""
    for controller in ("memory", "pids", "cpu"):
        if controller not in mounts or controller not in own:
            continue
        point, root = mounts[controller]
        directory = os.path.join(_join(point, root, own[controller]), _GROUP, leaf)
        _make(directory)
        dirs.append(directory)
        if controller == "memory":
            memory = directory
            limit = str(plan.memory_mb * MIB)
            _write(os.path.join(directory, "memory.limit_in_bytes"), limit)
            # Swap counts too where the kernel accounts it, or the limit would only move pages out.
            with contextlib.suppress(OSError):
                _write(os.path.join(directory, "memory.memsw.limit_in_bytes"), limit)
        elif controller == "pids":
            _write(os.path.join(directory, "pids.max"), str(plan.max_processes))
        elif controller == "cpu" and plan.cpu is not None:
            _write(os.path.join(directory, "cpu.cfs_period_us"), str(CPU_PERIOD_US))
            _write(os.path.join(directory, "cpu.cfs_quota_us"), str(int(plan.cpu * CPU_PERIOD_US)))
    limits = CgroupLimits(1, dirs, memory, procs_files=[os.path.join(d, "cgroup.procs") for d in dirs])
    limits.has_pids = any("pids" in d.split(os.sep) for d in dirs)
    limits.mark()
    return limits


def _open_v2(plan: SandboxPlan, leaf: str, own: str, mount: tuple[str, str]) -> CgroupLimits:
    base = _join(mount[0], mount[1], own)
    group = os.path.join(base, _GROUP)
    _make(group)
    # The "no internal processes" rule: controllers go to children of a cgroup with no processes
    # of its own, which mcpvisor's group is; the parent must have handed them down to it.
    with open(os.path.join(group, "cgroup.controllers")) as listing:
        available = listing.read().split()
    wanted = [c for c in ("memory", "pids", "cpu") if c in available]
    if "memory" not in wanted:
        raise OSError(f"the memory controller is not delegated to {group}")
    _write(os.path.join(group, "cgroup.subtree_control"), " ".join(f"+{c}" for c in wanted))
    directory = os.path.join(group, leaf)
    _make(directory)
    _write(os.path.join(directory, "memory.max"), str(plan.memory_mb * MIB))
    with contextlib.suppress(OSError):
        _write(os.path.join(directory, "memory.swap.max"), "0")
    if "pids" in wanted:
        _write(os.path.join(directory, "pids.max"), str(plan.max_processes))
    if "cpu" in wanted and plan.cpu is not None:
        _write(os.path.join(directory, "cpu.max"), f"{int(plan.cpu * CPU_PERIOD_US)} {CPU_PERIOD_US}")
    limits = CgroupLimits(2, [directory], directory, procs_files=[os.path.join(directory, "cgroup.procs")])
    limits.has_pids = "pids" in wanted
    limits.mark()
    return limits


def join_cgroups(procs_files: list[str]) -> None:
    """In the forked child, before exec: move this process into the sandbox's cgroups."""
    pid = str(os.getpid())
    for path in procs_files:
        _write(path, pid)


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


def memfd_usage(pids: Iterable[int]) -> int:
    """Bytes held by the memfds these processes have open (mapped or not), each counted once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            path = f"/proc/{pid}/fd/{fd}"
            with contextlib.suppress(OSError):
                if not os.readlink(path).startswith("/memfd:"):
                    continue
                info = os.stat(path)
                if (info.st_dev, info.st_ino) not in seen:
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
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            path = f"/proc/{pid}/fd/{fd}"
            with contextlib.suppress(OSError):
                info = os.stat(path)
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
        growing = False
        if self.home and (self.home_bytes is not None or self.reserve_bytes) and now - self._home_seen >= DISK_INTERVAL:
            self._home_seen = now
            with contextlib.suppress(OSError):
                used = tree_size(self.home) + deleted_files_on(pids, os.stat(self.home).st_dev)
                growing, self._home_used = used > self._home_used, used
            if self.home_bytes is not None and self._home_used > self.home_bytes:
                return f"its home went over its size limit ({self.home_bytes // MIB} MiB)"
        if (
            self.reserve_bytes
            and self.data_dir
            and growing
            and self._home_used
            and _same_volume(self.home, self.data_dir)
        ):
            with contextlib.suppress(OSError):
                free = os.statvfs(self.data_dir)
                if free.f_bavail * free.f_frsize < self.reserve_bytes:
                    return (
                        f"it filled the volume that holds mcpvisor's state and logs to its last"
                        f" {self.reserve_bytes // MIB} MiB (data_reserve_mb)"
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


def _same_volume(path: str, other: str) -> bool:
    try:
        return os.stat(path).st_dev == os.stat(other).st_dev
    except OSError:
        return False
