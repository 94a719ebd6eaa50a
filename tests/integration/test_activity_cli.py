"""`mcpvisor activity verify` and `activity export`, run as an operator runs them, on SQLite and PostgreSQL.

Given an activity log written by the frontend's ActivityLog, verify exits 0 and prints the newest
hash; after an edit it names the edited row, after a deletion the row after it, and exits 1.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from mcpvisor.frontend.gate.activity import ActivityLog
from mcpvisor.frontend.gate.store_writer import StoreWriter
from mcpvisor.store.state_db import open_state_db
from mcpvisor.store.state_pg import PostgresState
from tests.support import postgres

postgres_cluster = postgres.cluster_fixture()
postgres_url = postgres.database_fixture()

MCPVISOR = [sys.executable, "-m", "mcpvisor.supervisor.cli"]


def mcpvisor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MCPVISOR, *args], capture_output=True, text=True, timeout=60, check=False)


def write_calls(db: object, count: int = 5) -> None:
    writer = StoreWriter(db)
    log = ActivityLog(db, writer=writer)
    for n in range(count):
        log.record(
            server="time",
            tool="get_current_time",
            variant="direct",
            intent=None,
            outcome="ok",
            duration=0.01 * n,
            tenant="alice",
            decision="allow",
            policies=("base",),
        )
    writer.run_pending()  # the shared store's rows wait for the writer's thread otherwise


@pytest.fixture
def sqlite_config(tmp_path: Path) -> Path:
    config = tmp_path / "mcpvisor.toml"
    config.write_text('[mcpvisor]\ndata_dir = "data"\n\n[servers.time]\ncommand = "mcp-server-time"\n')
    db = open_state_db(str(tmp_path / "data"))
    write_calls(db)
    db.close()
    return config


def tamper(config: Path, sql: str) -> None:
    db = sqlite3.connect(config.parent / "data" / "state.sqlite")
    db.execute(sql)
    db.commit()
    db.close()


def test_an_intact_log_verifies_and_names_its_newest_hash(sqlite_config: Path) -> None:
    done = mcpvisor("activity", "verify", "-c", str(sqlite_config))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "activity log intact: 5 rows chained (ids 1 to 5)"
    assert lines[1].startswith("newest hash: ") and len(lines[1].split()[-1]) == 64


def test_an_edited_row_is_named_and_verify_fails(sqlite_config: Path) -> None:
    tamper(sqlite_config, "UPDATE calls SET outcome = 'error' WHERE id = 3")
    done = mcpvisor("activity", "verify", "-c", str(sqlite_config))
    assert done.returncode == 1
    assert done.stdout.splitlines()[0] == (
        "activity log: NOT intact: row 3: its contents do not match its hash: it was changed after it was written"
    )
    assert "rows checked and matching before it: 2 (up to id 2)" in done.stdout


def test_a_deleted_row_is_named_by_the_row_after_it_and_verify_fails(sqlite_config: Path) -> None:
    tamper(sqlite_config, "DELETE FROM calls WHERE id = 2")
    done = mcpvisor("activity", "verify", "-c", str(sqlite_config), "--json")
    assert done.returncode == 1
    verdict = json.loads(done.stdout)
    assert (verdict["intact"], verdict["bad_id"], verdict["last_good_id"]) == (False, 3, 1)
    assert verdict["problem"] == (
        "row 3: it does not follow row 1: a row between them was deleted, or row 1 was changed and given a new hash"
    )


def test_export_writes_json_lines_that_carry_the_chain(sqlite_config: Path, tmp_path: Path) -> None:
    out = tmp_path / "activity.jsonl"
    done = mcpvisor("activity", "export", "-c", str(sqlite_config), "-o", str(out), "--after", "1")
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["id"] for row in rows] == [2, 3, 4, 5]
    assert all(row["prev_hash"] == before["hash"] for before, row in itertools.pairwise(rows))
    assert (
        rows[0]["tenant"] == "alice"
        and rows[0]["decision"] == "allow"
        and rows[0]["policies"] == '["base"]'
        and rows[0]["timestamp"].endswith("+00:00")
    )


def test_no_log_yet_is_nothing_to_verify(tmp_path: Path) -> None:
    config = tmp_path / "mcpvisor.toml"
    config.write_text('[mcpvisor]\ndata_dir = "nothing-here"\n')
    done = mcpvisor("activity", "verify", "-c", str(config))
    assert (done.returncode, done.stdout.strip()) == (0, "activity log: empty (no state store yet): nothing to verify")
    assert not (tmp_path / "nothing-here").exists()  # verify writes nothing


def test_verify_on_the_shared_store(postgres_url: str, tmp_path: Path) -> None:
    store = PostgresState(postgres_url)
    store.migrate()
    write_calls(store, 8)
    config = tmp_path / "replica.toml"
    config.write_text(f'[mcpvisor]\nstate_url = "{postgres_url}"\n')
    done = mcpvisor("activity", "verify", "-c", str(config))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("activity log intact: 8 rows chained")
    store.execute("DELETE FROM calls WHERE id = 5")
    done = mcpvisor("activity", "verify", "-c", str(config))
    assert done.returncode == 1
    assert "row 6: it does not follow row 4" in done.stdout
    store.close()
