"""The activity log's hash chain on a real PostgreSQL, written by replicas at once.

Given three replicas (three pools) appending from several threads each, the chain is one chain:
every row follows the one before it, none forked; an edited and a deleted row are named; retention
keeps the chain verifiable.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from mcpvisor.store import audit_chain
from mcpvisor.store.state_pg import PostgresState
from tests.support import postgres

postgres_cluster = postgres.cluster_fixture()
postgres_url = postgres.database_fixture()

REPLICAS = 3
THREADS = 3
ROWS = 40  # per thread


def a_row(tool: str) -> tuple[object, ...]:
    values: dict[str, object] = {column: "" for column in audit_chain.HASHED}
    values.update(time=time.time(), kind="tool", server="github", tool=tool, variant="direct", outcome="ok")
    values.update(duration_ms=1.5, result_bytes=10, intent=None, arguments=None, result=None, policies="base")
    return tuple(values[column] for column in audit_chain.HASHED)


@pytest.fixture
def replicas(postgres_url: str) -> Iterator[list[PostgresState]]:
    stores = [PostgresState(postgres_url) for _ in range(REPLICAS)]
    stores[0].migrate()
    yield stores
    for store in stores:
        store.close()


def test_replicas_appending_at_once_make_one_chain(replicas: list[PostgresState]) -> None:
    failures: list[BaseException] = []

    def append_many(store: PostgresState, name: str) -> None:
        try:
            for n in range(ROWS):
                # Some rows one by one, some in batches, as the writer thread sends them.
                batch = [a_row(f"{name}-{n}-{k}") for k in range(1 + n % 3)]
                audit_chain.append(store, batch)
        except BaseException as exc:  # reported below, with the others
            failures.append(exc)

    threads = [
        threading.Thread(target=append_many, args=(store, f"r{r}t{t}"))
        for r, store in enumerate(replicas)
        for t in range(THREADS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures
    expected = REPLICAS * THREADS * sum(1 + n % 3 for n in range(ROWS))
    verdict = audit_chain.verify(replicas[1])
    assert verdict.intact, verdict.problem
    assert verdict.rows == expected
    # One chain: no two rows follow the same row.
    forks = (
        replicas[2].execute("SELECT prev_hash, count(*) FROM calls GROUP BY prev_hash HAVING count(*) > 1").fetchall()
    )
    assert forks == []


def test_an_edited_and_a_deleted_row_are_named_on_postgres(replicas: list[PostgresState]) -> None:
    store = replicas[0]
    audit_chain.append(store, [a_row(f"t{n}") for n in range(10)])
    store.execute("UPDATE calls SET tool = 'other' WHERE id = 6")
    verdict = audit_chain.verify(store)
    assert (verdict.bad_id, verdict.problem) == (
        6,
        "row 6: its contents do not match its hash: it was changed after it was written",
    )
    store.execute("UPDATE calls SET tool = 't5' WHERE id = 6")
    assert audit_chain.verify(store).intact
    store.execute("DELETE FROM calls WHERE id = 4")
    verdict = audit_chain.verify(store)
    assert verdict.bad_id == 5
    assert verdict.problem.startswith("row 5: it does not follow row 3")


def test_retention_on_postgres_keeps_the_chain_verifiable(replicas: list[PostgresState]) -> None:
    store = replicas[0]
    audit_chain.append(store, [a_row(f"t{n}") for n in range(10)])
    assert audit_chain.prune(replicas[1], time.time() - 3600, 4) == 6
    audit_chain.append(replicas[2], [a_row("after")])
    verdict = audit_chain.verify(store)
    assert verdict.intact
    assert (verdict.first_id, verdict.last_id, verdict.rows) == (7, 11, 5)
