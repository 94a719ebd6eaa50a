"""List results built once per change of what clients see, and served as bytes.

A listing of 10,000 tools costs tens of milliseconds to gather (visibility, pins, exposed names)
and more to validate and encode: doing it for every page of every client's listing made a full
listing cost a second. A `Listing` gathers the items once per `version` (which changes whenever
the catalog, the pins or the config do) and encodes each page once, so a page is then a lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import msgspec
from mcp.shared.exceptions import MCPError
from mcp_types.methods import serialize_server_result
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from mcpvisor.frontend.endpoints.pages import page

_encode = msgspec.json.encode


class Listing:
    """One list method's items and pages, rebuilt when `version()` changes."""

    def __init__(
        self,
        kind: str,
        field: str,
        gather: Callable[[], list[dict[str, Any]]],
        version: Callable[[], Hashable],
        page_size: int,
    ) -> None:
        self.kind = kind
        self.field = field
        self._gather = gather
        self._version = version
        self._page_size = page_size
        self._built: Hashable = object()  # no version matches it: built on first use
        self._items: list[dict[str, Any]] = []
        self._pages: dict[tuple[str | None, str], tuple[bytes, str | None]] = {}

    def items(self) -> list[dict[str, Any]]:
        """Every item, as clients may see them now (the list is shared: do not change it)."""
        version = self._version()
        if version != self._built:
            self._items = self._gather()
            self._pages = {}
            self._built = version
        return self._items

    def page(self, cursor: str | None, version: str) -> tuple[bytes, str | None] | None:
        """The page at `cursor` as a JSON array, as a client of protocol `version` gets it, and the
        next cursor; None for a cursor not issued here (or items the SDK would refuse)."""
        items = self.items()
        cached = self._pages.get((cursor, version))
        if cached is not None:
            return cached
        try:
            chunk, next_cursor = page(self.kind, items, cursor, self._page_size)
        except MCPError:
            return None  # the SDK's path explains a bad cursor
        # What the SDK's server sends a client of `version`: the same check and sieve, once per page.
        shape: dict[str, Any] = {self.field: chunk}
        if version in MODERN_PROTOCOL_VERSIONS:
            shape.update(resultType="complete", cacheScope="private", ttlMs=0)
        try:
            sieved = serialize_server_result(self.kind, version, shape)
        except (ValidationError, KeyError):
            return None  # the SDK's path answers (and logs) what it cannot send
        built = (_encode(sieved[self.field]), next_cursor)
        self._pages[cursor, version] = built
        return built

    def result(self, cursor: str | None, version: str, *, prefix: bytes = b"", suffix: bytes = b"") -> bytes | None:
        """`{prefix"field":[...],"nextCursor":...suffix}`: a list result around the cached page."""
        found = self.page(cursor, version)
        if found is None:
            return None
        chunk, next_cursor = found
        body = b"{" + prefix + b'"' + self.field.encode() + b'":' + chunk
        if next_cursor is not None:
            body += b',"nextCursor":' + _encode(next_cursor)
        return body + suffix + b"}"
