"""A local tool's result is shaped for each protocol version exactly as the SDK's serializer shapes it."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from mcp_types.methods import serialize_server_result

from mcpvisor.frontend.endpoints.eras import local_tool_result
from mcpvisor.frontend.tool_args import error_result, json_result, text_result

RESULTS: list[dict[str, Any]] = [
    json_result({"query": "x", "tools": [{"score": 0.12345, "n": 1, "text": "é\u2028<"}], "total": 1}),
    error_result("Parameter 'query' must be a string"),
    text_result("one", "two"),
    {"content": [{"type": "text", "text": "no isError"}], "resultType": "complete"},
    {"content": [], "isError": True, "structuredContent": {"a": [1, 2.5, None]}, "resultType": "complete"},
    # Not the usual shape: left to the serializer, which must still get the same answer.
    {"content": [{"type": "image", "data": "aGk=", "mimeType": "image/png"}], "resultType": "complete"},
    {"content": [{"type": "text", "text": "x", "annotations": {"priority": 1}}], "resultType": "complete"},
]


@pytest.mark.parametrize("version", ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25", "2026-07-28"])
@pytest.mark.parametrize("result", RESULTS)
def test_local_results_are_shaped_as_the_sdk_shapes_them(version: str, result: dict[str, Any]) -> None:
    expected = serialize_server_result("tools/call", version, dict(result))
    shaped = local_tool_result(version, dict(result))
    assert shaped is not None
    assert msgspec.json.decode(shaped) == msgspec.json.decode(msgspec.json.encode(expected))


def test_a_result_the_sdk_would_refuse_is_none() -> None:
    assert local_tool_result("2025-11-25", {"content": "not a list"}) is None
