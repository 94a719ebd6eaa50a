"""`tail [-f] NAME [worker|stderr]`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import msgspec

from mcpvisor.runtime.logs import log_stem, tail_lines
from mcpvisor.supervisor.commands import EXIT_UNKNOWN, EXIT_USAGE, Args, CommandError, command
from mcpvisor.wire.redaction import redact_secrets

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor

_MAX_CHUNK = 1024 * 1024  # a follower that fell far behind gets the newest megabyte
MAX_LINES = 100_000


def log_files(sup: Supervisor, name: str) -> dict[str, Path]:
    """The log files of a process: the worker's own, and the upstream's stderr."""
    if name == "frontend":
        return {"frontend": sup.log_dir / "frontend.log"}
    if name not in sup.worker_ids():
        raise CommandError(f"{name}: no such server", EXIT_UNKNOWN)
    stem = log_stem(name)
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


class TailArgs(Args):
    name: str
    stream: str | None = None
    lines: Annotated[int, msgspec.Meta(ge=0, le=MAX_LINES)] = 40
    offsets: dict[str, Annotated[int, msgspec.Meta(ge=0)]] | None = msgspec.field(default=None, name="from")


@command(
    "tail",
    args=TailArgs,
    options={"-n": "lines", "--lines": "lines", "--from": "from"},
    usage="tail [-f] NAME [worker|stderr] [-n LINES]",
    render=render,
)
async def tail(sup: Supervisor, args: TailArgs) -> dict[str, Any]:
    """Show the end of a server's logs: the worker's log and the upstream's stderr (or one of them).

    `-f` follows them. `tail frontend` shows the frontend's log. `-n` (at most 100000) sets how many
    lines.
    """
    files = log_files(sup, args.name)
    if args.stream is not None:
        if args.stream not in files:
            raise CommandError(f"{args.name} has no {args.stream!r} log (choose from {', '.join(files)})", EXIT_USAGE)
        files = {args.stream: files[args.stream]}
    streams = []
    for label, path in files.items():
        if args.offsets is None:
            text = "\n".join(tail_lines(path, args.lines))
            size = path.stat().st_size if path.exists() else 0
        else:
            text, size = read_from(path, args.offsets.get(label, 0))
        # An upstream may print a credential to its stderr; no listing shows one.
        streams.append({"stream": label, "path": str(path), "text": redact_secrets(text), "offset": size})
    return {"name": args.name, "streams": streams, "follow": args.offsets is not None}
