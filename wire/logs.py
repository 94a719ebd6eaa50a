"""Logging set-up shared by every mcpvisor process: one line per event."""

from __future__ import annotations

import json
import logging
import sys
import time


class OneLineFormatter(logging.Formatter):
    """`2026-01-01T12:00:00Z level process message`, tracebacks folded into the same record."""

    def __init__(self, process_name: str) -> None:
        super().__init__()
        self.process_name = process_name

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        level = record.levelname.lower()
        line = f"{stamp}.{int(record.msecs):03d}Z {level:7} {self.process_name}: {record.getMessage()}"
        if record.exc_info:
            line += " | " + self.formatException(record.exc_info).replace("\n", " | ")
        return line


class JsonFormatter(logging.Formatter):
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


def setup(process_name: str, level: str = "info", *, structured: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(process_name) if structured else OneLineFormatter(process_name))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The SDK and HTTP stacks are chatty at INFO about every request.
    for name in ("httpx", "httpx2", "mcp", "hypercorn.access", "mcp.server.lowlevel.server"):
        logging.getLogger(name).setLevel(logging.WARNING)
