"""A sandbox as data: what a process may reach, turned into a bubblewrap command line.

`bwrap_argv` is pure: it takes a `SandboxSpec` (binds, masks, namespaces, the uid) and the command
to run inside, and returns the argv that starts `bwrap`. Finding out what the host looks like
(`system_binds`, which of /lib, /bin ... are symlinks) is the only I/O here, kept apart so the
builder is tested without running anything.

Two ways to run it, chosen by the caller with `privileged`:
- as root holding CAP_SYS_ADMIN (a system service, a root container): bwrap mounts as real root, without
  a user namespace, and the command runs through `setpriv` as `uid`/`gid` with every capability
  and the bounding set dropped. A user namespace here would map the sandbox's uid back to real
  root outside, so files, signals and /etc/shadow would still see root; an unprivileged uid does not.
- as an ordinary user (a workstation): bwrap makes a user namespace, and the sandbox's uid is the
  user's own; there is no other uid to switch to.

The environment is never on the command line, where `ps` would show it to every user of the host:
bwrap passes on the environment it was started with, so the caller hands the sandbox's environment
to bwrap's own exec.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import subprocess
from collections.abc import Sequence

import msgspec

from mcpvisor.runtime import seccomp

HOME = "/home/sandbox"  # the sandbox's home, whatever host directory backs it
SETPRIV = "/usr/bin/setpriv"  # util-linux: drops to the sandbox's uid inside, as root only

# What `probe` says to do about a sandbox it cannot build.
PROBE_TIMEOUT = 10.0
FIX_INSTALL = "install bubblewrap (apt-get install bubblewrap, dnf install bubblewrap)"
FIX_USERNS = (
    "allow unprivileged user namespaces (on Ubuntu 24.04: an AppArmor profile for bwrap, or "
    "sysctl kernel.apparmor_restrict_unprivileged_userns=0; in a container: see docs/sandbox.md)"
)
FIX_DISABLE_USERNS = (
    "bwrap 0.8 or later is needed, with /proc/sys/user writable inside its user namespace"
    " (a container: an unmasked /proc, see docs/sandbox-deployment.md)"
)
FIX_MOUNT = "give the container what bwrap needs to mount (see docs/sandbox.md: seccomp profile, /proc)"

# The system a program needs, read-only: the merged-/usr dirs and /etc. Anything else is left out.
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")


class Bind(msgspec.Struct, frozen=True, kw_only=True):
    """A host path shown inside the sandbox, read-only unless `writable`.

    With `fd` (an O_PATH fd of the source, opened without following what a sandbox can write),
    bwrap binds what the fd holds (`--bind-fd`), whatever has been renamed over `source` since.
    """

    source: str
    dest: str = ""  # empty: the same path as on the host
    writable: bool = False
    fd: int | None = None

    @property
    def target(self) -> str:
        return self.dest or self.source


class Symlink(msgspec.Struct, frozen=True, kw_only=True):
    """A symlink made inside the sandbox (the host's /lib -> usr/lib on a merged-/usr system)."""

    path: str
    target: str


class Mask(msgspec.Struct, frozen=True, kw_only=True):
    """A host path that must not be seen although a bind would show it: an empty dir or file on top."""

    path: str
    directory: bool = True


class SandboxSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What one sandbox may reach. Everything not listed here does not exist inside."""

    system: tuple[Bind | Symlink, ...] = ()  # from `system_binds()`
    binds: tuple[Bind, ...] = ()  # the command's install prefix, its script, operator's extra binds
    links: tuple[Symlink, ...] = ()  # made after the binds (a command that is a symlink to its file)
    home: str | None = None  # host dir bound writable at HOME
    tmpfs_bytes: int | None = None  # the most each of /tmp and /dev/shm may hold (None: half the RAM)
    masks: tuple[Mask, ...] = ()  # hidden wherever a bind above would show them
    network: bool = True  # False: a network namespace of its own, with loopback only
    cwd: str | None = None  # inside; None: HOME when there is one, else /
    uid: int | None = None  # as root: the uid the command runs as (None: root's, not advised)
    gid: int | None = None
    hostname: str = "sandbox"
    seccomp_fd: int | None = None  # the filter (runtime.seccomp), loaded just before the command runs
    own_ipc: bool = True  # False: the IPC namespace it starts in is already its own (made with limits)
    block_fd: int | None = None  # the command starts only once this fd has data (its network is up)
    files: tuple[tuple[int, str], ...] = ()  # (fd, path): read-only files made from what the fd holds
    disable_userns: bool = True  # as an ordinary user: --disable-userns (bwrap 0.8 and later)


def _dirs_above(path: str) -> list[str]:
    parts = [part for part in path.split("/") if part]
    return ["/" + "/".join(parts[:depth]) for depth in range(1, len(parts))]


def _depth(path: str) -> int:
    return len([part for part in path.split("/") if part])


def _inside(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _shown_at(path: str, binds: Sequence[Bind]) -> list[str]:
    """Where inside the sandbox the host `path` would be visible through these binds."""
    seen = []
    for bind in binds:
        if _inside(path, bind.source):
            seen.append(posixpath.join(bind.target, posixpath.relpath(path, bind.source)).rstrip("/.") or "/")
    return seen


def bwrap_argv(
    spec: SandboxSpec, command: Sequence[str], *, privileged: bool, bwrap: str = "bwrap", setpriv: str = SETPRIV
) -> list[str]:
    """The argv that runs `command` inside the sandbox `spec` describes.

    `privileged` says bwrap will run as root (see the module's docstring); then `spec.uid` is
    the uid the command runs as, through `setpriv`.
    """
    if not command:
        raise ValueError("no command to run in the sandbox")
    argv = [bwrap]
    if not privileged:
        # The filter refuses new user namespaces too; this makes the kernel refuse them as well.
        argv += ["--unshare-user", *(["--disable-userns"] if spec.disable_userns else [])]
    # --unshare-all without the user namespace, which as root would hand the sandbox a uid that is
    # root outside; --share-net's opposite is spelled out for the same reason.
    argv += ["--unshare-pid", *(["--unshare-ipc"] if spec.own_ipc else []), "--unshare-uts", "--unshare-cgroup-try"]
    if not spec.network:
        argv.append("--unshare-net")
    argv += ["--hostname", spec.hostname, "--die-with-parent", "--new-session"]
    switch_uid = privileged and spec.uid is not None
    argv += ["--cap-drop", "ALL"]
    if switch_uid:
        # Only setpriv holds these, for the one moment it switches uid; it drops them all itself.
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]

    made: set[str] = set()  # dirs that exist inside already, and mount points below which all do

    def parents(dest: str) -> None:
        # bwrap would make missing parents with the mode of the host's (0700 for /root), which the
        # sandbox's uid could not enter; make them 0755 first.
        for directory in _dirs_above(dest):
            if directory not in made and not any(_inside(directory, done) for done in mounted):
                made.add(directory)
                argv.extend(["--perms", "0755", "--dir", directory])

    mounted: list[str] = []

    for entry in spec.system:
        if isinstance(entry, Symlink):
            argv += ["--symlink", entry.target, entry.path]
        else:
            argv += ["--ro-bind", entry.source, entry.target]
            mounted.append(entry.target)
        made.add(entry.path if isinstance(entry, Symlink) else entry.target)
    # /dev/shm and /tmp as every program expects them (writable by all, sticky), private. bwrap
    # mounts them as root: without the mode, a sandbox's own uid could not write to them.
    argv += ["--proc", "/proc", "--dev", "/dev"]
    # Their pages are memory, which the memory watchdog does not see in any process's RSS.
    size = ["--size", str(spec.tmpfs_bytes)] if spec.tmpfs_bytes is not None else []
    argv += [*size, "--perms", "1777", "--tmpfs", "/dev/shm", *size, "--perms", "1777", "--tmpfs", "/tmp"]
    made.update(("/proc", "/dev", "/dev/shm", "/tmp"))
    # Parent first: a bind nested in another is mounted after it, or the outer one would cover it.
    for bind in sorted(spec.binds, key=lambda each: _depth(each.target)):
        parents(bind.target)
        if bind.fd is not None:
            argv += ["--bind-fd" if bind.writable else "--ro-bind-fd", str(bind.fd), bind.target]
        else:
            argv += ["--bind" if bind.writable else "--ro-bind", bind.source, bind.target]
        mounted.append(bind.target)
    for link in spec.links:
        parents(link.path)
        argv += ["--symlink", link.target, link.path]
    if spec.home is not None:
        parents(HOME)
        argv += ["--bind", spec.home, HOME]
    shown = [entry for entry in spec.system if isinstance(entry, Bind)] + list(spec.binds)
    covered: list[str] = []
    for mask in spec.masks:
        for bind in shown:
            for path in _shown_at(mask.path, [bind]):
                directory, parent = mask.directory, posixpath.dirname(path)
                if not directory and parent != bind.target and _inside(parent, bind.target):
                    # A mount on a file is dropped as soon as the host renames another file over it
                    # or unlinks it (a config save, a rotated key), so its dir is covered instead:
                    # that survives whatever happens inside. Other binds that would show a hidden
                    # file are refused (workers.confine); a system dir such as /etc cannot be.
                    path, directory = parent, True
                if any(_inside(path, done) for done in covered):
                    continue
                covered.append(path)
                if directory:
                    argv += ["--perms", "0000", "--tmpfs", path]
                else:
                    # Right at the top of a system dir (/etc/x.key): the file alone is all that can be covered.
                    argv += ["--ro-bind", "/dev/null", path]
    for fd, path in spec.files:
        argv += ["--perms", "0444", "--ro-bind-data", str(fd), path]
    if spec.seccomp_fd is not None:
        argv += ["--seccomp", str(spec.seccomp_fd)]
    if spec.block_fd is not None:
        argv += ["--block-fd", str(spec.block_fd)]
    if spec.cwd is not None:
        argv += ["--chdir", spec.cwd]
    elif spec.home is not None:
        argv += ["--chdir", HOME]
    if switch_uid:
        assert spec.uid is not None
        gid = spec.gid if spec.gid is not None else spec.uid
        argv += [
            "--",
            setpriv,
            f"--reuid={spec.uid}",
            f"--regid={gid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--",
        ]
    else:
        argv.append("--")
    argv += list(command)
    return argv


def system_binds(paths: Sequence[str] = SYSTEM_PATHS) -> tuple[Bind | Symlink, ...]:
    """The host's system dirs as the sandbox shows them: symlinks stay symlinks, dirs are bound."""
    found: list[Bind | Symlink] = []
    for path in paths:
        if os.path.islink(path):
            found.append(Symlink(path=path, target=os.readlink(path)))
        elif os.path.isdir(path):
            found.append(Bind(source=path))
    return tuple(found)


_features: dict[str, frozenset[str]] = {}


def features(tool: str) -> frozenset[str]:
    """The options of this bwrap that mcpvisor uses when present (`--bind-fd`: Debian's 0.8 has it)."""
    if tool not in _features:
        try:
            done = subprocess.run([tool, "--help"], capture_output=True, text=True, timeout=PROBE_TIMEOUT, check=False)
            text = done.stdout + done.stderr
        except (OSError, subprocess.TimeoutExpired):
            text = ""
        wanted = ("--bind-fd", "--disable-userns", "--seccomp", "--block-fd", "--ro-bind-data")
        _features[tool] = frozenset(option for option in wanted if f"{option} " in text)
    return _features[tool]


_CAP_SYS_ADMIN = 21
FIX_ROOT = (
    "mcpvisor runs as root without CAP_SYS_ADMIN (a container's root under the default capabilities), "
    "so bwrap cannot mount as root and a user namespace would map the sandbox to root: run mcpvisor as "
    "an unprivileged user (the container image's UID 10001), see docs/sandbox-deployment.md"
)


def mounts_as_root() -> bool:
    """Whether this process is root holding CAP_SYS_ADMIN, so bwrap can mount as real root."""
    if os.geteuid() != 0:
        return False
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> _CAP_SYS_ADMIN & 1)
    except (OSError, ValueError):
        pass
    return False


_probed: dict[bool, str | None] = {}


def probe() -> str | None:
    """Whether bwrap can build a sandbox here: None, or one line that names the fix."""
    privileged = os.geteuid() == 0
    if privileged in _probed:
        return _probed[privileged]
    tool = shutil.which("bwrap")
    if tool is None:
        problem: str | None = f"the sandbox needs bwrap, which is not installed: {FIX_INSTALL}"
    elif privileged and not mounts_as_root():
        problem = FIX_ROOT
    else:
        try:
            filter_fd = seccomp.filter_fd()
        except seccomp.SeccompError as exc:
            problem = str(exc)
        else:
            spec = SandboxSpec(
                system=system_binds(), network=False, uid=65534 if privileged else None, seccomp_fd=filter_fd
            )
            argv = bwrap_argv(spec, ["true"], privileged=privileged, bwrap=tool)
            try:
                done = subprocess.run(
                    argv,
                    env={"PATH": "/usr/bin:/bin"},
                    capture_output=True,
                    text=True,
                    timeout=PROBE_TIMEOUT,
                    check=False,
                    pass_fds=(filter_fd,),
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                problem = f"bwrap cannot run ({exc}): {FIX_INSTALL}"
            else:
                problem = None if done.returncode == 0 else _explain(done.stderr)
            finally:
                os.close(filter_fd)
    _probed[privileged] = problem
    return problem


def _explain(stderr: str) -> str:
    said = stderr.strip().splitlines()[-1][:200] if stderr.strip() else "no message"
    lowered = said.lower()
    if "max_user_namespaces" in lowered:
        return f"bwrap cannot keep the sandbox from making user namespaces ({said}): {FIX_DISABLE_USERNS}"
    if "namespace" in lowered or "uid map" in lowered or "setting up uid" in lowered:
        return f"bwrap cannot create namespaces here ({said}): {FIX_USERNS}"
    return f"bwrap cannot build a sandbox here ({said}): {FIX_MOUNT}"
