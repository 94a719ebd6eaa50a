"""Params and results as the door forwards them: the client's envelope left out, results marked final."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

# `_meta` keys that describe the client's own connection to mcpvisor (the 2026-07-28 envelope):
# they must not reach an upstream, whose connection is the worker's.
ENVELOPE_PREFIX = "io.modelcontextprotocol/"

_decode = msgspec.json.Decoder(dict[str, Any])


def forwardable(params: Any, ctx: Any = None) -> dict[str, Any]:
    """Request params as wire JSON for an upstream, without the client's connection envelope.

    The params exactly as the client sent them (`ctx.params`, already validated by the SDK) are
    preferred to a dump of the parsed model: cheaper, and nothing the client sent is lost.
    """
    raw = getattr(ctx, "params", None)
    if isinstance(raw, Mapping):
        data: dict[str, Any] = dict(raw)
    else:
        data = params.model_dump(by_alias=True, mode="json", exclude_none=True)
    meta = data.get("_meta")
    if meta:
        meta = {key: value for key, value in meta.items() if not key.startswith(ENVELOPE_PREFIX)}
        if meta:
            data["_meta"] = meta
        else:
            del data["_meta"]
    return data


def complete(result: dict[str, Any]) -> dict[str, Any]:
    """Mark a result as final; 2026-07-28 clients require `resultType`, older ones drop it."""
    result.setdefault("resultType", "complete")
    return result


def decoded(result: bytes | dict[str, Any]) -> dict[str, Any]:
    """An upstream's result for the SDK, which answers with a dict (an input_required one already is)."""
    return result if isinstance(result, dict) else complete(_decode.decode(result))
