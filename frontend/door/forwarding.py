"""Results as the door hands them to mcpvisor's own tools: an upstream's bytes, decoded once."""

from __future__ import annotations

from typing import Any

import msgspec

_decode = msgspec.json.Decoder(dict[str, Any])


def decoded(result: bytes | dict[str, Any]) -> dict[str, Any]:
    """An upstream's result as a dict (an `input_required` one from the rounds already is one)."""
    return result if isinstance(result, dict) else _decode.decode(result)
