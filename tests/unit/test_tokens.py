"""Access tokens: stored as hashes, checked at once after a revocation, read from secret files."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mcpvisor.frontend.endpoints.auth import Authenticator, InvalidToken, Principal
from mcpvisor.store.state_db import open_state_db
from mcpvisor.store.tokens import PREFIX, TokenError, TokenStore, parse_expiry, read_token_file
from mcpvisor.wire.config import TenantConfig


def store(tmp_path: Path) -> TokenStore:
    return TokenStore(open_state_db(str(tmp_path)))


def test_only_a_hash_is_kept_and_a_revocation_holds_at_once(tmp_path: Path) -> None:
    tokens = store(tmp_path)
    info, token = tokens.add("alice")
    assert token.startswith(PREFIX) and len(token) > 40
    raw = (tmp_path / "state.sqlite").read_bytes()
    assert token.encode() not in raw
    assert tokens.check(token) is not None and tokens.check(token).tenant == "alice"  # type: ignore[union-attr]
    # Another connection (the `mcpvisor token` command) revokes it: the next check refuses it.
    other = store(tmp_path)
    other.revoke(info.id)
    assert tokens.check(token) is None
    with pytest.raises(TokenError, match="no token with id"):
        other.revoke(info.id)


def test_expired_unknown_and_odd_tokens_are_refused(tmp_path: Path) -> None:
    tokens = store(tmp_path)
    _info, token = tokens.add("bob", expires=time.time() + 60)
    assert tokens.check(token) is not None
    assert tokens.check(token, now=time.time() + 120) is None
    assert tokens.check(token[:-1] + ("A" if token[-1] != "A" else "B")) is None
    assert tokens.check("not-ours") is None
    assert tokens.check(PREFIX + "x" * 500) is None


def test_last_used_is_recorded_and_listing_never_shows_the_token(tmp_path: Path) -> None:
    tokens = store(tmp_path)
    info, token = tokens.add("carol", admin=True)
    assert tokens.list()[0].last_used is None
    tokens.check(token)
    (row,) = tokens.list()
    assert row.id == info.id and row.admin and row.last_used is not None
    assert token not in repr(row.as_row())


def test_expiry_words() -> None:
    now = 1_000_000.0
    assert parse_expiry("30d", now=now) == now + 30 * 86400
    assert parse_expiry("90m", now=now) == now + 5400
    assert parse_expiry("2999-01-31") > time.time()
    for bad in ("soon", "-5d", "0s", "2001-01-01"):
        with pytest.raises(TokenError):
            parse_expiry(bad, now=time.time())


def test_a_token_file_error_names_the_file_not_its_content(tmp_path: Path) -> None:
    short = tmp_path / "short"
    short.write_text("tiny-secret")
    with pytest.raises(TokenError) as failure:
        read_token_file(str(short))
    assert "tiny-secret" not in str(failure.value) and str(short) in str(failure.value)
    with pytest.raises(TokenError, match="cannot read"):
        read_token_file(str(tmp_path / "missing"))
    good = tmp_path / "good"
    good.write_text("k" * 40 + "\n")
    assert read_token_file(str(good)) == "k" * 40


def scope(authorization: str | None) -> dict:
    headers = [(b"authorization", authorization.encode())] if authorization is not None else []
    return {"headers": headers}


@pytest.mark.trio
async def test_the_authenticator_makes_principals(tmp_path: Path) -> None:
    tokens = store(tmp_path)
    secret = tmp_path / "alice_file"
    secret.write_text("f" * 48)
    tenants = {"alice": TenantConfig(servers=[], token_files=[str(secret)]), "bob": TenantConfig()}
    _info, bob = tokens.add("bob")
    _info, admin = tokens.add("ops", admin=True)
    _info, gone = tokens.add("gone")
    auth = Authenticator(tokens, tenants)

    assert await auth.principal(scope(f"Bearer {bob}")) == Principal(
        tenant="bob", admin=False, token_id=_tid(tokens, "bob"), subject=f"token {_tid(tokens, 'bob')}"
    )
    assert (await auth.principal(scope(f"bearer {admin}"))).admin is True
    assert (await auth.principal(scope("Bearer " + "f" * 48))).tenant == "alice"
    for header, given in ((None, False), ("Basic abc", False), (f"Bearer {gone}", True), ("Bearer eyJ.x.y", True)):
        with pytest.raises(InvalidToken) as failure:
            await auth.principal(scope(header))
        assert failure.value.given is given
    challenge = auth.challenge("the token is unknown").decode()
    assert challenge.startswith('Bearer realm="mcpvisor"') and 'error="invalid_token"' in challenge


def _tid(tokens: TokenStore, tenant: str) -> str:
    return next(row.id for row in tokens.list() if row.tenant == tenant)
