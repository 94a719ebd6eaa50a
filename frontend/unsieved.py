"""Keep forwarded results as the upstream wrote them, after the SDK has checked them.

The SDK's server validates every result against the client's protocol version and writes out its
own dump of it: `"priority": 1` comes out as `1.0`, fields it does not model are dropped. A
gateway should forward, not rewrite. So a middleware lets the SDK check (a malformed result is
still refused), then puts back, for every field the check kept, the value the upstream sent.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext

_slot: ContextVar[dict[str, Any] | None] = ContextVar("_unsieved_slot", default=None)

FORWARDED_METHODS = frozenset({"tools/call", "resources/read", "prompts/get", "completion/complete"})


def keep(result: dict[str, Any]) -> dict[str, Any]:
    """Note `result` as exactly what this request answers (inside KeepUnsieved); returns it.

    Call it only on the result the handler returns as it is: a handler that builds another
    result from it must keep that one instead.
    """
    if (slot := _slot.get()) is not None:
        slot["result"] = result
    return result


class KeepUnsieved:
    """Server middleware: after the SDK's check, restore the values of a result noted with `keep`."""

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method not in FORWARDED_METHODS:
            return await call_next(ctx)
        slot: dict[str, Any] = {}
        token = _slot.set(slot)
        try:
            checked = await call_next(ctx)
        finally:
            _slot.reset(token)
        original = slot.get("result")
        if original is None or not isinstance(checked, dict):
            return checked
        # Fields the check dropped stay dropped; `_meta` stays the SDK's, which adds its own stamp.
        return {key: (value if key == "_meta" else original.get(key, value)) for key, value in checked.items()}
