"""Sandbox uids from the uid table: one per worker id, the same after a restart, never two owners.

The table lives in the state store: SQLite in the data dir, or PostgreSQL shared by replicas,
where two replicas may start workers at the same moment.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from mcpvisor.store.sandbox_uids import FIRST_OFFSET, UID_FLOOR, SandboxUids, open_local, uid_range
from mcpvisor.store.state_db import open_store
from tests.support import postgres

postgres_cluster = postgres.cluster_fixture()
postgres_url = postgres.database_fixture()

# Names chosen so that a crc32 of them would collide: the table does not care.
WORKERS = ["alice/shell", "bob/vault", "alice/files", "bob/shell", "carol/shell"]


def test_each_worker_id_gets_its_own_uid_and_keeps_it_across_restarts(tmp_path: Path) -> None:
    first = SandboxUids(open_local(str(tmp_path)))
    uids = {worker: first.uid_for(worker) for worker in WORKERS}
    assert len(set(uids.values())) == len(WORKERS)
    assert all(uid >= UID_FLOOR + FIRST_OFFSET for uid in uids.values())
    # A restart of mcpvisor reads the same table.
    again = SandboxUids(open_local(str(tmp_path)))
    assert {worker: again.uid_for(worker) for worker in reversed(WORKERS)} == uids
    assert again.uid_for("dave/new") not in uids.values()


def test_the_range_stays_inside_the_ids_a_container_maps() -> None:
    # A rootless container maps 65536 ids: the top half, below nobody and the script process's uid.
    first, end = uid_range([(0, 65536)])
    assert 32768 <= first < end <= 65532
    first, end = uid_range([(0, 1 << 32)])
    assert first == UID_FLOOR + FIRST_OFFSET


def test_a_full_range_is_an_error_not_a_shared_uid(tmp_path: Path) -> None:
    table = SandboxUids(open_local(str(tmp_path)), [(0, 65536)])
    table.end = table.first + 2
    table.uid_for("a/x")
    table.uid_for("b/x")
    with pytest.raises(Exception, match=r"no free sandbox uid|every sandbox uid"):
        table.uid_for("c/x")


def test_replicas_starting_workers_at_once_never_share_a_uid(postgres_url: str) -> None:
    # Replicas come up at once on an empty database: each opens the store and its uid table
    # in its own thread (a CREATE TABLE of each raced on PostgreSQL's catalog once).
    stores: list[Any] = [None] * 4
    found: list[dict[str, int]] = [{} for _ in stores]
    workers = [f"t{n}/shell" for n in range(12)]
    opened = threading.Barrier(len(stores))

    def start(index: int) -> None:
        opened.wait(30)
        stores[index] = open_store("", postgres_url)
        table = SandboxUids(stores[index])
        for worker in workers:
            found[index][worker] = table.uid_for(worker)

    threads = [threading.Thread(target=start, args=(n,)) for n in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    try:
        # Every replica agrees on each worker's uid, and no two workers share one.
        assert all(seen == found[0] for seen in found)
        assert len(set(found[0].values())) == len(workers)
        rows = stores[0].execute("SELECT COUNT(*), COUNT(DISTINCT uid) FROM sandbox_uids").fetchone()
        assert tuple(rows) == (len(workers), len(workers))
    finally:
        for store in stores:
            if store is not None:
                store.close()
