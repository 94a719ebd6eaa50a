"""The supervisor's side of the shared store, against a real PostgreSQL: run-time changes over the file.

Given a config file (the base) and run-time changes recorded in the store, every replica computes
the same config: the latest change of each server wins over the file, an approved proposal's
tenant keeps the server it was added for, a removal takes a server out of every tenant, and the
pending proposals are one list.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest
import trio
import trio.testing

from mcpvisor.store import state_pg
from mcpvisor.store.proposals import new_proposal
from mcpvisor.store.state_pg import PostgresState, follow
from mcpvisor.supervisor.config import load, loads
from mcpvisor.supervisor.shared import SharedProposals, SharedState
from mcpvisor.supervisor.supervisor import Supervisor
from mcpvisor.wire.config import ServerConfig
from tests.support import postgres

postgres_cluster = postgres.cluster_fixture()
postgres_url = postgres.database_fixture()

BASE = loads(
    """
[servers.time]
command = "mcp-server-time"

[servers.echo]
command = "echo-server"

[tenants.team]
servers = ["time"]
""",
    source="base.toml",
)


@pytest.fixture
def shared(postgres_url: str):
    state = SharedState.open(postgres_url)
    yield state
    state.close()


def test_the_file_alone_when_nothing_changed_at_run_time(shared: SharedState) -> None:
    assert shared.overlay(BASE) == BASE


def test_the_latest_change_of_each_server_wins_over_the_file(shared: SharedState, postgres_url: str) -> None:
    time_server = BASE.servers["time"]
    shared.record_server("time", msgspec.structs.replace(time_server, enabled=False))
    shared.record_server("echo", msgspec.structs.replace(BASE.servers["echo"], quarantined=True))
    shared.record_server("time", msgspec.structs.replace(time_server, enabled=False, quarantined=True))

    other_replica = SharedState.open(postgres_url)
    try:
        config = other_replica.overlay(BASE)
    finally:
        other_replica.close()
    assert (config.servers["time"].enabled, config.servers["time"].quarantined) == (False, True)
    assert config.servers["echo"].quarantined is True
    assert config.tenants == BASE.tenants


def test_an_approved_proposal_keeps_its_tenant_through_later_changes(shared: SharedState) -> None:
    added = ServerConfig(command="gamma-server")
    shared.record_server("gamma", added, tenant="team")
    shared.record_server("gamma", msgspec.structs.replace(added, enabled=False))  # the operator disables it
    config = shared.overlay(BASE)
    assert config.tenants["team"].servers == ["time", "gamma"]
    assert config.servers["gamma"].enabled is False

    shared.record_server("gamma", None)  # removed: out of every tenant too
    config = shared.overlay(BASE)
    assert "gamma" not in config.servers and config.tenants["team"].servers == ["time"]


def test_a_row_this_version_cannot_read_is_skipped_not_fatal(shared: SharedState) -> None:
    shared.store.execute(
        "INSERT INTO server_changes (name, server, tenant, changed_at) VALUES (?, ?, '', 0)",
        ("time", '{"command": "x", "field_of_a_newer_version": 1}'),
    )
    assert shared.overlay(BASE) == BASE


def test_proposals_are_one_list_for_every_replica(shared: SharedState, postgres_url: str, tmp_path: Path) -> None:
    here = SharedProposals(shared.store, tmp_path)
    there_state = SharedState.open(postgres_url)
    try:
        there = SharedProposals(there_state.store, tmp_path)
        here.put(new_proposal("gamma", "add", config={"command": "gamma-server"}, tenant="team"))
        assert there.reload() is True
        assert [proposal.key for proposal in there] == ["team/gamma"]
        assert there.pop("team/gamma") is not None
        assert here.reload() is True and len(here) == 0
    finally:
        there_state.close()
    assert not (tmp_path / "proposals.json").exists()


class EndedOnConnect(PostgresState):
    """A store whose server ends the first connection made for LISTEN before it listens (a restart)."""

    ended = 0

    def connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        connection = super().connect(**kwargs)
        if not self.ended:
            self.ended += 1
            with super().connect() as admin:
                admin.execute("SELECT pg_terminate_backend(%s, 10000)", (connection.info.backend_pid,))
        return connection


class Heard(Exception):
    pass


async def test_a_listening_connection_ended_before_it_listens_is_made_again(postgres_url: str) -> None:
    store = EndedOnConnect(postgres_url)
    changes: list[frozenset[str]] = []

    async def on_change(moved: frozenset[str]) -> None:
        changes.append(moved)
        raise Heard  # enough: follow survived the ended connection and listens again

    try:
        with pytest.raises(Heard), trio.fail_after(30):
            await follow(store, frozenset({"servers"}), on_change, waiting="a test")
    finally:
        store.close()
    assert store.ended == 1 and changes == [frozenset({"servers"})]


def test_replicas_changing_proposals_at_once_keep_each_others_changes(
    shared: SharedState, postgres_url: str, tmp_path: Path
) -> None:
    here = SharedProposals(shared.store, tmp_path)
    there_state = SharedState.open(postgres_url)
    try:
        there = SharedProposals(there_state.store, tmp_path)  # neither reloads between the changes
        for store, name in ((here, "alpha"), (there, "beta")):
            store.put(new_proposal(name, "add", config={"command": f"{name}-server"}))
        assert [proposal.name for proposal in SharedProposals(shared.store, tmp_path)] == ["alpha", "beta"]
        # The operator drops alpha on one replica; a client proposes gamma on the other.
        assert here.pop("alpha") is not None
        there.put(new_proposal("gamma", "add", config={"command": "gamma-server"}))
        assert [proposal.name for proposal in SharedProposals(shared.store, tmp_path)] == ["beta", "gamma"]
        assert there.pop("alpha") is None  # already dropped: not dropped (or approved) twice
        beta = next(proposal for proposal in there if proposal.name == "beta")
        assert there.prune(["beta"]) == [beta]  # the operator has since configured a server "beta"
        assert here.reload() is True and [proposal.name for proposal in here] == ["gamma"]
    finally:
        there_state.close()
    assert not (tmp_path / "proposals.json").exists()


@contextmanager
def proposals_held(postgres_url: str) -> Iterator[Callable[[], None]]:
    """The proposals row locked by another client of the store, as a stuck transaction would; yields
    the release, which also comes by itself after a while, so a test that blocks on it ends."""
    holder = psycopg.connect(postgres_url)
    holder.execute("INSERT INTO documents (name, body) VALUES ('proposals', '{}') ON CONFLICT (name) DO NOTHING")
    holder.commit()
    holder.execute("SELECT body FROM documents WHERE name = 'proposals' FOR UPDATE")
    release = threading.Timer(40, holder.rollback)
    release.start()
    try:
        yield holder.rollback
    finally:
        release.cancel()
        holder.close()


def test_a_statement_stuck_on_the_store_fails_instead_of_waiting(
    shared: SharedState, postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state_pg, "STATEMENT_TIMEOUT", 1.0)
    store = SharedState.open(postgres_url)
    try:
        proposals = SharedProposals(store.store, tmp_path)
        with proposals_held(postgres_url), pytest.raises(OSError, match="statement timeout"):
            proposals.put(new_proposal("alpha", "add", config={"command": "alpha-server"}))
        assert len(proposals) == 0
    finally:
        store.close()


async def test_a_proposal_waiting_on_the_store_holds_up_nothing_else(
    shared: SharedState, postgres_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "mcpvisor.toml"
    path.write_text(f'[mcpvisor]\ndata_dir = "{tmp_path / "data"}"\n\n[servers.alpha]\ncommand = "alpha-server"\n')
    (tmp_path / "data").mkdir()
    config = load(path)
    sup = Supervisor(config, path, shared=shared, base=config)
    spec = sup.commands["server.propose"]
    order: list[str] = []

    async def propose() -> None:
        data = {"name": "beta", "action": "add", "config": {"url": "https://h.example/mcp"}}
        answer = await spec.handler(sup, spec.parse([], data))
        order.append("proposed" if answer["pending"] else "not proposed")

    with proposals_held(postgres_url) as release:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(propose)
            await trio.testing.wait_all_tasks_blocked()  # the proposal waits on the store
            order.append("served meanwhile")  # the supervisor's loop goes on
            release()
    assert order == ["served meanwhile", "proposed"]
    assert [proposal.name for proposal in sup.proposals] == ["beta"]
