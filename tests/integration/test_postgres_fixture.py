"""The throwaway PostgreSQL of tests/support/postgres.py: reachable by its URL, and only with the password."""

from __future__ import annotations

import psycopg
import pytest

from tests.support import postgres
from tests.support.postgres import PostgresCluster

postgres_cluster = postgres.cluster_fixture()
postgres_url = postgres.database_fixture()


def test_each_test_gets_an_empty_database_reached_by_its_url(postgres_url: str) -> None:
    with psycopg.connect(postgres_url) as connection:
        tables = connection.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()
        assert tables == (0,)
        connection.execute("CREATE TABLE here (x int)")


def test_a_wrong_password_is_refused(postgres_cluster: PostgresCluster) -> None:
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(postgres_cluster.url(password="not-the-password"), connect_timeout=5).close()


def test_the_server_listens_on_loopback_only(postgres_cluster: PostgresCluster) -> None:
    assert postgres_cluster.psql("SHOW listen_addresses").strip() == "127.0.0.1"
