"""A sandbox's cgroup: memory, processes and CPU limits that the kernel enforces.

cgroup v2 (systemd's `Delegate=yes`, a container's own cgroup namespace) or v1 (the memory, pids
and cpu controllers mounted apart): a child cgroup `mcpvisor/LEAF` of the worker's own, which the
upstream's process joins before it execs bwrap, so everything it starts is counted. The worker
only reads why a process died (the cgroup's OOM kill count). The cgroups are removed when the
sandbox stops, and mcpvisor's own group with the last of them.

With tenants, a missing cgroup is a start-up error (`cgroup_problem`), unless the operator chose
the watchdog (workers.limits) with `limits = "watchdog"`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field

import trio

from mcpvisor.wire import sandboxing
from mcpvisor.wire.config import ServerConfig, Settings, TenantConfig
from mcpvisor.wire.sandboxing import SandboxPlan

log = logging.getLogger(__name__)

MIB = 1024 * 1024
CPU_PERIOD_US = 100_000
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


FIX_CGROUP = (
    "run mcpvisor under systemd with Delegate=yes, or give its container a cgroup namespace of its own"
    ' with the cgroup writable (see docs/sandbox-deployment.md); or set limits = "watchdog" in'
    " [mcpvisor.sandbox] to accept limits enforced by a watchdog (no CPU limit)"
)
FIX_NO_CGROUP = f"no writable cgroup for the sandbox's memory and process limits: {FIX_CGROUP}"


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


def cgroup_problem(
    settings: Settings, servers: Mapping[str, ServerConfig], tenants: Mapping[str, TenantConfig]
) -> str | None:
    """Why mcpvisor must not start: a sandbox needs a cgroup (a tenant's, by default) and none is writable."""
    needing = [
        f"{tenant}/{name}" if tenant else name
        for tenant, table in [("", None), *tenants.items()]
        for name in (table.servers if table is not None else servers)
        if name in servers
        and (found := sandboxing.plan(name, settings, servers[name], table, data_dir="/")) is not None
        and found.limits == "cgroup"
    ]
    if not needing:
        return None
    why = cgroup_available()
    if why is None:
        return None
    named = ", ".join(needing[:3]) + (" ..." if len(needing) > 3 else "")
    return f"sandboxes of {named} need a writable cgroup for their memory and process limits ({why}): {FIX_CGROUP}"
