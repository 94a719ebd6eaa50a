"""The 2026-07-28 details across mcpvisor's endpoints: server/discover, the routing headers, cache
hints, MCP Apps and trace context, on /mcp/direct and on /mcp/servers/NAME."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2

from tests.e2e.test_conformance import fixture_http
from tests.support.stack import Stack, open_stack, python_server
from tests.upstreams.conformance_server import APP_HTML, APP_META, APP_MIME, APP_TOOL_META, APP_URI

MODERN = "2026-07-28"
CLIENT_META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientInfo": {"name": "protocol-test", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {},
}
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
# The same upstream seen two ways: prefixed among all upstreams, and under its own names.
ENDPOINTS = {"/mcp/direct": "conf:", "/mcp/servers/conf": ""}
CACHED_LISTS = {
    "tools/list": "tools",
    "resources/list": "resources",
    "resources/templates/list": "resourceTemplates",
    "prompts/list": "prompts",
}


@asynccontextmanager
async def conf_stack(tmp_path: Path) -> AsyncIterator[Stack]:
    settings = {"enable_server_endpoints": True}
    async with open_stack(tmp_path, {"conf": python_server("conformance_server.py")}, settings=settings) as stack:
        yield stack


async def post(
    url: str, method: str, params: dict[str, Any] | None = None, *, headers: dict[str, str] | None = None
) -> httpx2.Response:
    """One 2026-07-28 request as a client sends it: the routing headers agree with the body unless overridden."""
    body_params = {**(params or {}), "_meta": {**CLIENT_META, **(params or {}).get("_meta", {})}}
    sent = {"accept": "application/json, text/event-stream", "mcp-protocol-version": MODERN, "mcp-method": method}
    named = (params or {}).get("name") or (params or {}).get("uri")
    if named is not None:
        sent["mcp-name"] = str(named)
    sent.update(headers or {})
    async with httpx2.AsyncClient(timeout=30) as http:
        return await http.post(
            url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": body_params}, headers=sent
        )


def result_of(response: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC result of a response sent as JSON or as one SSE event."""
    assert response.status_code == 200, response.text
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
        message = json.loads(data[-1])
    else:
        message = response.json()
    assert "result" in message, message
    return message["result"]


async def test_the_current_protocol_holds_on_both_endpoints(tmp_path: Path) -> None:
    async with conf_stack(tmp_path) as stack:
        for path, prefix in ENDPOINTS.items():
            url = f"{stack.base_url}{path}"

            # server/discover: the versions and capabilities that hold across the endpoint.
            discovered = result_of(await post(url, "server/discover"))
            assert MODERN in discovered["supportedVersions"], (path, discovered)
            capabilities = discovered["capabilities"]
            assert {"tools", "resources", "prompts"} <= set(capabilities), (path, capabilities)
            if path == "/mcp/servers/conf":
                assert "completions" in capabilities  # the upstream's own capability

            # Mcp-Method and Mcp-Name must agree with the body: an intermediary answers 400 otherwise.
            assert (await post(url, "tools/list", headers={"mcp-method": "prompts/list"})).status_code == 400
            call = {"name": f"{prefix}test_simple_text", "arguments": {}}
            assert (await post(url, "tools/call", call, headers={"mcp-name": "someone_else"})).status_code == 400
            answered = result_of(await post(url, "tools/call", call))
            assert answered["content"][0]["text"] == "This is a simple text response for testing."

            # Cache hints on every list and on resources/read.
            for method, field in CACHED_LISTS.items():
                listed = result_of(await post(url, method))
                assert isinstance(listed["ttlMs"], int) and listed["ttlMs"] >= 0, (path, method, listed.keys())
                assert listed["cacheScope"] in ("public", "private"), (path, method)
                assert field in listed
            read = result_of(await post(url, "resources/read", {"uri": "test://static-text"}))
            assert "ttlMs" in read and "cacheScope" in read, (path, read.keys())

            # MCP Apps: the tool's _meta and its ui:// resource pass through unchanged.
            tools = {tool["name"]: tool for tool in result_of(await post(url, "tools/list"))["tools"]}
            assert tools[f"{prefix}test_app_tool"]["_meta"] == APP_TOOL_META
            resources = {r["uri"]: r for r in result_of(await post(url, "resources/list"))["resources"]}
            assert resources[APP_URI]["mimeType"] == APP_MIME and resources[APP_URI]["_meta"] == APP_META
            contents = result_of(await post(url, "resources/read", {"uri": APP_URI}))["contents"]
            assert contents == [{"uri": APP_URI, "mimeType": APP_MIME, "text": APP_HTML, "_meta": APP_META}]
            ran = result_of(await post(url, "tools/call", {"name": f"{prefix}test_app_tool", "arguments": {}}))
            assert ran["content"][0]["text"] == "app tool ran"

            # Trace context in a request's _meta reaches the upstream; the client's envelope does not.
            traced = {"name": f"{prefix}test_request_meta", "arguments": {}, "_meta": {"traceparent": TRACEPARENT}}
            seen = json.loads(result_of(await post(url, "tools/call", traced))["content"][0]["text"])
            assert seen.get("traceparent") == TRACEPARENT, (path, seen)
            assert not any(key.startswith("io.modelcontextprotocol/") for key in seen), seen


async def test_the_worker_sends_the_routing_headers_to_an_http_upstream(tmp_path: Path) -> None:
    settings = {"enable_server_endpoints": True}
    with fixture_http(tmp_path) as url:
        servers = {"conf": {"url": url, "transport": "streamable-http"}}
        async with open_stack(tmp_path, servers, settings=settings) as stack:
            for era in ("legacy", "modern"):
                mode = {"mode": "legacy"} if era == "legacy" else {}
                async with stack.client("/mcp/servers/conf", **mode) as client:
                    result = await client.call_tool("test_routing_headers", {})
                    seen = json.loads(result.content[0].text)
                    assert seen == {"mcp-method": "tools/call", "mcp-name": "test_routing_headers"}, (era, seen)
