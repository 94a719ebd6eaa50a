"""Logging set-up shared by every mcpvisor process: one line per event."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO

import trio

from mcpvisor.wire.endpoints import private_dirs
from mcpvisor.wire.redaction import redact_secrets


class _Formatter(logging.Formatter):
    def formatException(self, ei: Any) -> str:
        # An exception's message may quote what failed: a URL with its token, a header.
        return redact_secrets(super().formatException(ei))


class OneLineFormatter(_Formatter):
    """`2026-01-01T12:00:00Z level process message`, tracebacks folded into the same record."""

    def __init__(self, process_name: str) -> None:
        super().__init__()
        self.process_name = process_name

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        level = record.levelname.lower()
        message = " | ".join(record.getMessage().splitlines())
        line = f"{stamp}.{int(record.msecs):03d}Z {level:7} {self.process_name}: {message}"
        if record.exc_info:
            line += " | " + " | ".join(self.formatException(record.exc_info).splitlines())
        return line


class JsonFormatter(_Formatter):
    """One JSON object per line, for the supervisor's structured log."""

    def __init__(self, process_name: str) -> None:
        super().__init__()
        self.process_name = process_name

    def format(self, record: logging.LogRecord) -> str:
        event = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "process": self.process_name,
            "msg": record.getMessage(),
        }
        event.update(getattr(record, "fields", {}))
        if record.exc_info:
            event["exc"] = self.formatException(record.exc_info)
        return json.dumps(event, default=str)


def setup(process_name: str, level: str = "info", *, structured: bool = False, json_file: Path | None = None) -> None:
    """Log to stderr, one line per event; and, with `json_file`, as JSON lines to a rotated file."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(process_name) if structured else OneLineFormatter(process_name))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    if json_file is not None:
        file_handler = RotatingHandler(RotatingFile(json_file))
        file_handler.setFormatter(JsonFormatter(process_name))
        root.addHandler(file_handler)
    root.setLevel(level.upper())
    # The SDK and HTTP stacks are chatty at INFO about every request.
    for name in ("httpx", "httpx2", "mcp", "hypercorn.access", "mcp.server.lowlevel.server"):
        logging.getLogger(name).setLevel(logging.WARNING)


class RotatingFile:
    """An append-only log file rotated by size: `name.log`, `name.log.1`, … `name.log.N`."""

    def __init__(self, path: Path, *, max_bytes: int = 10 * 1024 * 1024, backups: int = 3) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        private_dirs(path.parent)
        self._file = _open_private(path)
        self._size = self._file.tell()

    def write(self, data: bytes) -> None:
        if self._size + len(data) > self.max_bytes and self._size > 0:
            self.rotate()
        self._file.write(data)
        self._size += len(data)

    def rotate(self) -> None:
        self._file.close()
        for index in range(self.backups, 0, -1):
            source = self.path.with_name(f"{self.path.name}.{index - 1}") if index > 1 else self.path
            if source.exists():
                os.replace(source, self.path.with_name(f"{self.path.name}.{index}"))
        self._file = _open_private(self.path)
        self._size = 0

    def close(self) -> None:
        self._file.close()


def _open_private(path: Path) -> BinaryIO:
    """Open a log file for appending, 0600 (log lines may name what a client asked).

    A file an earlier version left readable by others is narrowed too.
    """
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.fchmod(fd, 0o600)
    return open(fd, "ab", buffering=0)


class RotatingHandler(logging.Handler):
    """A logging handler writing one formatted line per record to a RotatingFile."""

    def __init__(self, sink: RotatingFile) -> None:
        super().__init__()
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.sink.write(self.format(record).encode() + b"\n")
        except (OSError, ValueError):
            self.handleError(record)


async def pump(stream: trio.abc.ReceiveStream, sink: RotatingFile) -> None:
    """Copy a child's output into a rotating file until the child closes it."""
    try:
        while chunk := await stream.receive_some(65536):
            sink.write(chunk)
    except (trio.ClosedResourceError, trio.BrokenResourceError):
        pass
    finally:
        await stream.aclose()


def tail_lines(path: Path, lines: int) -> list[str]:
    """The last `lines` lines of a log file (reading from the end, not the whole file)."""
    if lines <= 0 or not path.exists():
        return []
    with open(path, "rb") as file:
        file.seek(0, os.SEEK_END)
        end = file.tell()
        block = 8192
        data = b""
        while end > 0 and data.count(b"\n") <= lines:
            start = max(0, end - block)
            file.seek(start)
            data = file.read(end - start) + data
            end = start
    return [line.decode("utf-8", "replace") for line in data.splitlines()[-lines:]]


def log_stem(worker: str) -> str:
    """A worker id as a file name: `github`, or `alice@github` for tenant alice's worker of github."""
    return worker.replace("/", "@")
