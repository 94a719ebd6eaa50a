"""mcpvisor's own pagination of list results, with opaque cursors a client cannot forge."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from typing import Any

from mcpvisor.frontend.endpoints.rpc import INVALID_PARAMS, RpcError

# Per process: cursors are only good for the frontend that issued them, and only for the list
# they were issued for.
_KEY = secrets.token_bytes(32)


def _sign(kind: str, offset: int) -> str:
    mac = hmac.new(_KEY, f"{kind}:{offset}".encode(), hashlib.sha256).digest()[:12]
    return base64.urlsafe_b64encode(offset.to_bytes(4, "big") + mac).decode().rstrip("=")


def _offset(kind: str, cursor: str) -> int:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    except ValueError:
        raw = b""
    if len(raw) == 16:
        offset = int.from_bytes(raw[:4], "big")
        if hmac.compare_digest(_sign(kind, offset), cursor):
            return offset
    raise RpcError(INVALID_PARAMS, f"Invalid cursor for {kind}: use the nextCursor of a previous page")


def page(kind: str, items: list[Any], cursor: str | None, size: int) -> tuple[list[Any], str | None]:
    """One page of `items` and the cursor of the next (None on the last page)."""
    start = _offset(kind, cursor) if cursor else 0
    end = start + size
    return items[start:end], (_sign(kind, end) if end < len(items) else None)


def paged(kind: str, field: str, items: list[Any], cursor: Any, size: int) -> dict[str, Any]:
    """A list result at `cursor`: `{field: [...], nextCursor?}`."""
    if cursor is not None and not isinstance(cursor, str):
        cursor = getattr(cursor, "cursor", None)  # the params of a request the SDK's server parsed
    chunk, next_cursor = page(kind, items, cursor, size)
    result: dict[str, Any] = {field: chunk}
    if next_cursor is not None:
        result["nextCursor"] = next_cursor
    return result
