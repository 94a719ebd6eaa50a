"""A client of an OpenAI-compatible `/v1/embeddings` service (Ollama, TEI, vLLM, an API), for tool search.

Only the operator's `[search]` table names the service and its key (a secret reference resolved
here, in the frontend); nothing an MCP client sends reaches it but the words of its search. Tool
texts are sent in batches from a worker thread when a catalog changes; a search's query is sent
on the event loop within `embedding_timeout`. Errors say what failed (status, timeout, a bad
answer) and never carry the key or the service's answer text.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import httpx2

from mcpvisor.wire.config import SearchConfig
from mcpvisor.wire.redaction import redact_secrets
from mcpvisor.wire.secrets import SecretError, resolve

if TYPE_CHECKING:
    import numpy as np

# Seconds one batch of tool texts may take: a service on a CPU embeds a batch of 64 long
# descriptions in a few seconds; a query is bounded by `embedding_timeout` instead.
BATCH_TIMEOUT: Final = 120.0
# An answer larger than this is no batch of embeddings (64 texts x 4,096 dimensions in JSON is ~5 MB).
MAX_ANSWER_BYTES: Final = 64 * 1024 * 1024
# Part of every cache key, as semantic.RECIPE_VERSION: a change to how texts are sent must not
# reuse vectors computed the old way.
RECIPE_VERSION: Final = "1"


class ServiceError(Exception):
    """The embedding service did not give usable vectors; the message says why, fit for a log line."""


class EmbeddingService:
    """Turns texts into unit vectors with the configured service: the `Embedder` interface, plus async queries."""

    def __init__(self, search: SearchConfig, dimension: int = 0) -> None:
        assert search.embedding_url is not None
        self._url = search.embedding_url
        # What logs, errors and /healthz show: a password or key written into the URL is masked.
        self.url = redact_secrets(search.embedding_url)
        self._model = search.embedding_model
        self._input_type = search.embedding_input_type
        self._batch = search.embedding_batch
        self.query_timeout = search.embedding_timeout
        self._headers = {"Content-Type": "application/json"}
        if search.embedding_key is not None:
            try:
                key = resolve(search.embedding_key)
            except SecretError as error:  # names the reference, never a value
                raise ServiceError(f"the embedding key cannot be read: {error}") from None
            self._headers["Authorization"] = f"Bearer {key}"
        self.dimension = dimension
        # The service's vectors are only comparable with vectors of the same service and model.
        digest = hashlib.sha256(f"{self._url}\0{self._model}\0{self._input_type}".encode()).hexdigest()[:16]
        self.fingerprint = f"service-{digest}-r{RECIPE_VERSION}"
        # trust_env=False: the operator's URL is the one reached, not a proxy from the environment.
        self._client = httpx2.Client(timeout=BATCH_TIMEOUT, follow_redirects=False, trust_env=False)
        self._async: httpx2.AsyncClient | None = None

    def close(self) -> None:
        self._client.close()

    async def aclose(self) -> None:
        if self._async is not None:
            await self._async.aclose()
            self._async = None

    def _body(self, texts: Sequence[str], kind: str) -> dict[str, Any]:
        body: dict[str, Any] = {"input": list(texts), "encoding_format": "float"}
        if self._model:
            body["model"] = self._model
        if self._input_type:
            body["input_type"] = kind
        return body

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Tool texts as unit vectors, one row each, sent `embedding_batch` at a time (blocking: off the loop)."""
        return self.embed_as(texts, "passage")

    def embed_as(self, texts: Sequence[str], kind: str) -> np.ndarray:
        """`embed` for texts of either kind, "passage" (tools) or "query" (what the benchmarks send in bulk)."""
        import numpy as np

        rows = []
        for start in range(0, len(texts), self._batch):
            batch = texts[start : start + self._batch]
            try:
                response = self._client.post(self._url, headers=self._headers, json=self._body(batch, kind))
            except httpx2.TimeoutException:
                raise ServiceError(f"{self.url} did not answer within {BATCH_TIMEOUT:.0f} s") from None
            except httpx2.HTTPError as error:
                raise ServiceError(f"{self.url} cannot be reached ({type(error).__name__})") from None
            rows.append(self._vectors(response.status_code, response.content, len(batch)))
        if not rows:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return np.concatenate(rows)

    async def embed_query(self, query: str) -> np.ndarray:
        """One query's unit vector, within `embedding_timeout` (the caller bounds the wait as well)."""
        if self._async is None:
            self._async = httpx2.AsyncClient(timeout=self.query_timeout, follow_redirects=False, trust_env=False)
        try:
            response = await self._async.post(self._url, headers=self._headers, json=self._body([query], "query"))
        except httpx2.TimeoutException:
            raise ServiceError(f"{self.url} did not answer within {self.query_timeout:g} s") from None
        except httpx2.HTTPError as error:
            raise ServiceError(f"{self.url} cannot be reached ({type(error).__name__})") from None
        return self._vectors(response.status_code, response.content, 1)[0]

    def _vectors(self, status: int, content: bytes, count: int) -> np.ndarray:
        """The answer's vectors, in the order of the texts, normalized; ServiceError for anything else."""
        import numpy as np

        if status != 200:
            raise ServiceError(f"{self.url} answered HTTP {status}")
        if len(content) > MAX_ANSWER_BYTES:
            raise ServiceError(f"{self.url} answered with more than {MAX_ANSWER_BYTES} bytes")
        try:
            data = json.loads(content)["data"]
            ordered = sorted(data, key=lambda item: item.get("index", 0))
            matrix = np.asarray([item["embedding"] for item in ordered], dtype=np.float32)
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ServiceError(f"{self.url} did not answer with a list of embeddings") from None
        if matrix.ndim != 2 or len(matrix) != count or matrix.shape[1] == 0 or not np.isfinite(matrix).all():
            raise ServiceError(f"{self.url} answered with {matrix.shape} numbers for {count} texts")
        if self.dimension and matrix.shape[1] != self.dimension:
            raise ServiceError(f"{self.url} answered vectors of {matrix.shape[1]} dimensions, not {self.dimension}")
        self.dimension = int(matrix.shape[1])
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        np.divide(matrix, norms, out=matrix, where=norms > 0)
        return matrix
