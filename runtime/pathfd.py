"""Open a host path for a bind without following anything a sandbox can write.

An operator's bind may go through symlinks (`/srv -> /data/srv`), and those are followed: the
operator made them. But below a place some sandbox can write (an `rw` bind of any sandbox, any
sandbox's home), every name is the sandbox's to replace: a directory swapped for a symlink
(`cache -> ../..`) would make the next start bind whatever it points at. So the walk resolves the
part outside such places component by component, following symlinks, and opens the part inside
with `openat2(RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_BENEATH)` from the fd of the
place itself (or, on a kernel older than 5.6, one `O_NOFOLLOW` step at a time): a symlink there is
refused, never followed. The result is an `O_PATH` fd that bwrap binds (`--bind-fd`), so nothing
renamed over the path after this check changes what is mounted.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import stat
import struct
from collections.abc import Sequence

from mcpvisor.wire.sandboxing import SandboxPlan, describe, refused_bind

_SYS_OPENAT2 = 437  # the same number on every architecture (new calls share one table)
_RESOLVE_NO_MAGICLINKS, _RESOLVE_NO_SYMLINKS, _RESOLVE_BENEATH = 0x02, 0x04, 0x08
_MAX_LINKS = 40

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class Refused(Exception):
    """The path leads through a symlink in a place a sandbox can write; the message says where."""


def _compile(place: str) -> re.Pattern[str]:
    """A writable place as a pattern of itself and everything below; `{tenant}` is any one name."""
    parts = [re.escape(part).replace(re.escape("{tenant}"), "[^/]+") for part in place.split("/") if part]
    return re.compile("/" + "/".join(parts) + "(?:/.*)?" if parts else "/.*")


def compile_places(places: Sequence[str]) -> list[re.Pattern[str]]:
    """Patterns for `places`, as given and with the part before any `{tenant}` resolved (`/srv -> /data/srv`)."""
    found: list[str] = []
    for place in places:
        parts = [part for part in place.split("/") if part]
        fixed = next((n for n, part in enumerate(parts) if "{tenant}" in part), len(parts))
        real = os.path.realpath("/" + "/".join(parts[:fixed]))
        found += [place, os.path.join(real, *parts[fixed:])]
    return [_compile(place) for place in dict.fromkeys(found)]


def _writable(path: str, places: Sequence[re.Pattern[str]], roots: Sequence[str]) -> bool:
    return any(place.fullmatch(path) for place in places) or any(
        path == root or path.startswith(root.rstrip("/") + "/") for root in roots
    )


def _openat2(directory: int, path: str) -> int:
    how = struct.pack(
        "=QQQ", os.O_PATH | os.O_CLOEXEC, 0, _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS | _RESOLVE_BENEATH
    )
    buffer = ctypes.create_string_buffer(how, len(how))
    fd = _libc.syscall(_SYS_OPENAT2, directory, os.fsencode(path), buffer, len(how))
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return int(fd)


def _open_strictly(directory: int, rest: list[str]) -> int:
    """Open `rest` below `directory`, refusing every symlink on the way."""
    try:
        return _openat2(directory, "/".join(rest) or ".")
    except OSError as exc:
        if exc.errno != errno.ENOSYS:
            raise
    fd = os.dup(directory)
    for name in rest:
        try:
            child = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        finally:
            os.close(fd)
        fd = child
        if stat.S_ISLNK(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name)
    return fd


_TAINT = "\0"  # in the queue of names: the symlink just followed sat in a writable place


def open_path(path: str, places: Sequence[re.Pattern[str]]) -> tuple[int, str]:
    """An O_PATH fd of `path` and the real path it names (see the module's docstring).

    Raises `Refused` for a symlink inside a writable place, OSError when the path does not exist.
    """
    if not os.path.isabs(path):
        raise ValueError(f"not an absolute path: {path}")
    pending = [part for part in path.split("/") if part]
    resolved: list[str] = []
    roots: list[str] = []  # where a symlink from a writable place led: as writable as the place
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    links = 0
    try:
        while pending:
            here = "/" + "/".join(resolved)
            if _writable(here, places, roots):
                rest = [name for name in pending if name not in (_TAINT, ".")]
                if ".." in rest:
                    raise Refused(f"{path}: '..' below {here}, which a sandbox can write")
                try:
                    inner = _open_strictly(fd, rest)
                except OSError as exc:
                    if exc.errno == errno.ELOOP:
                        raise Refused(
                            f"{path} leads through a symlink below {here}, which a sandbox can write: not followed"
                        ) from None
                    raise
                os.close(fd)
                return inner, os.path.join(here, *rest)
            name = pending.pop(0)
            if name == _TAINT:
                roots.append(here)
                continue
            if name == ".":
                continue
            if name == "..":
                if resolved:
                    resolved.pop()
                os.close(fd)
                fd = os.open("/" + "/".join(resolved), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                continue
            child = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            if stat.S_ISLNK(os.fstat(child).st_mode):
                # In a dir no sandbox can write: the operator's (or the system's) link, followed. Where
                # the link itself names a writable place (`/srv/teams/alice -> /data/alice`), where it
                # leads is writable as well.
                target = os.readlink(name, dir_fd=fd)
                os.close(child)
                links += 1
                if links > _MAX_LINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
                tainted = [_TAINT] if _writable(os.path.join(here, name), places, roots) else []
                pending = [part for part in target.split("/") if part] + tainted + pending
                if target.startswith("/"):
                    resolved = []
                    os.close(fd)
                    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                continue
            os.close(fd)
            fd = child
            resolved.append(name)
        return fd, "/" + "/".join(resolved)
    except BaseException:
        os.close(fd)
        raise


def _inside(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def nesting_refused(dest: str, mounted: Sequence[tuple[str, bool]], places: Sequence[re.Pattern[str]]) -> str | None:
    """Why a bind at `dest` may not be mounted inside the binds `mounted` ((dest, writable) each), or None.

    bwrap walks a destination's path inside the sandbox as it stands, following symlinks, and makes
    missing dirs there. Inside another bind whose dir a sandbox can write (this one's `rw`, or a
    place any sandbox writes), that path can be swapped for a symlink between mcpvisor's check and
    bwrap's mount, leading the mount (and a mkdir) anywhere. A bind nested there is refused: in a
    writable bind it adds nothing but a redirect (rw) or a read-only view the sandbox can rename
    away (ro). Nested in a read-only bind of a place no sandbox writes, it is mounted after its
    parent and keeps its own mode.
    """
    parent = dest.rsplit("/", 1)[0] or "/"
    for outer, writable in mounted:
        if outer == dest or not _inside(parent, outer):
            continue
        if writable:
            return f"{dest} lies inside the writable bind {outer}, where the sandbox could redirect it"
        if any(place.fullmatch(parent) for place in places):
            return f"{dest} lies inside {parent}, which a sandbox can write, where it could be redirected"
    return None


def operator_binds(plan: SandboxPlan) -> tuple[list[tuple[str, bool]], list[str]]:
    """The operator's `ro`/`rw` binds as they would be mounted now, parents first, and those refused (why).

    What `ctl inspect` shows: the checks workers.confine makes at each start, without keeping fds.
    """
    places = compile_places([*plan.writable, *plan.rw, plan.home])
    wanted = [(path, False) for path in plan.ro] + [(path, True) for path in plan.rw]
    mounted: list[tuple[str, bool]] = []
    refused: list[str] = []
    for path, writable in sorted(wanted, key=lambda want: want[0].count("/")):
        why = refused_bind(path, plan) or nesting_refused(path, mounted, places)
        if why is None:
            try:
                fd, _real = open_path(path, places)
            except Refused as exc:
                why = str(exc)
            except OSError as exc:
                why = f"{path}: {exc.strerror or exc}"
            else:
                os.close(fd)
        if why is not None:
            refused.append(why)
        else:
            mounted.append((path, writable))
    return mounted, refused


def describe_sandbox(plan: SandboxPlan | None) -> dict[str, object]:
    """`wire.sandboxing.describe`, with the binds as they would be mounted on this host now."""
    if plan is None:
        return describe(None)
    mounted, refused = operator_binds(plan)
    shown = describe(plan, refused)
    shown["read_only"] = [*shown["read_only"][:2], *(path for path, writable in mounted if not writable)]  # type: ignore[index]
    shown["writable"] = [*shown["writable"][:2], *(path for path, writable in mounted if writable)]  # type: ignore[index]
    return shown
