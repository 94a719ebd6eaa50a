"""Which upstreams run in a sandbox, and with what: the config's layers merged into one plan.

Pure: the supervisor computes a worker's plan from the config and hands it over in the worker's
launch spec, `ctl inspect` and the console show the same plan, and the worker turns it into
bubblewrap's arguments (workers/confine.py) once it knows the command's install prefix.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from mcpvisor.wire.config import TENANT_NAME, SandboxConfig, ServerConfig, Settings, TenantConfig

DEFAULT_MEMORY_MB = 1024
DEFAULT_MAX_PROCESSES = 256
TENANT_CPU = 1.0
TENANT_HOME_MB = 1024
TENANT_FIELD = "{tenant}"
NETWORKS = ("outbound", "host", "none")


class SandboxPlan(msgspec.Struct, frozen=True, kw_only=True):
    """What a worker's upstream process may reach and use, decided from the config."""

    home: str  # host dir of its private home
    network: str = "host"  # one of NETWORKS
    private_networks: bool = False  # an outbound network reaches the private ranges too
    memory_mb: int = DEFAULT_MEMORY_MB
    max_processes: int = DEFAULT_MAX_PROCESSES
    cpu: float | None = None
    home_mb: int | None = None
    ro: tuple[str, ...] = ()
    rw: tuple[str, ...] = ()
    hidden: tuple[str, ...] = ()  # host paths never shown, whatever a bind covers
    # Where some sandbox (this one or another) can write: `{tenant}` is any tenant. Nothing there
    # is followed when binds are resolved, nor may a bind be mounted inside one.
    writable: tuple[str, ...] = ()
    limits: str = "auto"  # auto: cgroup, else the watchdog; cgroup: required; watchdog: chosen
    uid: int | None = None  # as root: the uid it runs as (store.sandbox_uids); None otherwise
    data_dir: str = ""  # the volume of the state and logs, kept above `data_reserve_mb`
    data_reserve_mb: int = 0


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
    writable: Sequence[str] = (),
    uid: int | None = None,
) -> SandboxPlan | None:
    """The sandbox of worker `worker_id` (`server` or `tenant/server`), or None when it runs without.

    `writable` is every place any sandbox of the config may write (`writable_places`); `uid` the
    one the uid table gave this worker id, when mcpvisor runs as root.
    """
    if not wanted(settings, server, tenant):
        return None
    layers = _layers(settings, server, tenant)
    tenant_name = worker_id.rpartition("/")[0]
    for_tenant = tenant is not None

    def last(field: str) -> object:
        values = [getattr(layer, field) for layer in layers if getattr(layer, field) is not None]
        return values[-1] if values else None

    network = last("network")
    memory = last("memory_mb")
    processes = last("max_processes")
    cpu = last("cpu")
    home_mb = last("home_mb")
    limits = [layer.limits for layer in layers if layer.limits != "auto"]
    home = home_dir(data_dir, worker_id)
    return SandboxPlan(
        home=home,
        network=_network(network, for_tenant),
        private_networks=bool(last("private_networks")),
        memory_mb=int(memory) if isinstance(memory, int) else DEFAULT_MEMORY_MB,
        max_processes=int(processes) if isinstance(processes, int) else DEFAULT_MAX_PROCESSES,
        cpu=float(cpu) if isinstance(cpu, int | float) else (TENANT_CPU if for_tenant else None),
        home_mb=int(home_mb) if isinstance(home_mb, int) else (TENANT_HOME_MB if for_tenant else None),
        ro=tuple(_expand((path for layer in layers for path in layer.ro), tenant_name)),
        rw=tuple(_expand((path for layer in layers for path in layer.rw), tenant_name)),
        hidden=tuple(dict.fromkeys(hidden)),
        writable=tuple(dict.fromkeys([*writable, posixpath.join(data_dir, "sandboxes")])),
        # A tenant's sandbox has its limits from the kernel, or the operator chose the watchdog.
        limits=limits[-1] if limits else ("cgroup" if for_tenant else "auto"),
        uid=uid,
        data_dir=data_dir,
        data_reserve_mb=settings.data_reserve_mb,
    )


def _network(value: object, for_tenant: bool) -> str:
    if value is None:
        return "outbound" if for_tenant else "host"
    if value is True or value == "outbound":
        return "outbound"
    return "host" if value == "host" else "none"


def writable_places(
    settings: Settings, servers: Mapping[str, ServerConfig], tenants: Mapping[str, TenantConfig]
) -> list[str]:
    """Every `rw` bind of every sandbox layer of the config, `{tenant}` left as it is (any tenant)."""
    layers: list[object] = [settings.sandbox]
    layers += [server.sandbox for server in servers.values()]
    layers += [tenant.sandbox for tenant in tenants.values()]
    found = [path for layer in layers if isinstance(layer, SandboxConfig) for path in layer.rw]
    return list(dict.fromkeys(posixpath.normpath(path) for path in found))


def refused_bind(path: str, plan: SandboxPlan) -> str | None:
    """Why a bind of host `path` would open what a sandbox never sees (None: it may be bound).

    A bind inside a hidden path, or one that is a hidden path, is refused; a bind that merely
    contains a hidden path is allowed, the hidden path being covered inside (see runtime.bwrap.Mask).
    """
    for secret in plan.hidden:
        if path == secret or path.startswith(secret.rstrip("/") + "/"):
            return f"{path} is inside {secret}, which no sandbox may see"
    return None


_NETWORK_SHOWN = {
    "outbound": "its own, outbound only (no host loopback, link-local or host addresses)",
    "host": "the host's (loopback included)",
    "none": "none (loopback only)",
}


def describe(plan: SandboxPlan | None, refused: Sequence[str] = ()) -> dict[str, object]:
    """What a sandbox allows, for `ctl inspect` and the console (Flatpak's --show-permissions).

    `refused` are the binds that will not be mounted, each with its reason (see workers.confine).
    """
    if plan is None:
        return {"enabled": False}
    network = _NETWORK_SHOWN[plan.network]
    if plan.network == "outbound":
        network += ", private ranges reachable" if plan.private_networks else ", private ranges unreachable"
    return {
        "enabled": True,
        "network": network,
        "home": plan.home,
        "read_only": ["the system (/usr, /etc ...)", "the command's install prefix", *plan.ro],
        "writable": ["its home", "a private /tmp", *plan.rw],
        "refused": list(refused),
        "memory_mb": plan.memory_mb,
        "max_processes": plan.max_processes,
        "cpu": plan.cpu,
        "home_mb": plan.home_mb,
        "limits": plan.limits,
        "uid": plan.uid,
        "seccomp": "Flatpak's filter plus io_uring, userfaultfd, kexec, bpf, modules; a session keyring of its own",
        "never": [
            "the data dir",
            "the config dir",
            "the runtime dir (sockets)",
            "secret files",
            "other sandboxes' homes",
            "other processes",
        ],
    }
