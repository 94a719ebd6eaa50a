"""The routing headers the worker copies from a JSON-RPC body onto its HTTP request."""

from __future__ import annotations

import json

import httpx2

from mcpvisor.workers.routing_headers import routing_headers, stamp_routing_headers


def body(method: str, **params: object) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()


def test_named_requests_carry_their_name_and_others_only_their_method() -> None:
    assert routing_headers(body("tools/call", name="search", arguments={})) == {
        "mcp-method": "tools/call",
        "mcp-name": "search",
    }
    assert routing_headers(body("resources/read", uri="file:///a")) == {
        "mcp-method": "resources/read",
        "mcp-name": "file:///a",
    }
    assert routing_headers(body("tools/list")) == {"mcp-method": "tools/list"}
    # A name that is not plain ASCII is encoded as the 2026-07-28 header rules say.
    assert routing_headers(body("prompts/get", name="café"))["mcp-name"].startswith("=?base64?")


def test_responses_batches_and_garbage_get_no_headers() -> None:
    assert routing_headers(b'{"jsonrpc": "2.0", "id": 1, "result": {}}') == {}
    assert routing_headers(b"[1, 2]") == {}
    assert routing_headers(b"not json") == {}
    assert routing_headers(body("tools/call", name=7)) == {"mcp-method": "tools/call"}


async def test_the_hook_keeps_headers_already_set() -> None:
    request = httpx2.Request(
        "POST", "http://127.0.0.1/mcp", content=body("tools/call", name="a"), headers={"mcp-name": "a"}
    )
    await stamp_routing_headers(request)
    assert request.headers["mcp-method"] == "tools/call"
    assert request.headers.get_list("mcp-name") == ["a"]
    get = httpx2.Request("GET", "http://127.0.0.1/mcp")
    await stamp_routing_headers(get)
    assert "mcp-method" not in get.headers
