"""mcpvisor.client: client-side helpers for talking to an mcpvisor endpoint."""

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
