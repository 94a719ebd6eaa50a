"""Upstream login records in a real PostgreSQL (store/oauth_pg.py), without starting replicas.

Given one record per worker id, every write gives it a new version, the listing names logins and
expiries only, and a refresh hold is exclusive: a second replica's hold waits for the first's
commit and then reads the tokens it stored.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from mcpvisor.store import oauth_pg
from mcpvisor.store.oauth_store import TokenFile
from mcpvisor.store.state_pg import PostgresState
from tests.support import postgres

postgres_cluster = postgres.cluster_fixture()
postgres_url = postgres.database_fixture()


@pytest.fixture
def store(postgres_url: str) -> Iterator[PostgresState]:
    state = PostgresState(postgres_url)
    state.migrate()
    yield state
    state.close()


def login(access: str, refresh: str) -> TokenFile:
    return TokenFile(tokens={"access_token": access, "refresh_token": refresh}, expires_at=2e9)


def test_records_are_per_worker_versioned_and_listed_without_tokens(store: PostgresState) -> None:
    alice = oauth_pg.SharedRecord(store, "acme/remote")
    plain = oauth_pg.SharedRecord(store, "remote")
    assert alice.version() is None and alice.load() == TokenFile()
    first = alice.save(login("at-1", "rt-1"))
    second = alice.save(login("at-2", "rt-2"))
    assert first is not None and second is not None and first != second == alice.version()
    assert alice.load().tokens == {"access_token": "at-2", "refresh_token": "rt-2"}
    plain.save(TokenFile(client={"client_id": "c"}))  # a registration without a login is no login
    assert oauth_pg.logins(store) == [("acme/remote", 2e9)]
    assert "at-2" not in repr(oauth_pg.logins(store)) and "rt-2" not in repr(oauth_pg.logins(store))
    assert oauth_pg.remove(store, "acme/remote") is True
    assert oauth_pg.remove(store, "acme/remote") is False and alice.version() is None


def test_a_refresh_hold_waits_for_the_other_replicas_and_sees_what_it_stored(store: PostgresState) -> None:
    here = oauth_pg.SharedRecord(store, "remote")
    there = oauth_pg.SharedRecord(store, "remote")  # the same worker id on another replica
    here.save(login("at-1", "rt-1"))
    hold, stored, _ = here.hold()
    assert stored.tokens == {"access_token": "at-1", "refresh_token": "rt-1"}
    seen: list[TokenFile] = []

    def refresh_there() -> None:
        other, stored, _ = there.hold()
        other.close()
        seen.append(stored)

    waiting = threading.Thread(target=refresh_there)
    waiting.start()
    time.sleep(0.5)  # the other replica's hold is blocked on the advisory lock meanwhile
    assert seen == [] and waiting.is_alive()
    hold.commit(login("at-2", "rt-2"))
    hold.close()
    waiting.join(timeout=10)
    assert seen and seen[0].tokens == {"access_token": "at-2", "refresh_token": "rt-2"}


def test_a_hold_closed_without_commit_releases_the_lock_and_changes_nothing(store: PostgresState) -> None:
    record = oauth_pg.SharedRecord(store, "remote")
    version = record.save(login("at-1", "rt-1"))
    hold, _, _ = record.hold()
    hold.close()
    again, stored, seen = record.hold()  # not blocked: the first hold's transaction ended
    again.close()
    assert stored.tokens == {"access_token": "at-1", "refresh_token": "rt-1"} and seen == version
