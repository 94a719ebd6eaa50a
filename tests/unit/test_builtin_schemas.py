"""mcpvisor's own tools have input schemas every client can map: one `type` per schema position.

A `type` list (`["string", "null"]`) is legal JSON Schema, but clients that map tool schemas onto a
single-type dialect (the OpenAPI subset of some model providers) reject the tool or drop the
constraint; the MCP Inspector warns on each. Nullable values are `anyOf` branches instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from mcpvisor.frontend.tools.builtin_calls import VARIANTS, call_tool_definition
from mcpvisor.frontend.tools.code_execution import tool_definition
from mcpvisor.frontend.tools.describe import DESCRIBE_TOOL
from mcpvisor.frontend.tools.management import UPSTREAM_SERVERS_TOOL
from mcpvisor.frontend.tools.quarantine import QUARANTINE_SECURITY_TOOL
from mcpvisor.frontend.tools.registries import LIST_REGISTRIES_TOOL, SEARCH_SERVERS_TOOL, with_add_from_registry
from mcpvisor.frontend.tools.response_cache import READ_CACHE_TOOL
from mcpvisor.frontend.tools.retrieval import retrieve_tool
from mcpvisor.wire.config import SearchConfig
from mcpvisor.wire.proxy import PROXY_TOOL

TOOLS = [
    with_add_from_registry(UPSTREAM_SERVERS_TOOL),
    QUARANTINE_SECURITY_TOOL,
    READ_CACHE_TOOL,
    PROXY_TOOL,
    LIST_REGISTRIES_TOOL,
    SEARCH_SERVERS_TOOL,
    DESCRIBE_TOOL,
    retrieve_tool(15, SearchConfig()),
    tool_definition(),
    *(call_tool_definition(name) for name in VARIANTS),
]


def positions(schema: Any, path: str = "inputSchema") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(schema, dict):
        yield path, schema
        for key, value in schema.items():
            if key in ("enum", "const", "default", "examples"):
                continue
            yield from positions(value, f"{path}.{key}")
    elif isinstance(schema, list):
        for index, value in enumerate(schema):
            yield from positions(value, f"{path}[{index}]")


@pytest.mark.parametrize("tool", TOOLS, ids=[tool["name"] for tool in TOOLS])
def test_every_schema_position_has_one_type(tool: dict[str, Any]) -> None:
    listed = [path for path, schema in positions(tool["inputSchema"]) if isinstance(schema.get("type"), list)]
    assert not listed, listed


def test_upstream_servers_still_takes_null_to_remove_a_field() -> None:
    properties = UPSTREAM_SERVERS_TOOL["inputSchema"]["properties"]
    for field in ("command", "args", "env", "cwd", "url", "transport", "headers", "enabled", "policy"):
        assert {"type": "null"} in properties[field]["anyOf"], field
