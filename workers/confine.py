"""An upstream's command put in its sandbox: the binds it needs, its home, its uid, its environment.

The plan (wire.sandboxing) says what the config allows; this module looks at the host to find
what the command itself needs to run (its install prefix, a virtualenv's base interpreter, the
script it is given) and hands everything to runtime.bwrap, which builds the command line.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import trio

from mcpvisor.runtime import bwrap, lifetime, namespaces, network, pathfd, seccomp
from mcpvisor.runtime import quota as home_quota
from mcpvisor.wire.sandboxing import SandboxPlan, refused_bind

# System dirs bound already: a prefix inside them needs no bind of its own.
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class SandboxError(Exception):
    """A sandbox that is required cannot be built; the message names the fix."""


@dataclass
class Confined:
    """The command as it starts: bwrap's argv, the environment bwrap hands on, the sandbox's uid,
    the fds bwrap must inherit, and what the forked child does before it execs bwrap (`prepare`).

    Start it with `pass_fds` and `prepare` (as `preexec_fn`/`before_exec`), then call `started`
    (which closes what only the child needed); with an outbound network, `outbound` then starts
    pasta and lets the sandbox's command run.
    """

    argv: list[str]
    env: dict[str, str]
    uid: int | None
    pass_fds: tuple[int, ...] = ()
    prepare: Callable[[], None] = lambda: None
    refused: list[str] = field(default_factory=list)
    outbound: OutboundNetwork | None = None
    error_fd: int | None = None  # why `prepare` failed in the child, if it did
    channel: socket.socket | None = None  # the child sends its namespaces over it
    privileged: bool = False
    namespaces: namespaces.Namespaces | None = None
    quota: bool = False  # the home's size is held by a project quota (runtime.quota)

    def failure(self) -> str:
        """What `prepare` wrote before it failed (after a spawn that raised), or ""."""
        if self.error_fd is None:
            return ""
        os.set_blocking(self.error_fd, False)
        try:
            return os.read(self.error_fd, 4096).decode(errors="replace")
        except BlockingIOError:
            return ""

    def started(self) -> None:
        """After the spawn (or a failed one): close the fds the child inherited, and take the
        namespaces it sent (a spawn that worked ran `prepare` to its end before exec)."""
        for fd in self.pass_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.pass_fds = ()
        if self.channel is not None and self.namespaces is None:
            with contextlib.suppress(OSError):
                self.namespaces = namespaces.receive_namespaces(self.channel, privileged=self.privileged)
            self.channel.close()
            self.channel = None

    def close(self) -> None:
        self.started()
        if self.namespaces is not None:
            self.namespaces.close()
            self.namespaces = None
        if self.error_fd is not None:
            os.close(self.error_fd)
            self.error_fd = None
        if self.outbound is not None:
            self.outbound.close()


def _inside(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _is_system(path: str) -> bool:
    return any(_inside(path, system) for system in _SYSTEM)


def _prefix_of(executable: str) -> str | None:
    """The install prefix of a program (`/opt/node` for `/opt/node/bin/node`), unless a system dir."""
    directory = os.path.dirname(executable)
    prefix = os.path.dirname(directory) if os.path.basename(directory) in ("bin", "sbin") else directory
    if prefix in ("", "/") or _is_system(prefix):
        return None
    return prefix


def _homes() -> set[str]:
    """Every user's home dir, $HOME and /: never an install prefix, being where keys live (~/.ssh)."""
    found = {entry.pw_dir for entry in pwd.getpwall() if entry.pw_dir}
    if os.environ.get("HOME"):
        found.add(os.environ["HOME"])
    return {"/"} | {each for path in found for each in (os.path.normpath(path), os.path.realpath(path))}


def _is_venv(prefix: str | None) -> bool:
    return prefix is not None and os.path.isfile(os.path.join(prefix, "pyvenv.cfg"))


def _shebang(path: str) -> str | None:
    try:
        with open(path, "rb") as script:
            first = script.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    parts = first[2:].decode(errors="replace").split()
    if not parts:
        return None
    if os.path.basename(parts[0]) == "env" and len(parts) > 1:
        return shutil.which(parts[1])
    return parts[0]


def _writable(path: str, untrusted: Sequence[str]) -> bool:
    """Whether `path` (as given or where it leads) lies where the sandbox itself can write."""
    return any(_inside(each, place) for each in (os.path.normpath(path), os.path.realpath(path)) for place in untrusted)


def writable_places(plan: SandboxPlan) -> list[str]:
    """Host dirs the upstream can write to (its rw binds, its home), as given and resolved."""
    return list(dict.fromkeys(each for path in (*plan.rw, plan.home) for each in (path, os.path.realpath(path))))


def install_paths(executable: str, untrusted: Sequence[str] = ()) -> list[str]:
    """Host paths the command needs read-only: its prefix, a virtualenv and the Python it is made of,
    and the same for the interpreter a script names in its `#!` line.

    A program installed right in a home dir (`~/bin/tool`: its prefix would be the whole home)
    brings itself alone. A program that is a symlink (`~/.local/bin/tool` of uv or pipx) brings
    the prefix of the file it leads to, not the dir of links it sits in (see `command_link`),
    unless that dir is a virtualenv's (`.venv/bin/python`).

    Nothing in `untrusted` (see `writable_places`) is followed: a pyvenv.cfg, a `#!` line or a
    symlink there is the upstream's to rewrite, and would choose what its next start shows. A
    program there needs no bind (its writable bind shows it), nor does its base interpreter when
    it is the system's; any other must be bound with `ro`.
    """
    homes = _homes()
    found: list[str] = []
    seen: set[str] = set()
    queue = [executable]
    while queue:
        program = os.path.normpath(queue.pop())
        if program in seen or _writable(os.path.dirname(program), untrusted):
            continue
        seen.add(program)
        places = [program, os.path.realpath(program)]
        if os.path.islink(program) and not _is_venv(_prefix_of(program)):
            places.pop(0)  # a dir of links (~/.local/bin), unlike a virtualenv's bin/python
        for path in dict.fromkeys(places):
            prefix = _prefix_of(path)
            if prefix is None or _writable(prefix, untrusted):
                continue
            if prefix in homes or any(_inside(home, prefix) for home in homes):
                found.append(path)
                continue
            found.append(prefix)
            # A virtualenv names its base interpreter's dir in pyvenv.cfg (`home = .../bin`).
            config = os.path.join(prefix, "pyvenv.cfg")
            if os.path.isfile(config):
                with open(config, encoding="utf-8", errors="replace") as cfg:
                    for line in cfg:
                        key, _, value = line.partition("=")
                        if key.strip() == "home" and value.strip():
                            queue.append(os.path.join(value.strip(), "python3"))
        interpreter = None if _writable(program, untrusted) else _shebang(program)
        if interpreter is not None:
            queue.append(interpreter)
    unique: list[str] = []
    for path in dict.fromkeys(found):
        if os.path.exists(path) and not any(_inside(path, other) for other in found if other != path):
            unique.append(path)
    return unique


def command_link(executable: str, binds: Sequence[bwrap.Bind]) -> bwrap.Symlink | None:
    """The command as a symlink to its real file, when it is one that no bind shows (`~/.local/bin/x`)."""
    if not os.path.islink(executable) or _is_system(executable):
        return None
    if any(_inside(executable, bind.target) for bind in binds):
        return None
    return bwrap.Symlink(path=executable, target=os.path.realpath(executable))


def argument_files(args: Sequence[str], cwd: str | None, untrusted: Sequence[str] = ()) -> list[tuple[str, str]]:
    """Files the command is given as arguments (`python server.py`), as (host path, path inside).

    Only files, each alone (or the node_modules tree a script is part of): a directory argument
    (`mcp-server-filesystem /srv`) is the operator's to bind with `ro`/`rw`, since binding it here
    would open whatever it holds. A path through a symlink is shown both where it was given and
    where it leads, as interpreters (Node) load a script's neighbours from its real path. One
    in `untrusted` is shown by its writable bind already, and its symlink is not followed.
    """
    found: list[tuple[str, str]] = []
    for arg in args:
        if arg.startswith("-") or "\0" in arg:
            continue
        given = os.path.normpath(arg if os.path.isabs(arg) else os.path.join(cwd or os.getcwd(), arg))
        if not os.path.isfile(given) or _writable(os.path.dirname(given), untrusted):
            continue
        real = os.path.realpath(given)
        for path in dict.fromkeys((given, real)):
            found.append((_tree_of(real), _tree_of(path)))
    return list(dict.fromkeys(found))


def _tree_of(path: str) -> str:
    # A script from a node_modules tree imports its neighbours: the whole tree comes along.
    parts = path.split("/")
    if "node_modules" in parts:
        return "/".join(parts[: len(parts) - parts[::-1].index("node_modules")])
    return path


def prepare_home(home: str, uid: int | None, root: str = "") -> None:
    """Create the sandbox's home (owned by its uid); its parents up to `root` (the data dir's
    `sandboxes`) stay mcpvisor's own, 0700, whatever made them before.

    Mode 0711: bwrap enters it (--chdir) as root without capabilities, before the uid switch; no
    one else reaches it, its parents being closed.
    """
    parents = [os.path.dirname(home)]
    while root and parents[-1] != root and _inside(parents[-1], root):
        parents.append(os.path.dirname(parents[-1]))
    os.makedirs(os.path.dirname(parents[-1]), mode=0o700, exist_ok=True)
    for directory in reversed(parents):
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o700)
        os.chmod(directory, 0o700)
    os.makedirs(home, mode=0o711, exist_ok=True)
    if uid is not None and os.stat(home).st_uid != uid:
        # A home from before (or from a different uid) becomes this sandbox's, all of it.
        for root, dirs, files in os.walk(home):
            for name in dirs + files:
                os.lchown(os.path.join(root, name), uid, uid)
        os.chown(home, uid, uid)
    os.chmod(home, 0o711)


def sandbox_env(configured: Mapping[str, str], executable: str) -> dict[str, str]:
    """Only what the sandbox is given: its configured env over a minimal base, nothing of mcpvisor's."""
    home = bwrap.HOME
    env = {
        "PATH": f"{os.path.dirname(executable)}:{BASE_PATH}",
        "HOME": home,
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "TMPDIR": "/tmp",
        # npx and uvx keep their downloads in the home, which persists across restarts.
        "XDG_CACHE_HOME": f"{home}/.cache",
        "npm_config_cache": f"{home}/.npm",
        "UV_CACHE_DIR": f"{home}/.cache/uv",
    }
    env.update(configured)
    return env


def masks(hidden: Sequence[str]) -> tuple[bwrap.Mask, ...]:
    """The hidden paths that exist, as masks (by their path and their real path).

    One that does not exist has nothing to hide, and bwrap could not make a mount point for it
    inside a read-only bind (a config's `.bak` before the first save, in /etc/mcpvisor).
    """
    found = []
    for path in hidden:
        for each in dict.fromkeys((path, os.path.realpath(path))):
            if os.path.lexists(each):
                found.append(bwrap.Mask(path=each, directory=os.path.isdir(each)))
    return tuple(found)


def _hidden_files(hidden: Sequence[str]) -> list[str]:
    """The hidden paths that are not dirs (files, and ones that may appear later: a config's `.bak`),
    unless a hidden dir holds them, whose cover hides them too."""
    every = [each for path in hidden for each in dict.fromkeys((path, os.path.realpath(path)))]
    dirs = [path for path in every if os.path.isdir(path)]
    return [path for path in every if path not in dirs and not any(_inside(path, d) for d in dirs)]


def _shows_hidden_file(path: str, hidden_files: Sequence[str]) -> str | None:
    """Why a bind of `path` must be refused because a hidden file lies inside it (None: none does).

    A dir is covered inside a bind for good (a tmpfs on it), but a file is not: the host replaces
    it by a rename on every config save or key rotation, and the kernel then drops whatever was
    mounted on it, showing the new file (and, through a writable bind, letting it be rewritten).
    """
    real = os.path.realpath(path)
    for secret in hidden_files:
        if secret != real and _inside(secret, real):
            return (
                f"{path} holds {secret}, which no sandbox may see, and a file inside a bind cannot stay hidden "
                "(it is replaced on every save or rotation): bind a narrower path, or move the file out of it"
            )
    return None


def _readable_pipe(data: bytes) -> int:
    """A pipe's read end that holds `data` (bwrap copies it into a file of the sandbox)."""
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, data)
    finally:
        os.close(write_end)
    return read_end


def confine(
    plan: SandboxPlan,
    worker_id: str,
    executable: str,
    args: Sequence[str],
    env: Mapping[str, str],
    cwd: str | None,
    *,
    before: Sequence[Callable[[], None]] = (),
) -> Confined:
    """The command line that starts `executable` in the sandbox `plan` describes.

    `before` runs in the child first (joining the sandbox's cgroups).
    """
    tool = shutil.which("bwrap")
    if tool is None:
        raise SandboxError(f"the sandbox needs bwrap, which is not installed: {bwrap.FIX_INSTALL}")
    privileged = os.geteuid() == 0
    uid = plan.uid if privileged else None
    if privileged and uid is None:
        raise SandboxError("no sandbox uid was allocated for this worker (the supervisor hands one out as root)")
    features = bwrap.features(tool)
    fds: list[int] = []
    try:
        return _confine(plan, executable, args, env, cwd, tool, privileged, uid, features, fds, before)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _confine(
    plan: SandboxPlan,
    executable: str,
    args: Sequence[str],
    env: Mapping[str, str],
    cwd: str | None,
    tool: str,
    privileged: bool,
    uid: int | None,
    features: frozenset[str],
    fds: list[int],
    before: Sequence[Callable[[], None]],
) -> Confined:
    places = pathfd.compile_places([*plan.writable, *plan.rw, plan.home])
    hidden_files = _hidden_files(plan.hidden)
    wanted: list[tuple[str, str, bool, bool]] = []  # (path, dest, writable, the operator's)
    refused: list[str] = []

    untrusted = writable_places(plan)
    for path in install_paths(executable, untrusted):
        wanted.append((path, "", False, False))
    for source, dest in argument_files(args, cwd, untrusted):
        wanted.append((source, dest, False, False))
    wanted += [(path, "", False, True) for path in plan.ro]
    wanted += [(path, "", True, True) for path in plan.rw]
    if cwd is not None and not any(_inside(cwd, path) for path, *_ in wanted):
        wanted.append((cwd, "", False, True))

    def refuse(why: str, operator: bool) -> None:
        if operator:
            raise SandboxError(f"sandbox bind refused: {why}")

    binds: list[bwrap.Bind] = []
    # Parents first, so each bind is checked against the ones it would be mounted inside.
    mounted: list[tuple[str, bool]] = [(bwrap.HOME, True)]
    for path, dest, writable, operator in sorted(wanted, key=lambda want: (want[1] or want[0]).count("/")):
        target = dest or path
        why = refused_bind(path, plan) or (refused_bind(dest, plan) if dest else None)
        why = why or pathfd.nesting_refused(target, mounted, places)
        if why is None:
            try:
                fd, real = pathfd.open_path(path, places)
            except pathfd.Refused as exc:
                why = str(exc)
            except OSError:
                if operator:
                    raise SandboxError(f"sandbox bind {path} does not exist on this host") from None
                continue
            else:
                fds.append(fd)
                why = refused_bind(real, plan) or _shows_hidden_file(real, hidden_files)
        if why is not None:
            refuse(why, operator)
            refused.append(why)
            continue
        # Bound from where it leads and shown where it was given: the masks of hidden paths are
        # matched against the source, and a symlink's own path would match none of them.
        binds.append(
            bwrap.Bind(
                source=real,
                dest=target if target != real else "",
                writable=writable,
                fd=fd if "--bind-fd" in features else None,
            )
        )
        mounted.append((target, writable))
    prepare_home(plan.home, uid, os.path.join(plan.data_dir, "sandboxes") if plan.data_dir else "")
    quota = False
    if plan.home_mb is not None and uid is not None:
        try:
            quota = home_quota.apply(plan.home, uid, plan.home_mb * 1024 * 1024)
        except OSError as exc:
            raise SandboxError(f"the home's project quota cannot be set ({exc.strerror or exc})") from None
    link = command_link(executable, binds)

    filter_fd = seccomp.filter_fd()
    fds.append(filter_fd)
    outbound: OutboundNetwork | None = None
    files: tuple[tuple[int, str], ...] = ()
    block_fd = None
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    report_child = child_end.detach()
    fds.append(report_child)
    if plan.network == "outbound":
        if (why := network.problem(privileged=privileged)) is not None:
            parent_end.close()
            raise SandboxError(why)
        resolv = _readable_pipe(network.resolv_conf())
        fds.append(resolv)
        files = ((resolv, "/etc/resolv.conf"),)
        block_fd, release = os.pipe()
        fds.append(block_fd)
        outbound = OutboundNetwork(release)
    spec = bwrap.SandboxSpec(
        system=bwrap.system_binds(),
        binds=tuple(binds),
        links=(link,) if link is not None else (),
        home=plan.home,
        tmpfs_bytes=plan.memory_mb * 1024 * 1024,
        masks=masks(plan.hidden),
        network=plan.network != "none",
        cwd=cwd,
        uid=uid,
        gid=uid,
        seccomp_fd=filter_fd,
        own_ipc=False,
        block_fd=block_fd,
        files=files,
        disable_userns="--disable-userns" in features,
    )
    argv = bwrap.bwrap_argv(spec, [executable, *args], privileged=privileged, bwrap=tool)
    error_read, error_write = os.pipe()
    fds.append(error_write)
    os.set_inheritable(error_read, False)
    steps = list(before)
    if privileged and uid is not None:
        steps.append(_cap_processes(plan.max_processes))
    child_plan = namespaces.Plan(
        memory_bytes=plan.memory_mb * 1024 * 1024,
        max_processes=plan.max_processes,
        privileged=privileged,
        outbound=plan.network == "outbound",
        blocked=network.blocked(private=plan.private_networks, host=network.host_addresses())
        if plan.network == "outbound"
        else (),
        report_fd=report_child,
        error_fd=error_write,
        before=steps,
    )
    return Confined(
        argv=argv,
        env=sandbox_env(env, executable),
        uid=uid,
        pass_fds=tuple(fds),
        prepare=lambda: namespaces.prepare(child_plan),
        refused=refused,
        outbound=outbound,
        error_fd=error_read,
        channel=parent_end,
        privileged=privileged,
        quota=quota,
    )


def _cap_processes(limit: int) -> Callable[[], None]:
    def cap() -> None:
        # The sandbox's uid is its own: the kernel counts its processes apart from everyone's.
        import resource

        resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))

    return cap


class OutboundNetwork:
    """pasta for one sandbox: started once the sandbox's namespace exists, stopped with it.

    `launch` spawns pasta from the calling thread: the kernel kills pasta when that thread's
    process dies (PR_SET_PDEATHSIG follows the thread that forked), so call it from the thread
    that outlives the sandbox (a worker's event loop), never a short-lived helper thread.
    """

    def __init__(self, release_fd: int) -> None:
        self.release_fd: int | None = release_fd
        self.process: subprocess.Popen[bytes] | None = None
        self._errors: typing.IO[bytes] | None = None

    def launch(self, found: namespaces.Namespaces | None) -> None:
        """Join pasta to the sandbox's network namespace (sent by the child before it exec'd bwrap)."""
        if found is None or found.net is None or found.net_owner is None:
            raise SandboxError("the sandbox's network namespace did not come")
        netns, userns = found.net, found.net_owner
        parent = os.getpid()
        self._errors = tempfile.TemporaryFile()  # noqa: SIM115 - pasta's stderr while it runs; closed by close()
        try:
            self.process = subprocess.Popen(
                network.pasta_argv(network.pasta() or "pasta", netns, userns),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=self._errors,
                pass_fds=(netns, userns),
                preexec_fn=lambda: lifetime.die_with_parent(parent),
                start_new_session=True,
                env={"PATH": os.defpath},
            )
        except OSError as exc:
            raise SandboxError(f"pasta cannot start ({exc.strerror or exc}): {network.FIX_PASTA}") from None

    def check(self, pid: int, waited: float, timeout: float = network.READY_TIMEOUT) -> bool:
        """Whether the sandbox's network is up (then its command is let run); raises when it never will be."""
        assert self.process is not None
        if network.is_ready(pid):
            assert self.release_fd is not None
            os.write(self.release_fd, b"1")
            os.close(self.release_fd)
            self.release_fd = None
            return True
        if self.process.poll() is not None:
            said = b""
            if self._errors is not None:
                self._errors.seek(0)
                said = self._errors.read(65536)
            lines = [line for line in said.decode(errors="replace").splitlines() if line.strip()]
            lines = [line for line in lines if "syslog" not in line]
            last = lines[-1] if lines else "no message"
            raise SandboxError(f"pasta could not give the sandbox its network: {last}")
        if waited > timeout:
            raise SandboxError(f"pasta did not bring the sandbox's network up within {timeout:g} s")
        return False

    async def start(self, pid: int, found: namespaces.Namespaces | None) -> None:
        """In a worker: launch pasta and wait (without blocking the loop) until the sandbox runs."""
        self.launch(found)
        started = time.monotonic()
        # Nothing announces the namespace's route but the kernel's table: it is polled.
        while not self.check(pid, time.monotonic() - started):  # noqa: ASYNC110
            await trio.sleep(0.005)

    def start_blocking(self, pid: int, found: namespaces.Namespaces | None) -> None:
        """The same, for a caller without an event loop."""
        self.launch(found)
        started = time.monotonic()
        while not self.check(pid, time.monotonic() - started):
            time.sleep(0.005)

    def close(self) -> None:
        """Stop pasta (the sandbox is gone or going) and drop what is left."""
        if self.release_fd is not None:
            os.close(self.release_fd)
            self.release_fd = None
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._errors is not None:
            self._errors.close()
            self._errors = None
