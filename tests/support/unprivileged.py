"""Run a command as a container runs mcpvisor: an unprivileged uid with no_new_privs and no capability.

The deploy files run mcpvisor as UID 10001. Tests run as root here, and this checkout's Python may
live where no other user can enter (a pyenv install under /root, mode 0700). `as_container_user`
wraps a command so that it runs in a private mount namespace where the closed ancestor of each
needed path is covered by an empty, enterable tmpfs with the needed path bound back into it, then
drops to the uid with `setpriv`. Nothing on the host changes: the mounts live and die with the
command.
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

CONTAINER_UID = 10001


def missing_tools() -> str | None:
    """Why the emulation cannot run here (a skip reason), or None."""
    if os.geteuid() != 0:
        return "needs root to emulate a container's unprivileged user (a private mount namespace)"
    for tool, package in (("unshare", "util-linux"), ("setpriv", "util-linux"), ("mount", "mount")):
        if shutil.which(tool) is None:
            return f"system package missing: {package}"
    return None


def _closed_ancestor(path: Path) -> tuple[Path, Path] | None:
    """(the first ancestor others cannot enter, its child on the way to `path`), or None."""
    parts = path.parts
    for depth in range(2, len(parts)):
        ancestor = Path(*parts[:depth])
        if not os.stat(ancestor).st_mode & stat.S_IXOTH:
            return ancestor, Path(*parts[: depth + 1])
    return None


def python_paths() -> list[Path]:
    """What this checkout's interpreter needs: its install prefix and the virtualenv."""
    return [Path(os.path.realpath(sys.base_prefix)), Path(sys.prefix)]


def as_container_user(
    command: Sequence[str], stash: Path, *, readable: Iterable[Path] = (), uid: int = CONTAINER_UID
) -> list[str]:
    """The argv that runs `command` as `uid`, no_new_privs, no capability, with `readable` reachable.

    `stash` is an empty root-owned dir that holds the bind mounts' sources.
    """
    keeps: dict[Path, Path] = {}  # needed path (the closed ancestor's child) -> its cover
    for path in [*python_paths(), *readable]:
        found = _closed_ancestor(path)
        if found is not None:
            keeps[found[1]] = found[0]
    q = shlex.quote
    lines = ["set -eu"]
    for n, keep in enumerate(keeps):
        lines += [f"mkdir -p {q(str(stash / str(n)))}", f"mount --bind {q(str(keep))} {q(str(stash / str(n)))}"]
    for cover in dict.fromkeys(keeps.values()):
        lines.append(f"mount -t tmpfs -o mode=0755 tmpfs {q(str(cover))}")
    for n, keep in enumerate(keeps):
        lines += [f"mkdir -p {q(str(keep))}", f"mount --bind {q(str(stash / str(n)))} {q(str(keep))}"]
    drop = f"setpriv --reuid={uid} --regid={uid} --clear-groups --no-new-privs --inh-caps=-all --bounding-set=-all"
    lines.append(f'exec {drop} -- "$@"')
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", "\n".join(lines), "sh", *command]
