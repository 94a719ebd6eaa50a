"""An upstream's stdout cut into lines, each at most `limit` bytes held.

A stdio upstream writes one JSON-RPC message per line, and a line can be tens of megabytes (a
tool's large result). Pieces are kept in a list and joined once, when the line ends, so reading
a line costs its length, not its length squared. A line that grows past `limit` is not kept: it
is counted as it streams by, only its first and last few bytes are held, and when it ends it is
reported as `Oversized` with its size and the request id found at either end, so the request it
answers fails with a clear error and the upstream lives on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HEAD = 4096
_TAIL = 4096
_ID = rb'("(?:[^"\\]|\\.){0,200}"|-?\d{1,20})'
# `{"jsonrpc":"2.0","id":7,"result":...}`: the id comes first (the Python SDK)...
_ID_FIRST = re.compile(rb'^\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*' + _ID)
# ...or last: `{"result":...,"jsonrpc":"2.0","id":7}` (the TypeScript SDK), or just before jsonrpc.
_ID_LAST = re.compile(rb'"id"\s*:\s*' + _ID + rb'\s*(?:,\s*"jsonrpc"\s*:\s*"2\.0"\s*)?\}\s*$')


@dataclass(frozen=True)
class Oversized:
    """A line longer than the limit, dropped as it streamed by."""

    size: int
    request_id: int | str | None  # what it answers, when its id could be found at either end


def _request_id(token: bytes) -> int | str:
    return int(token) if not token.startswith(b'"') else token[1:-1].decode("utf-8", "replace")


class LineReader:
    """Feed chunks of a byte stream; get back its complete lines (without the newline)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._parts: list[bytes] = []
        self._size = 0
        self._head = b""  # the first bytes of a line over the limit
        self._tail = b""  # and its last bytes, so far
        self._over = False

    @property
    def pending(self) -> int:
        """Bytes of the unfinished line read so far."""
        return self._size

    def feed(self, chunk: bytes) -> list[bytes | Oversized]:
        lines: list[bytes | Oversized] = []
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            self._add(chunk[start:end])
            lines.append(self._finish())
            start = end + 1
        if start < len(chunk):
            self._add(chunk[start:] if start else chunk)
        return lines

    def _add(self, piece: bytes) -> None:
        if not piece:
            return
        self._size += len(piece)
        if self._over:
            self._tail = (self._tail + piece[-_TAIL:])[-_TAIL:]
            return
        self._parts.append(piece)
        if self._size > self.limit:
            # From now on the line is only counted: keep its two ends, let the rest go.
            joined_head = b""
            for part in self._parts:
                joined_head += part[: _HEAD - len(joined_head)]
                if len(joined_head) >= _HEAD:
                    break
            tail = b""
            for part in reversed(self._parts):
                tail = part[-(_TAIL - len(tail)) :] + tail
                if len(tail) >= _TAIL:
                    break
            self._head, self._tail, self._parts, self._over = joined_head, tail, [], True

    def _finish(self) -> bytes | Oversized:
        if self._over:
            found = _ID_FIRST.match(self._head) or _ID_LAST.search(self._tail)
            line: bytes | Oversized = Oversized(self._size, _request_id(found.group(1)) if found else None)
        else:
            line = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
        self._parts, self._size, self._head, self._tail, self._over = [], 0, b"", b"", False
        return line
