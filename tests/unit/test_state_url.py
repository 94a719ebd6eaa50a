"""`state_url`: what is accepted, what is shown, and how a referenced password enters the URL."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest

from mcpvisor.store.state_url import StateStoreError, check_url, resolve_url
from mcpvisor.supervisor.config import loads
from mcpvisor.wire.config import ConfigError


def test_a_referenced_password_is_resolved_and_percent_encoded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    password = "p@ss/w:rd%?#"
    monkeypatch.setenv("PG_PASSWORD", password)
    resolved, redactor = resolve_url("postgresql://app:${env:PG_PASSWORD}@db:5432/mcpvisor")
    parts = urlsplit(resolved)
    assert (parts.hostname, parts.port, parts.username, parts.path) == ("db", 5432, "app", "/mcpvisor")
    assert parts.password is not None and password not in resolved
    assert redactor(f"error near {password}") == "error near ***"

    secret_file = tmp_path / "pg"
    secret_file.write_text(password + "\n")
    resolved, _ = resolve_url(f"postgresql://app:${{file:{secret_file}}}@db/mcpvisor")
    assert urlsplit(resolved).hostname == "db" and password not in resolved


def test_a_reference_that_cannot_be_resolved_names_itself_not_a_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PG_NOT_SET", raising=False)
    with pytest.raises(StateStoreError) as caught:
        resolve_url("postgresql://app:${env:PG_NOT_SET}@db/mcpvisor")
    assert "PG_NOT_SET" in str(caught.value) and "postgresql://app:${env:PG_NOT_SET}@db/mcpvisor" in str(caught.value)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("mysql://app:hunter22@db/x", "must start with postgresql://"),
        ("sqlite:///tmp/x", "must start with postgresql://"),
        ("postgresql://app:${env:1BAD}@db/x", "bad variable name"),
        ("postgresql://app@db/x?password=hunter22", "give the password in the user info"),
        ("postgresql://app@db/x?sslmode=require&sslpassword=hunter22", "give the password in the user info"),
        ("postgresql://app:p@sshunter22@127.0.0.1/x", "must be percent-encoded"),
        ("postgresql://app:hunter22/x@db/x", "must be percent-encoded"),
    ],
)
def test_the_loader_refuses_what_is_not_a_postgresql_url_without_showing_the_password(url: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        loads(f'[mcpvisor]\nstate_url = "{url}"\n', source="mcpvisor.toml")
    message = str(caught.value)
    assert problem in message and message.startswith("mcpvisor.toml:2:")
    assert "hunter22" not in message


def test_without_state_url_the_store_stays_sqlite() -> None:
    assert loads("[mcpvisor]\n", source="x").mcpvisor.state_url is None
    check_url("postgresql://app:${env:PG_PASSWORD}@db/mcpvisor")  # accepted as it is; nothing resolved yet
    check_url("postgresql://app:p%40ss%2Fw@db/mcpvisor?sslpassword=${file:/run/secrets/key}")


def test_a_password_in_the_query_is_hidden_from_the_errors_of_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PG_QUERY_PASSWORD", "s3cr@t/pw")
    _, redactor = resolve_url("postgresql://app@db/x?password=${env:PG_QUERY_PASSWORD}&sslpassword=lit%40eral")
    assert redactor("near s3cr@t/pw, s3cr%40t%2Fpw, lit%40eral and lit@eral") == "near ***, ***, *** and ***"


@pytest.mark.parametrize("password", ["lit%40eral-pw", "${env:PG_ODD_PASSWORD}"])
def test_a_url_libpq_cannot_parse_is_quoted_back_without_its_password(
    password: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mcpvisor.store.state_pg import PostgresState

    monkeypatch.setenv("PG_ODD_PASSWORD", "s3cr@t/pw")
    with pytest.raises(StateStoreError) as caught:
        PostgresState(f"postgresql://app:{password}@[::1/mcpvisor").migrate()  # an unclosed IPv6 bracket
    message = str(caught.value)
    assert "IPv6" in message and "app:***@" in message
    for secret in ("lit%40eral-pw", "lit@eral-pw", "s3cr@t/pw", "s3cr%40t%2Fpw"):
        assert secret not in message
