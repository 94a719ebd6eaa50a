"""Which upstreams run in a sandbox, and with what: the config's layers merged into one plan.

Pure: the supervisor computes a worker's plan from the config and hands it over in the worker's
launch spec, `ctl inspect` and the console show the same plan, and the worker turns it into
bubblewrap's arguments (workers/confine.py) once it knows the command's install prefix.
"""

from __future__ import annotations

import posixpath
import zlib
from collections.abc import Iterable, Sequence

import msgspec

from mcpvisor.wire.config import TENANT_NAME, SandboxConfig, ServerConfig, Settings, TenantConfig

DEFAULT_MEMORY_MB = 1024
DEFAULT_MAX_PROCESSES = 256
TENANT_FIELD = "{tenant}"
# Unprivileged uids for sandboxes when mcpvisor runs as root: one per worker id, far above the
# uids a distribution hands out, so none owns a file on the host.
UID_FLOOR = 1 << 30
UID_SPAN = 1 << 30


class SandboxPlan(msgspec.Struct, frozen=True, kw_only=True):
    """What a worker's upstream process may reach and use, decided from the config."""

    home: str  # host dir of its private home
    network: bool = True
    memory_mb: int = DEFAULT_MEMORY_MB
    max_processes: int = DEFAULT_MAX_PROCESSES
    cpu: float | None = None
    ro: tuple[str, ...] = ()
    rw: tuple[str, ...] = ()
    hidden: tuple[str, ...] = ()  # host paths never shown, whatever a bind covers
    limits: str = "auto"


def _layers(settings: Settings, server: ServerConfig, tenant: TenantConfig | None) -> list[SandboxConfig]:
    found: list[SandboxConfig] = []
    for layer in (settings.sandbox, server.sandbox, tenant.sandbox if tenant is not None else None):
        if isinstance(layer, SandboxConfig):
            found.append(layer)
        elif layer is True:
            found.append(SandboxConfig())
    return found


def wanted(settings: Settings, server: ServerConfig, tenant: TenantConfig | None) -> bool:
    """Whether this server's process runs in a sandbox: always for a tenant's, else as configured."""
    if server.kind != "stdio":
        return False  # nothing runs here: the upstream is reached over the network
    if tenant is not None:
        return True
    chosen = server.sandbox if server.sandbox is not None else settings.sandbox
    return chosen.enabled if isinstance(chosen, SandboxConfig) else bool(chosen)


def home_dir(data_dir: str, worker_id: str) -> str:
    """The host dir of a worker's sandbox home; tenants' and plain servers' never nest in each other."""
    tenant, _, server = worker_id.rpartition("/")
    if tenant:
        return posixpath.join(data_dir, "sandboxes", "tenants", tenant, server)
    return posixpath.join(data_dir, "sandboxes", "servers", server)


def _expand(paths: Iterable[str], tenant: str) -> list[str]:
    """`{tenant}` becomes the tenant's name; a template outside any tenant binds nothing."""
    expanded = []
    for path in paths:
        if TENANT_FIELD in path:
            # Names are checked against TENANT_NAME when the config loads: no '/', no '..'.
            if not tenant or not TENANT_NAME.fullmatch(tenant) or tenant in (".", ".."):
                continue
            path = path.replace(TENANT_FIELD, tenant)
        expanded.append(posixpath.normpath(path))
    return list(dict.fromkeys(expanded))


def plan(
    worker_id: str,
    settings: Settings,
    server: ServerConfig,
    tenant: TenantConfig | None,
    *,
    data_dir: str,
    hidden: Sequence[str] = (),
) -> SandboxPlan | None:
    """The sandbox of worker `worker_id` (`server` or `tenant/server`), or None when it runs without."""
    if not wanted(settings, server, tenant):
        return None
    layers = _layers(settings, server, tenant)
    tenant_name = worker_id.rpartition("/")[0]

    def last(field: str) -> object:
        values = [getattr(layer, field) for layer in layers if getattr(layer, field) is not None]
        return values[-1] if values else None

    network = last("network")
    memory = last("memory_mb")
    processes = last("max_processes")
    cpu = last("cpu")
    limits = [layer.limits for layer in layers if layer.limits != "auto"]
    return SandboxPlan(
        home=home_dir(data_dir, worker_id),
        network=True if network is None else bool(network),
        memory_mb=int(memory) if isinstance(memory, int) else DEFAULT_MEMORY_MB,
        max_processes=int(processes) if isinstance(processes, int) else DEFAULT_MAX_PROCESSES,
        cpu=float(cpu) if isinstance(cpu, int | float) else None,
        ro=tuple(_expand((path for layer in layers for path in layer.ro), tenant_name)),
        rw=tuple(_expand((path for layer in layers for path in layer.rw), tenant_name)),
        hidden=tuple(dict.fromkeys(hidden)),
        limits=limits[-1] if limits else "auto",
    )


def refused_bind(path: str, plan: SandboxPlan) -> str | None:
    """Why a bind of host `path` would open what a sandbox never sees (None: it may be bound).

    A bind inside a hidden path, or one that is a hidden path, is refused; a bind that merely
    contains a hidden path is allowed, the hidden path being covered inside (see runtime.bwrap.Mask).
    """
    for secret in plan.hidden:
        if path == secret or path.startswith(secret.rstrip("/") + "/"):
            return f"{path} is inside {secret}, which no sandbox may see"
    return None


def sandbox_uid(worker_id: str, mapped: Sequence[tuple[int, int]] = ((0, 1 << 32),)) -> int:
    """The unprivileged uid (and gid) a worker's sandbox runs as when mcpvisor is root.

    The same worker id always gets the same uid, so its home stays its own across restarts.
    `mapped` is the (first id, count) ranges this process may switch to (its user namespace's
    uid_map; the whole range outside any container).
    """
    digest = zlib.crc32(worker_id.encode())
    for start, count in sorted(mapped, key=lambda r: r[1], reverse=True):
        low, high = max(start, UID_FLOOR), min(start + count, UID_FLOOR + UID_SPAN)
        if high - low >= 1 << 16:
            return low + digest % (high - low)
    # A narrow map (a rootless container's 65536 ids): the top half of the widest range.
    start, count = max(mapped, key=lambda r: r[1])
    low = start + count // 2
    return low + digest % max(count - count // 2 - 1, 1)


def describe(plan: SandboxPlan | None) -> dict[str, object]:
    """What a sandbox allows, for `ctl inspect` and the console (Flatpak's --show-permissions)."""
    if plan is None:
        return {"enabled": False}
    return {
        "enabled": True,
        "network": "shared" if plan.network else "none (loopback only)",
        "home": plan.home,
        "read_only": ["the system (/usr, /etc ...)", "the command's install prefix", *plan.ro],
        "writable": ["its home", "a private /tmp", *plan.rw],
        "memory_mb": plan.memory_mb,
        "max_processes": plan.max_processes,
        "cpu": plan.cpu,
        "limits": plan.limits,
        "never": [
            "the data dir",
            "the config dir",
            "the runtime dir (sockets)",
            "secret files",
            "other sandboxes' homes",
            "other processes",
        ],
    }
