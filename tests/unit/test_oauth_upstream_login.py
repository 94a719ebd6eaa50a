"""The pieces of an upstream login that need no process: token files, names, the config table."""

from __future__ import annotations

import stat
from pathlib import Path

import msgspec
import pytest

from mcpvisor.store import oauth_store
from mcpvisor.store.oauth_store import redirect_uri
from mcpvisor.supervisor.commands.status import describe_expiry
from mcpvisor.wire.config import ServerConfig


def test_a_tenants_worker_gets_its_own_file_and_the_slash_is_escaped(tmp_path: Path) -> None:
    plain = oauth_store.token_path(tmp_path, "github")
    tenant = oauth_store.token_path(tmp_path, "acme/github")
    assert plain.name == "github.json"
    assert tenant.name == "acme%2Fgithub.json"
    assert tenant.parent == plain.parent == tmp_path / "oauth"
    # A server name cannot spell another worker's file: names never contain '%'.
    assert oauth_store.token_path(tmp_path, "acme.github") != tenant


def test_the_token_file_is_private_and_replaced_whole(tmp_path: Path) -> None:
    path = oauth_store.token_path(tmp_path, "acme/github")
    oauth_store.save(path, oauth_store.TokenFile(tokens={"access_token": "a1"}, expires_at=1000.0))
    oauth_store.save(path, oauth_store.TokenFile(tokens={"access_token": "a2"}, expires_at=2000.0))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind
    assert oauth_store.load(path).tokens == {"access_token": "a2"}
    assert oauth_store.expires_at(path) == 2000.0


def test_no_token_means_no_expiry_and_a_broken_file_means_no_login(tmp_path: Path) -> None:
    path = oauth_store.token_path(tmp_path, "x")
    assert oauth_store.expires_at(path) is None
    oauth_store.save(path, oauth_store.TokenFile(expires_at=5.0))
    assert oauth_store.expires_at(path) is None
    path.write_text("{not json")
    assert oauth_store.load(path) == oauth_store.TokenFile()
    assert oauth_store.remove(path) and not oauth_store.remove(path)


@pytest.mark.parametrize(
    ("listen", "uri"),
    [
        ("127.0.0.1:8080", "http://127.0.0.1:8080/oauth/callback"),
        ("0.0.0.0:9000", "http://127.0.0.1:9000/oauth/callback"),
        ("[::]:9000", "http://[::1]:9000/oauth/callback"),
        ("[::1]:9000", "http://[::1]:9000/oauth/callback"),
        ("gateway.internal:443", "http://gateway.internal:443/oauth/callback"),
    ],
)
def test_the_redirect_uri_is_the_listeners_callback(listen: str, uri: str) -> None:
    assert redirect_uri(listen) == uri


def test_expiry_reads_like_a_person_would_say_it() -> None:
    assert describe_expiry(1000 + 3599, now=1000) == "token expires in 59m"
    assert describe_expiry(1000 + 7260, now=1000) == "token expires in 2h01m"
    assert describe_expiry(1000 + 30, now=1000) == "token expires in 30s"
    assert describe_expiry(1000 - 180, now=1000) == "token expired 3m ago"


def test_the_oauth_table_takes_a_secret_reference_and_never_the_secret() -> None:
    server = msgspec.convert(
        {"url": "https://x/mcp", "oauth": {"client_id": "id", "client_secret": "${file:/run/secret}"}}, ServerConfig
    )
    assert server.oauth is not None and server.oauth.client_secret == "${file:/run/secret}"
    with pytest.raises(msgspec.ValidationError, match="must be a reference"):
        msgspec.convert({"url": "https://x/mcp", "oauth": {"client_secret": "hunter2"}}, ServerConfig)
    with pytest.raises(msgspec.ValidationError, match="unknown field"):
        msgspec.convert({"url": "https://x/mcp", "oauth": {"scope": "a"}}, ServerConfig)
