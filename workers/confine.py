"""An upstream's command put in its sandbox: the binds it needs, its home, its uid, its environment.

The plan (wire.sandboxing) says what the config allows; this module looks at the host to find
what the command itself needs to run (its install prefix, a virtualenv's base interpreter, the
script it is given) and hands everything to runtime.bwrap, which builds the command line.
"""

from __future__ import annotations

import os
import pwd
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mcpvisor.runtime import bwrap
from mcpvisor.wire.sandboxing import SandboxPlan, refused_bind, sandbox_uid

# System dirs bound already: a prefix inside them needs no bind of its own.
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class SandboxError(Exception):
    """A sandbox that is required cannot be built; the message names the fix."""


@dataclass(frozen=True)
class Confined:
    """The command as it starts: bwrap's argv, the environment bwrap hands on, the sandbox's uid."""

    argv: list[str]
    env: dict[str, str]
    uid: int | None


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


def _uid_map() -> list[tuple[int, int]]:
    try:
        with open("/proc/self/uid_map") as mapping:
            return [(int(inner), int(count)) for inner, _outer, count in (line.split() for line in mapping)]
    except (OSError, ValueError):
        return [(0, 1 << 32)]


def prepare_home(home: str, uid: int | None) -> None:
    """Create the sandbox's home (owned by its uid); its parents stay mcpvisor's own (0700).

    Mode 0711: bwrap enters it (--chdir) as root without capabilities, before the uid switch; no
    one else reaches it, its parents being closed.
    """
    os.makedirs(os.path.dirname(home), mode=0o700, exist_ok=True)
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


def confine(
    plan: SandboxPlan,
    worker_id: str,
    executable: str,
    args: Sequence[str],
    env: Mapping[str, str],
    cwd: str | None,
) -> Confined:
    """The command line that starts `executable` in the sandbox `plan` describes."""
    tool = shutil.which("bwrap")
    if tool is None:
        raise SandboxError(f"the sandbox needs bwrap, which is not installed: {bwrap.FIX_INSTALL}")
    privileged = os.geteuid() == 0
    uid = sandbox_uid(worker_id, _uid_map()) if privileged else None
    binds: list[bwrap.Bind] = []
    hidden_files = _hidden_files(plan.hidden)

    def add(path: str, *, writable: bool, operator: bool, dest: str = "") -> None:
        why = refused_bind(os.path.realpath(path), plan) or refused_bind(path, plan)
        if dest and why is None:
            why = refused_bind(dest, plan)
        if why is None:
            why = _shows_hidden_file(path, hidden_files)
        if why is not None:
            if operator:
                raise SandboxError(f"sandbox bind refused: {why}")
            return
        if not os.path.exists(path):
            if operator:
                raise SandboxError(f"sandbox bind {path} does not exist on this host")
            return
        # Bound from where it leads and shown where it was given: the masks of hidden paths are
        # matched against the source, and a symlink's own path would match none of them.
        source, target = os.path.realpath(path), dest or path
        binds.append(bwrap.Bind(source=source, dest=target if target != source else "", writable=writable))

    untrusted = writable_places(plan)
    for path in install_paths(executable, untrusted):
        add(path, writable=False, operator=False)
    for source, dest in argument_files(args, cwd, untrusted):
        add(source, writable=False, operator=False, dest=dest)
    for path in plan.ro:
        add(path, writable=False, operator=True)
    for path in plan.rw:
        add(path, writable=True, operator=True)
    if cwd is not None and not any(_inside(cwd, bind.target) for bind in binds):
        add(cwd, writable=False, operator=True)
    prepare_home(plan.home, uid)
    link = command_link(executable, binds)
    spec = bwrap.SandboxSpec(
        system=bwrap.system_binds(),
        binds=tuple(binds),
        links=(link,) if link is not None else (),
        home=plan.home,
        tmpfs_bytes=plan.memory_mb * 1024 * 1024,
        masks=masks(plan.hidden),
        network=plan.network,
        cwd=cwd,
        uid=uid,
        gid=uid,
    )
    argv = bwrap.bwrap_argv(spec, [executable, *args], privileged=privileged, bwrap=tool)
    return Confined(argv=argv, env=sandbox_env(env, executable), uid=uid)
