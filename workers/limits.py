"""Limits of one sandbox: memory, processes and CPU, in a cgroup where one is writable.

cgroup v2 (systemd's `Delegate=yes`, a container's own cgroup namespace) or v1 (the memory, pids
and cpu controllers mounted apart): a child cgroup of the worker's own, which the upstream's
process joins before it execs bwrap, so everything it starts is counted. The kernel enforces the
limits; the worker only reads why a process died (the cgroup's OOM kill count).

Where no cgroup is writable, `Watchdog` does supervisord's memmon: the worker reads the memory of
the upstream's process tree (its resident memory and the files in its private /tmp and /dev/shm)
and kills the tree above the limit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import trio

from mcpvisor.wire.sandboxing import SandboxPlan

log = logging.getLogger(__name__)

MIB = 1024 * 1024
CPU_PERIOD_US = 100_000
WATCH_INTERVAL = 0.25
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

    def close(self) -> None:
        """Remove the cgroups once their processes are gone (a busy one is left for the next start)."""
        for directory in self.dirs:
            with contextlib.suppress(OSError):
                os.rmdir(directory)


def _make(directory: str) -> None:
    os.makedirs(directory, exist_ok=True)


def open_cgroup(plan: SandboxPlan, worker_id: str) -> CgroupLimits | None:
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
        log.info("no writable cgroup for %s (%s): the memory watchdog applies", worker_id, exc.strerror or exc)
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


def resident(pids: Iterable[int]) -> int:
    """Resident memory of these processes, in bytes (those gone count 0)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/statm") as statm:
            total += int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return total


def tree_rss(root_pid: int) -> int:
    """Resident memory of a process and all its descendants, in bytes (0 once it is gone)."""
    return resident(tree_pids(root_pid))


def private_tmpfs(pids: Iterable[int], points: tuple[str, ...] = ("tmp", "dev/shm")) -> int:
    """Bytes held in the private /tmp and /dev/shm of these processes' sandbox (0 outside one).

    Files there are memory that no process's RSS shows. Each mount is counted once, and only
    those of processes in another mount namespace than this one (the host's /tmp is not theirs).
    """
    try:
        own = os.readlink("/proc/self/ns/mnt")
    except OSError:
        return 0
    counted: set[int] = set()
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/ns/mnt") == own:
                continue
            for point in points:
                path = f"/proc/{pid}/root/{point}"
                with contextlib.suppress(OSError):
                    device = os.stat(path).st_dev
                    if device not in counted:
                        counted.add(device)
                        usage = os.statvfs(path)
                        total += (usage.f_blocks - usage.f_bfree) * usage.f_frsize
    return total


@dataclass
class Watchdog:
    """Where no cgroup is writable: kill the process tree above its memory limit (supervisord's memmon)."""

    limit_bytes: int
    fired: bool = False

    async def watch(self, root_pid: int, kill: Callable[[], None]) -> None:
        while True:
            pids = tree_pids(root_pid)  # one walk for both counts
            used = resident(pids) + private_tmpfs(pids)
            if used > self.limit_bytes:
                log.warning(
                    "sandbox pid %d uses %d MiB, over its %d MiB limit: killing it",
                    root_pid,
                    used // MIB,
                    self.limit_bytes // MIB,
                )
                self.fired = True
                kill()
                return
            await trio.sleep(WATCH_INTERVAL)
