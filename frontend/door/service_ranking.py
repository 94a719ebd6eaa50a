"""Ranking with an operator's embedding service (`[search] embedding_url`), and falling back when it fails.

The service's vectors live in an index of their own beside the bundled model's, kept in step
with the catalog by one task: a tool text is sent once (vectors are kept per tool text, across
restarts in `tool-vectors-service.npz`), in batches, when a server's tools change. A search uses
the service when its index knows every server the client sees and the query's vector comes back
within `embedding_timeout`; otherwise the bundled model's index ranks it (itself BM25 alone when
the model is missing). The log says when the service stops and starts ranking, and why, and
`/healthz` shows which ranking is in use and how many searches fell back.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final

import trio

from mcpvisor.frontend.door.embedding_service import EmbeddingService, ServiceError
from mcpvisor.frontend.door.search import ToolIndex
from mcpvisor.wire.config import SearchConfig
from mcpvisor.wire.redaction import redact_secrets

if TYPE_CHECKING:
    import numpy as np

    from mcpvisor.frontend.door.catalog import ServerView

log = logging.getLogger(__name__)

CACHE_FILE_NAME: Final = "tool-vectors-service.npz"


class ServiceRanking:
    """The embedding service's index, its upkeep, and whether it may rank a search now."""

    def __init__(self, search: SearchConfig, cache_dir: Path | None = None) -> None:
        self.config = search
        self.url = redact_secrets(search.embedding_url or "")
        self._cache_dir = cache_dir
        self.index: ToolIndex | None = None
        self._service: EmbeddingService | None = None
        self._unindexed: set[str] = set()
        self._wake = trio.Event()
        self.problem: str | None = "not connected yet"  # why the service does not rank searches now
        self._retry_at = 0.0
        self.fallbacks = 0  # searches ranked without the service since the start

    @property
    def ranking(self) -> bool:
        return self.problem is None

    def changed(self, servers: Collection[str]) -> None:
        """Servers whose tools changed (or went): the service's index takes them in next."""
        self._unindexed.update(servers)
        self._wake.set()

    def _failed(self, reason: str, fallback: str) -> None:
        if self.problem is None:
            log.warning(
                "tool search: the embedding service stopped ranking (%s); searches are ranked by %s until it "
                "answers again (tried every %g s)",
                reason,
                fallback,
                self.config.embedding_retry,
            )
        self.problem = reason
        # Until then a search does not wait for a service that is down: it falls back at once.
        self._retry_at = time.monotonic() + self.config.embedding_retry

    def _recovered(self) -> None:
        if self.problem is not None and self.index is not None and not self._unindexed:
            log.info(
                "tool search: the embedding service %s ranks searches (%d dimensions)", self.url, self.index_dimension
            )
            self.problem = None

    @property
    def index_dimension(self) -> int:
        return self._service.dimension if self._service is not None else 0

    async def query_vector(self, query: str, servers: Collection[str], fallback: str) -> np.ndarray | None:
        """The query's vector from the service, or None when the search must be ranked without it."""
        service = self._service
        if self.index is None or service is None or self._unindexed.intersection(servers):
            self.fallbacks += 1
            return None
        if self.problem is not None and time.monotonic() < self._retry_at:
            self.fallbacks += 1
            return None
        vector = None
        with trio.move_on_after(service.query_timeout):
            try:
                vector = await service.embed_query(query)
            except ServiceError as error:
                self._failed(str(error), fallback)
                self.fallbacks += 1
                return None
        if vector is None:
            self._failed(f"{self.url} did not answer within {service.query_timeout:g} s", fallback)
            self.fallbacks += 1
            return None
        self._recovered()
        return vector

    async def serve(
        self,
        views: Callable[[], Mapping[str, ServerView]],
        fallback: Callable[[], str],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Connect to the service, then keep its index in step with the catalog, retrying after failures."""
        task_status.started()
        try:
            while True:
                if self.index is None:
                    await self._connect(fallback)
                else:
                    await self._update(views, fallback)
                if self.problem is not None:
                    await trio.sleep(max(0.0, self._retry_at - time.monotonic()))
                else:
                    await self._wake.wait()
                self._wake = trio.Event()
        finally:
            if self._service is not None:
                with trio.CancelScope(shield=True):
                    await self._service.aclose()
                self._service.close()

    async def _connect(self, fallback: Callable[[], str]) -> None:
        """Learn the service's dimension with one text, then open its index (and cache file)."""
        try:
            if self._service is None:
                self._service = EmbeddingService(self.config)
            service = self._service
            await trio.to_thread.run_sync(service.embed, ["tool search"])
        except ServiceError as error:
            self._failed(str(error), fallback())
            return
        # Opening the index reads the cache file: off the loop too.
        make = functools.partial(ToolIndex, embedder=service, cache_dir=self._cache_dir, cache_name=CACHE_FILE_NAME)
        self.index = await trio.to_thread.run_sync(make)
        self._unindexed.add("")  # a marker: take in every server at the first update
        self._wake.set()

    async def _update(self, views: Callable[[], Mapping[str, ServerView]], fallback: Callable[[], str]) -> None:
        index = self.index
        assert index is not None
        if "" in self._unindexed:
            self._unindexed.discard("")
            self._unindexed.update({*views(), *index.servers()})
        while self._unindexed:
            name = min(self._unindexed)
            self._unindexed.discard(name)
            view = views().get(name)
            if view is not None and view.listed:
                try:
                    prepared = await trio.to_thread.run_sync(index.prepare, name, list(view.tools))
                except ServiceError as error:
                    self._unindexed.add(name)
                    self._failed(str(error), fallback())
                    return
                if name not in self._unindexed:  # else the catalog moved on meanwhile: take the newer one
                    index.apply(prepared)
            else:
                index.remove_server(name)
        self._recovered()

    def save_cache(self) -> None:
        if self.index is not None:
            self.index.save_cache()
