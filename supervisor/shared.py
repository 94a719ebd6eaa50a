"""What the supervisor of one replica shares with the others through the store at `state_url`.

With a shared store the config file is the base every replica reads (on Kubernetes, a read-only
ConfigMap) and is never written: the operator's run-time changes to the servers (`ctl enable`,
`disable`, `block`, an approved proposal, a server added or removed) are rows of the store,
applied over the file by every replica, and so are the clients' pending proposals. A change is
announced with NOTIFY and each replica's supervisor applies it at once; it also re-reads every
few seconds, in case a notification was lost with a connection.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final, TypeVar

import msgspec

from mcpvisor.store.proposals import FILE_NAME, Proposal, ProposalStore, ordered
from mcpvisor.store.state_db import PROPOSALS, SERVERS, notify, transaction
from mcpvisor.store.state_pg import PostgresState, follow
from mcpvisor.store.state_url import StateStoreError
from mcpvisor.supervisor import configstore
from mcpvisor.supervisor.config import Config
from mcpvisor.wire.config import ServerConfig

log = logging.getLogger(__name__)


class _Proposals(msgspec.Struct, kw_only=True):
    proposals: list[Proposal] = []


_EMPTY: Final = msgspec.json.encode(_Proposals()).decode()
_T = TypeVar("_T")


class SharedProposals(ProposalStore):
    """The pending proposals, kept as one document of the shared store instead of proposals.json."""

    def __init__(self, store: PostgresState, data_dir: Path) -> None:
        super().__init__(data_dir / FILE_NAME)  # the path is never written
        self.store = store
        self.reload()

    def reload(self) -> bool:
        """Read the proposals again (blocks on the store); whether they changed."""
        row = self.store.execute("SELECT body FROM documents WHERE name = 'proposals'").fetchone()
        items: dict[str, Proposal] = {}
        if row is not None:
            try:
                items = _decode(row[0])
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.error("the shared store's proposals cannot be read (%s); keeping those known", exc)
                return False
        changed = items != self._items
        self._items = items
        return changed

    def _update(self, change: Callable[[dict[str, Proposal]], tuple[_T, bool]]) -> _T:
        """`change` applied to the proposals as the store holds them now, the row locked meanwhile:
        replicas changing them at once change one list, in turn, and none writes back a list it
        read before another's change."""
        try:
            with transaction(self.store) as db:
                db.execute(
                    "INSERT INTO documents (name, body) VALUES ('proposals', ?) ON CONFLICT (name) DO NOTHING",
                    (_EMPTY,),
                )
                row = db.execute("SELECT body FROM documents WHERE name = 'proposals' FOR UPDATE").fetchone()
                try:
                    items = _decode(row[0])
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    # Written by a newer version, perhaps: not overwritten with what this one knows.
                    raise OSError(f"the shared store's proposals cannot be read ({exc})") from None
                result, changed = change(items)
                if changed:
                    body = msgspec.json.encode(_Proposals(proposals=ordered(items.values()))).decode()
                    db.execute("UPDATE documents SET body = ? WHERE name = 'proposals'", (body,))
                    notify(db, PROPOSALS)
        except StateStoreError as exc:
            # The callers handle OSError, as for a file that cannot be written.
            raise OSError(str(exc)) from None
        self._items = items
        return result


def _decode(body: str) -> dict[str, Proposal]:
    return {proposal.key: proposal for proposal in msgspec.json.decode(body, type=_Proposals).proposals}


class SharedState:
    """The supervisor's side of the shared store."""

    def __init__(self, store: PostgresState) -> None:
        self.store = store

    @classmethod
    def open(cls, state_url: str) -> SharedState:
        """Connect and bring the schema up to date; StateStoreError (no password in it) when it cannot."""
        store = PostgresState(state_url, max_size=2)
        store.migrate()
        return cls(store)

    def overlay(self, base: Config) -> Config:
        """`base` (the config file) with every run-time change of the store applied, oldest first."""
        rows = self.store.execute("SELECT name, server, tenant FROM server_changes ORDER BY seq").fetchall()
        config = base
        for name, table, tenant in rows:
            try:
                server = None if table is None else msgspec.convert(json.loads(table), ServerConfig)
            except (ValueError, msgspec.ValidationError) as exc:
                log.error("the shared store's change to server %r cannot be read (%s); ignored", name, exc)
                continue
            config = configstore.with_server(config, name, server, tenant=tenant)
        return config

    def record_server(self, name: str, server: ServerConfig | None, *, tenant: str = "") -> None:
        """Keep one server's new table (None: removed) as the latest run-time change to it, and announce it."""
        table = None if server is None else json.dumps(msgspec.to_builtins(server))
        with transaction(self.store) as db:
            # A later change keeps the tenant an approved proposal added the server for.
            db.execute(
                "INSERT INTO server_changes (name, server, tenant, changed_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET server = excluded.server,"
                " tenant = CASE WHEN excluded.tenant <> '' THEN excluded.tenant ELSE server_changes.tenant END,"
                " seq = nextval(pg_get_serial_sequence('server_changes', 'seq')), changed_at = excluded.changed_at",
                (name, table, tenant, time.time()),
            )
            notify(db, SERVERS)

    async def serve_watching(
        self, on_servers: Callable[[], Awaitable[None]], on_proposals: Callable[[], Awaitable[None]]
    ) -> None:
        """Call `on_servers` / `on_proposals` when another replica changed them, and every few seconds."""

        async def apply(moved: frozenset[str]) -> None:
            if PROPOSALS in moved:
                await on_proposals()
            if SERVERS in moved:
                await on_servers()

        await follow(self.store, frozenset({SERVERS, PROPOSALS}), apply, waiting="run-time changes of other replicas")

    def close(self) -> None:
        self.store.close()
