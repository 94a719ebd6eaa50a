"""List results built once per change of what clients see, and served as bytes.

A listing of 10,000 tools costs tens of milliseconds to gather (visibility, pins, exposed names)
and more to encode: doing it for every page of every client's listing made a full listing cost a
second. A `Listing` gathers the items once per `version` (which changes whenever the catalog, the
pins or the config do) and encodes each page once per era, so a page is then a lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import msgspec

from mcpvisor.frontend.endpoints.eras import is_modern, tool_definitions
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
        self._pages: dict[tuple[str | None, bool], bytes] = {}

    def items(self) -> list[dict[str, Any]]:
        """Every item, as clients may see them now (the list is shared: do not change it)."""
        version = self._version()
        if version != self._built:
            self._items = self._gather()
            self._pages = {}
            self._built = version
        return self._items

    def result(self, cursor: str | None, version: str) -> bytes:
        """The list result at `cursor` for a client of protocol `version`, as JSON (the era's own
        members are added by the engine); RpcError for a cursor not issued here."""
        items = self.items()
        modern = is_modern(version)
        cached = self._pages.get((cursor, modern))
        if cached is not None:
            return cached
        chunk, next_cursor = page(self.kind, items, cursor, self._page_size)
        if self.kind == "tools/list":
            chunk = tool_definitions(chunk, version)
        body: dict[str, Any] = {self.field: chunk}
        if next_cursor is not None:
            body["nextCursor"] = next_cursor
        built = _encode(body)
        self._pages[cursor, modern] = built
        return built
