"""Large tool results: cut to `tool_response_limit` characters, the whole text kept for `read_cache`.

The cache is in memory, bounded in total size (oldest entries go first) and forgets an entry
`ttl` seconds after it was stored.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from mcpvisor.frontend.tool_args import (
    ToolInputError,
    check_parameters,
    get_integer,
    get_string,
)

READ_CACHE_TOOL_NAME: Final = "read_cache"
DEFAULT_TTL: Final = 600.0
DEFAULT_MAX_CHARS: Final = 64 * 1024 * 1024
# The page size of read_cache when tool_response_limit is 0 (no cutting) and no limit is given.
DEFAULT_PAGE: Final = 20000
MAX_PAGE: Final = 1_000_000
TRUNCATION_META: Final = "mcpvisor/truncated"


class CacheMiss(Exception):
    """No entry under a key: never stored, expired or evicted."""


@dataclass(frozen=True, slots=True)
class Page:
    """A slice of a cached text."""

    key: str
    offset: int
    text: str
    total: int

    @property
    def next_offset(self) -> int | None:
        end = self.offset + len(self.text)
        return end if end < self.total else None


@dataclass(slots=True)
class _Entry:
    text: str
    stored_at: float


class ResponseCache:
    """Texts by random key, each kept for `ttl` seconds, at most `max_chars` characters in all."""

    def __init__(
        self,
        *,
        ttl: float = DEFAULT_TTL,
        max_chars: int = DEFAULT_MAX_CHARS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl = ttl
        self.max_chars = max_chars
        self._clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # oldest first
        self._chars = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def total_chars(self) -> int:
        return self._chars

    def put(self, text: str) -> str | None:
        """Keep `text` and return its key; None when it alone is larger than the whole cache."""
        if len(text) > self.max_chars:
            return None
        self._expire()
        while self._entries and self._chars + len(text) > self.max_chars:
            _, evicted = self._entries.popitem(last=False)
            self._chars -= len(evicted.text)
        key = secrets.token_hex(8)
        self._entries[key] = _Entry(text, self._clock())
        self._chars += len(text)
        return key

    def read(self, key: str, offset: int = 0, limit: int = DEFAULT_PAGE) -> Page:
        """Up to `limit` characters of the text under `key` from `offset`; CacheMiss if it is gone."""
        self._expire()
        entry = self._entries.get(key)
        if entry is None:
            raise CacheMiss(key)
        if offset > len(entry.text):
            raise ValueError(f"offset {offset} is past the end of the text ({len(entry.text)} characters)")
        return Page(key, offset, entry.text[offset : offset + limit], len(entry.text))

    def _expire(self) -> None:
        deadline = self._clock() - self.ttl
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if entry.stored_at > deadline:
                return
            del self._entries[key]
            self._chars -= len(entry.text)


def cut_result(result: Mapping[str, Any], limit: int, cache: ResponseCache) -> dict[str, Any]:
    """Cut a `CallToolResult` wire dict whose text is longer than `limit` characters (0: never).

    The text is that of all text blocks joined by newlines. A cut result holds the first `limit`
    characters and a note with the cache key that pages the rest with `read_cache`; other blocks
    (images, resources) stay. `structuredContent` is dropped: it repeats the text it would bring
    back in full.
    """
    content = result.get("content") or []
    texts = [item["text"] for item in content if item.get("type") == "text" and isinstance(item.get("text"), str)]
    full = "\n".join(texts)
    if limit <= 0 or len(full) <= limit:
        return dict(result)
    key = cache.put(full)
    if key is None:
        note = (
            f"[Response truncated: showing the first {limit} of {len(full)} characters. The whole response "
            "is too large to keep for read_cache; ask the tool for less.]"
        )
    else:
        note = (
            f"[Response truncated: showing the first {limit} of {len(full)} characters. To read the rest, "
            f'call {READ_CACHE_TOOL_NAME} with {{"key": "{key}", "offset": {limit}}}; '
            f"the response is kept for {int(cache.ttl // 60)} minutes.]"
        )
    others = [item for item in content if not (item.get("type") == "text" and isinstance(item.get("text"), str))]
    cut = {name: value for name, value in result.items() if name not in ("content", "structuredContent")}
    cut["content"] = [{"type": "text", "text": full[:limit]}, {"type": "text", "text": note}, *others]
    meta = dict(result.get("_meta") or {})
    meta[TRUNCATION_META] = {"key": key, "returned": limit, "total": len(full)}
    cut["_meta"] = meta
    return cut


READ_CACHE_TOOL: Final[dict[str, Any]] = {
    "name": READ_CACHE_TOOL_NAME,
    "description": (
        "Read the rest of a tool response that was truncated because it was too long. The truncated "
        "response names a cache key and the offset to continue from. Returns up to `limit` characters "
        "from `offset`, then a note with the next offset (none when the end is reached). Responses "
        "are kept for 10 minutes."
    ),
    "inputSchema": {
        "type": "object",
        "properties": {
            "key": {"type": "string", "description": "The cache key given in the truncated response."},
            "offset": {
                "type": "integer",
                "minimum": 0,
                "default": 0,
                "description": "Character offset to read from (the truncated response says where to continue).",
            },
            "limit": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_PAGE,
                "description": "Maximum number of characters to return (default: the response size limit).",
            },
        },
        "required": ["key"],
        "additionalProperties": False,
    },
    "annotations": {"title": "Read a cached response", "readOnlyHint": True, "openWorldHint": False},
}


def read_cache(cache: ResponseCache, arguments: Mapping[str, Any], *, page_size: int) -> dict[str, Any]:
    """The `read_cache` tool: one page of a cached response as text, its position as structured data."""
    check_parameters(arguments, ("key", "offset", "limit"), what=READ_CACHE_TOOL_NAME)
    key = get_string(arguments, "key", required=True)
    assert key is not None
    offset = get_integer(arguments, "offset", default=0, minimum=0)
    limit = get_integer(arguments, "limit", default=page_size or DEFAULT_PAGE, minimum=1, maximum=MAX_PAGE)
    try:
        page = cache.read(key, offset, limit)
    except CacheMiss:
        raise ToolInputError(
            f"Unknown or expired cache key '{key}': responses are kept for {int(cache.ttl // 60)} minutes; "
            "call the tool again to get a fresh key"
        ) from None
    except ValueError as exc:
        raise ToolInputError(f"Parameter 'offset': {exc}") from None
    end = page.offset + len(page.text)
    if page.next_offset is None:
        note = f"[read_cache: characters {page.offset}-{end} of {page.total}; this is the end.]"
    else:
        note = (
            f"[read_cache: characters {page.offset}-{end} of {page.total}. To continue, call "
            f'{READ_CACHE_TOOL_NAME} with {{"key": "{key}", "offset": {page.next_offset}}}.]'
        )
    position = {
        "key": key,
        "offset": page.offset,
        "returned": len(page.text),
        "total": page.total,
        "next_offset": page.next_offset,
    }
    return {
        "content": [{"type": "text", "text": page.text}, {"type": "text", "text": note}],
        "structuredContent": position,
        "isError": False,
        "resultType": "complete",
    }
