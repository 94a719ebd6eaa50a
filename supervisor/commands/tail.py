"""`tail [-f] NAME [worker|stderr]`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from mcpvisor.supervisor.commands import EXIT_UNKNOWN, CommandError, command
from mcpvisor.wire.logs import tail_lines

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor

_MAX_CHUNK = 1024 * 1024  # a follower that fell far behind gets the newest megabyte


def log_files(sup: Supervisor, name: str) -> dict[str, Path]:
    """The log files of a process: the worker's own, and the upstream's stderr."""
    if name == "frontend":
        return {"frontend": sup.log_dir / "frontend.log"}
    if name not in sup.config.servers:
        raise CommandError(f"{name}: no such server", EXIT_UNKNOWN)
    stem = name.replace("/", ".")
    return {"worker": sup.log_dir / f"{stem}.worker.log", "stderr": sup.log_dir / f"{stem}.stderr.log"}


def read_from(path: Path, offset: int) -> tuple[str, int]:
    """What was appended since `offset` (from the start again if the file was rotated)."""
    if not path.exists():
        return "", 0
    size = path.stat().st_size
    if offset > size:
        offset = 0
    offset = max(offset, size - _MAX_CHUNK)
    with open(path, "rb") as file:
        file.seek(offset)
        data = file.read(size - offset)
    return data.decode("utf-8", "replace"), size


def render(result: dict[str, Any]) -> str:
    streams = result["streams"]
    parts = []
    for stream in streams:
        text = stream["text"]
        if len(streams) > 1 and text and not result.get("follow"):
            parts.append(f"==> {result['name']} {stream['stream']} <==")
        if text:
            parts.append(text.rstrip("\n"))
    return "\n".join(parts)


@command("tail", usage="tail [-f] NAME [worker|stderr] [-n LINES]", render=render)
async def tail(sup: Supervisor, args: list[str], data: Any) -> dict[str, Any]:
    """Show the end of a server's logs: the worker's log and the upstream's stderr (or one of them).

    `-f` follows them. `tail frontend` shows the frontend's log.
    """
    lines = 40
    offsets: dict[str, int] | None = None
    names = []
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg in ("-n", "--lines") and rest:
            lines = int(rest.pop(0))
        elif arg == "--from" and rest:
            offsets = {k: int(v) for k, v in (item.split("=", 1) for item in rest.pop(0).split(",") if "=" in item)}
        else:
            names.append(arg)
    if not names:
        raise CommandError("usage: tail [-f] NAME [worker|stderr]")
    files = log_files(sup, names[0])
    if len(names) > 1:
        if names[1] not in files:
            raise CommandError(f"{names[0]} has no {names[1]!r} log (choose from {', '.join(files)})")
        files = {names[1]: files[names[1]]}
    streams = []
    for label, path in files.items():
        if offsets is None:
            text = "\n".join(tail_lines(path, lines))
            size = path.stat().st_size if path.exists() else 0
        else:
            text, size = read_from(path, offsets.get(label, 0))
        streams.append({"stream": label, "path": str(path), "text": text, "offset": size})
    return {"name": names[0], "streams": streams, "follow": offsets is not None}
