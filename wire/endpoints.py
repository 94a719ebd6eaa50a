"""Where the sockets live: ipc paths in a private runtime directory."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path


def runtime_dir(data_dir: Path) -> Path:
    """The 0700 directory for sockets: systemd's, else the user's runtime dir, else under data_dir."""
    if (rd := os.environ.get("RUNTIME_DIRECTORY")) is not None:
        base = Path(rd.split(":")[0])
    elif (xdg := os.environ.get("XDG_RUNTIME_DIR")) is not None:
        base = Path(xdg) / "mcpvisor"
    else:
        base = data_dir / "run"
    return base


def ensure_private_dir(path: Path) -> Path:
    """Create `path` with mode 0700, and refuse one that others can enter."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


def private_dirs(path: Path) -> None:
    """Create `path` and each missing parent with mode 0700; directories that exist are left as they are."""
    missing: list[Path] = []
    while not path.exists():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=0o700)


@dataclass(frozen=True)
class Endpoints:
    """The three sockets of one mcpvisor instance."""

    calls: str  # frontend ROUTER, workers connect
    control: str  # supervisor ROUTER, ctl/frontend/workers connect
    events: str  # supervisor PUB

    @classmethod
    def in_dir(cls, directory: Path) -> Endpoints:
        return cls(
            calls=f"ipc://{directory / 'calls.sock'}",
            control=f"ipc://{directory / 'control.sock'}",
            events=f"ipc://{directory / 'events.sock'}",
        )
