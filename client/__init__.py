"""mcpvisor.client: client-side helpers for talking to an mcpvisor endpoint."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mcpvisor.client.proxy_client import (
        ProxyClient,
        ProxyError,
        ProxyResponse,
        ProxyResponseError,
        ProxyResponseInfo,
        ProxyToolError,
        deserialize_embedded_resource_python_object,
        get_embedded_resource_python_object,
        tool_result_as_prompt_result,
        tool_result_as_resource_result,
    )

__all__ = [
    "ProxyClient",
    "ProxyError",
    "ProxyResponse",
    "ProxyResponseError",
    "ProxyResponseInfo",
    "ProxyToolError",
    "deserialize_embedded_resource_python_object",
    "get_embedded_resource_python_object",
    "tool_result_as_prompt_result",
    "tool_result_as_resource_result",
]


def __getattr__(name: str) -> Any:
    # Imported on first use: the stdio bridge lives in this package too, and a desktop client
    # starting it should not wait for the MCP SDK to load, which the bridge does not need.
    if name in __all__:
        return getattr(importlib.import_module("mcpvisor.client.proxy_client"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
