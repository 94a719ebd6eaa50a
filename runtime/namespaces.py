"""What the forked child does before it execs bwrap: namespaces made with their limits already set.

bwrap builds the sandbox; a few things must be in place before it runs, because once the
sandbox's command runs nothing may change them and bwrap has no option for them:

- **a session keyring of its own** (`keyctl(KEYCTL_JOIN_SESSION_KEYRING)`): otherwise every sandbox
  shares the one mcpvisor's service was started with (systemd gives each service one);
- **an IPC namespace with limits**: its SysV shared memory and message queues are memory no
  process's RSS shows, so `kernel.shmall`, `shmmax`, `shmmni` and `msgmni` of the sandbox's own IPC
  namespace are set from its memory limit (bwrap then keeps that namespace, `own_ipc=False`);
- **a network namespace with its routes** (runtime.network) when the sandbox's network is its own;
- as an ordinary user, **a user namespace of its own (two levels)**: the first maps the user to
  root, which the kernel asks of whoever sets an IPC namespace's limits and routes; the second maps
  the user back, so bwrap runs as that user and makes its own user namespace below. Processes are
  counted per user namespace (RLIMIT_NPROC): the limit set here counts the sandbox's alone, not every
  process of mcpvisor's user.

As root, the IPC namespace is made directly; the network namespace belongs to a user namespace
owned by `nobody`, made by a short-lived helper, so pasta can join it after dropping to `nobody`
(pasta never runs as root).

Everything here runs between fork and exec: no threads, no locks, only system calls.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import pwd
import resource
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mcpvisor.runtime import network

CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
_KEYCTL_JOIN_SESSION_KEYRING = 1
_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}.get(os.uname().machine)
_PR_SET_DUMPABLE = 4
NS_GET_USERNS = 0xB701  # _IO(0xb7, 0x1): the user namespace that owns a namespace

_libc = ctypes.CDLL(None, use_errno=True)  # loaded here, never after a fork


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def setns(fd: int, kind: int) -> None:
    _check(_libc.setns(fd, kind), "setns")


def new_session_keyring() -> bool:
    """Join a new anonymous session keyring; False where key calls are refused (a container's filter)."""
    if _SYS_KEYCTL is None:
        return False
    if _libc.syscall(_SYS_KEYCTL, _KEYCTL_JOIN_SESSION_KEYRING, None) >= 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EPERM, errno.ENOSYS, errno.EACCES):
        return False  # the runtime refuses every key call, the sandbox's included
    raise OSError(code, f"keyctl: {os.strerror(code)}")


def mapped_ids() -> list[tuple[int, int]]:
    """The (first uid, count) ranges this process may switch to: its user namespace's uid_map."""
    try:
        with open("/proc/self/uid_map") as mapping:
            return [(int(inner), int(count)) for inner, _outer, count in (line.split() for line in mapping)]
    except (OSError, ValueError):
        return [(0, 1 << 32)]


def nobody() -> int:
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return 65534


def _write(path: str, text: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    except OSError as exc:
        raise OSError(exc.errno, f"writing {path}: {exc.strerror}") from None


def _map_self(inner: int, outer_uid: int, outer_gid: int, inner_gid: int) -> None:
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{inner} {outer_uid} 1")
    _write("/proc/self/gid_map", f"{inner_gid} {outer_gid} 1")


def _ipc_limits(memory_bytes: int) -> None:
    pages = max(1, memory_bytes // os.sysconf("SC_PAGE_SIZE"))
    for name, value in (("shmmax", memory_bytes), ("shmall", pages), ("shmmni", 64), ("msgmni", 32)):
        _write(f"/proc/sys/kernel/{name}", str(value))


@dataclass
class Plan:
    """What the child sets up; built by workers.confine, run by `prepare` after fork."""

    memory_bytes: int
    max_processes: int
    privileged: bool
    outbound: bool  # a network namespace of its own, for pasta
    blocked: Sequence[network.Network] = ()
    report_fd: int | None = None  # a socket: the child sends its netns fd over it
    error_fd: int | None = None  # a pipe: why preparing failed
    before: list[Callable[[], None]] = field(default_factory=list)  # e.g. joining the cgroups


def _network_as_root(blocked: Sequence[network.Network]) -> None:
    """A network namespace owned by nobody's user namespace, joined by this (root) process."""
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    helper = os.fork()
    if helper == 0:
        try:
            os.close(ready_r)
            os.close(done_w)
            uid = nobody()
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            # Changing uid made /proc/self root's (not dumpable): its own maps could not be written.
            _libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
            unshare(CLONE_NEWUSER | CLONE_NEWNET)
            _map_self(0, uid, uid, 0)  # pasta, joining as nobody, is root in it
            os.write(ready_w, b"1")
            os.read(done_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(done_r)
    try:
        if os.read(ready_r, 1) != b"1":
            raise OSError(errno.EPERM, "cannot make the sandbox's network namespace as nobody")
        fd = os.open(f"/proc/{helper}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            setns(fd, CLONE_NEWNET)
        finally:
            os.close(fd)
    finally:
        os.close(done_w)
        os.close(ready_r)
        os.waitpid(helper, 0)
    network.confine_namespace(blocked)


def _report(report_fd: int | None, outbound: bool) -> None:
    """Send the worker this process's IPC namespace (and network namespace when it is its own)."""
    if report_fd is None:
        return
    kinds = ["ipc", "net"] if outbound else ["ipc"]
    fds = [os.open(f"/proc/self/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC) for kind in kinds]
    try:
        with socket.socket(fileno=os.dup(report_fd)) as channel:
            socket.send_fds(channel, [b"n"], fds)
    finally:
        for fd in fds:
            os.close(fd)
        os.close(report_fd)


def prepare(plan: Plan) -> None:
    """In the child, before exec: see the module's docstring. A failure is written to `plan.error_fd`
    (the exception itself cannot leave the child: Popen only says that one happened)."""
    try:
        _prepare(plan)
    except OSError as exc:
        if plan.error_fd is not None:
            os.write(plan.error_fd, str(exc).encode(errors="replace")[:500])
        raise


def _prepare(plan: Plan) -> None:
    for step in plan.before:
        step()
    new_session_keyring()
    if plan.privileged:
        unshare(CLONE_NEWIPC)
        _ipc_limits(plan.memory_bytes)
        if plan.outbound:
            _network_as_root(plan.blocked)
        _report(plan.report_fd, plan.outbound)
        return
    uid, gid = os.getuid(), os.getgid()
    unshare(CLONE_NEWUSER | CLONE_NEWIPC | (CLONE_NEWNET if plan.outbound else 0))
    _map_self(0, uid, gid, 0)
    _ipc_limits(plan.memory_bytes)
    if plan.outbound:
        network.confine_namespace(plan.blocked)
    unshare(CLONE_NEWUSER)
    _map_self(uid, 0, 0, gid)
    # Counted in this user namespace: the sandbox's processes and threads, bwrap's included.
    resource.setrlimit(resource.RLIMIT_NPROC, (plan.max_processes, plan.max_processes))
    _report(plan.report_fd, plan.outbound)


@dataclass
class Namespaces:
    """The sandbox's IPC and network namespaces as fds in the worker, with the user namespaces owning them."""

    ipc: int
    ipc_owner: int | None  # None: mcpvisor's own (root), nothing to join
    net: int | None = None
    net_owner: int | None = None

    def close(self) -> None:
        for fd in (self.ipc, self.ipc_owner, self.net, self.net_owner):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)


def receive_namespaces(channel: socket.socket, *, privileged: bool) -> Namespaces:
    """In the worker, after the spawn: the namespaces the child sent before it exec'd bwrap."""
    channel.setblocking(False)
    _data, fds, _flags, _addr = socket.recv_fds(channel, 16, 2)
    if not fds:
        raise OSError(errno.EPROTO, "the sandbox sent no namespaces")
    found = Namespaces(ipc=fds[0], ipc_owner=None if privileged else fcntl.ioctl(fds[0], NS_GET_USERNS))
    if len(fds) > 1:
        found.net, found.net_owner = fds[1], fcntl.ioctl(fds[1], NS_GET_USERNS)
    return found
