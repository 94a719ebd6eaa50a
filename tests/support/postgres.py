"""A throwaway PostgreSQL cluster for tests: Debian's `postgresql` binaries, a temp dir, a free loopback port.

A test module takes the two fixtures as its own attributes:

    from tests.support import postgres

    postgres_cluster = postgres.cluster_fixture()  # one cluster per module: initdb costs a few seconds
    postgres_url = postgres.database_fixture()  # a fresh database of it per test, as a URL with a password

Where the binaries are missing the tests skip with `system package missing: postgresql`.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any

import pytest

from tests.support.stack import free_port


def _binaries() -> Path:
    """Debian's newest PostgreSQL (its binaries are not on PATH), or MCPVISOR_TEST_PG_BIN."""
    if configured := os.environ.get("MCPVISOR_TEST_PG_BIN"):
        return Path(configured)
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0
    )
    return found[-1].parent if found else Path("/usr/lib/postgresql/15/bin")


BIN = _binaries()
SUPERUSER = "postgres"
MISSING = "system package missing: postgresql"


@dataclass
class PostgresCluster:
    """A running cluster: where it listens, its superuser's password, and its files."""

    port: int
    password: str
    directory: Path

    @property
    def data(self) -> Path:
        return self.directory / "data"

    def stop(self) -> None:
        """Stop the server at once (as a crash would), keeping its files; `start` brings it back."""
        _run([str(BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"])

    def start(self) -> None:
        """Start the server again, on the same port."""
        log = ["-l", str(self.directory / "server.log")]
        _run(
            [str(BIN / "pg_ctl"), "-D", str(self.data), *log, "-w", "-o", _options(self.port, self.directory), "start"]
        )

    def url(self, database: str = "postgres", *, user: str = SUPERUSER, password: str | None = None) -> str:
        secret = self.password if password is None else password
        return f"postgresql://{user}:{secret}@127.0.0.1:{self.port}/{database}"

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run SQL as the superuser over the cluster's Unix socket; the output rows, unaligned."""
        where = ["-h", str(self.directory), "-p", str(self.port), "-U", SUPERUSER, "-d", database]
        result = _run([str(BIN / "psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", *where, "-c", sql])
        return result.stdout

    def create_database(self, name: str) -> str:
        """A new empty database; its URL (with the superuser's password)."""
        self.psql(f'CREATE DATABASE "{name}"')
        return self.url(name)


def available() -> bool:
    return all((BIN / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres", "psql"))


def _as_postgres() -> dict[str, Any]:
    """Run as the `postgres` user when the tests run as root: the server refuses to run as root."""
    if os.geteuid() != 0:
        return {}
    return {"user": SUPERUSER, "group": SUPERUSER, "extra_groups": []}


def _run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        command, capture_output=True, text=True, check=False, timeout=60, **_as_postgres(), **kwargs
    )
    if result.returncode != 0:
        raise RuntimeError(f"{Path(command[0]).name} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def _options(port: int, directory: Path) -> str:
    # Throwaway data: no fsync; the socket and the lock file stay inside the temp dir.
    return f"-c listen_addresses=127.0.0.1 -p {port} -k {directory} -c fsync=off -c full_page_writes=off"


@contextmanager
def running_postgres() -> Iterator[PostgresCluster]:
    """initdb, start on a free loopback port, yield, stop and delete everything."""
    if not available():
        pytest.skip(MISSING)
    # Not under pytest's tmp_path: its parents are 0700 root, and the server runs as `postgres`.
    directory = Path(tempfile.mkdtemp(prefix="mvpg", dir="/tmp"))
    if os.geteuid() == 0:
        shutil.chown(directory, SUPERUSER, SUPERUSER)
    data = directory / "data"
    password = secrets.token_urlsafe(16)
    password_file = directory / "pw"
    password_file.write_text(password + "\n")
    if os.geteuid() == 0:
        shutil.chown(password_file, SUPERUSER, SUPERUSER)
    port = free_port()
    try:
        auth = ["-U", SUPERUSER, f"--pwfile={password_file}", "--auth-host=scram-sha-256", "--auth-local=trust"]
        _run([str(BIN / "initdb"), "-D", str(data), *auth, "-E", "UTF8", "--no-instructions"])
        cluster = PostgresCluster(port, password, directory)
        cluster.start()
        yield cluster
    finally:
        if (data / "postmaster.pid").exists():
            with suppress(RuntimeError, subprocess.TimeoutExpired):
                _run([str(BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"])
        shutil.rmtree(directory, ignore_errors=True)


def cluster_fixture() -> Any:
    """A module-scoped fixture: a running cluster (`PostgresCluster`), stopped after the module."""

    @pytest.fixture(scope="module")
    def postgres_cluster() -> Iterator[PostgresCluster]:
        with running_postgres() as cluster:
            yield cluster

    return postgres_cluster


_databases = count(1)


def database_fixture() -> Any:
    """A fixture giving each test a fresh, empty database of `postgres_cluster`, as its URL."""

    @pytest.fixture
    def postgres_url(postgres_cluster: PostgresCluster) -> str:
        return postgres_cluster.create_database(f"t{os.getpid()}_{next(_databases)}")

    return postgres_url
