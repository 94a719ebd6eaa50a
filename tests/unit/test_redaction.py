"""Secrets in free text (log lines, error messages) are redacted; ordinary text is left alone."""

from __future__ import annotations

from itertools import pairwise

import pytest

from mcpvisor.wire.redaction import redact_secrets, secret_spans

GITHUB_TOKEN = "ghp_aB3dE5gH7jK9mN1pQ3rS5"
OPENAI_KEY = "sk-proj-Xy7Qw2Er4Ty6Ui8Op0As"
AWS_KEY_ID = "AKIAIOSFODNN7EXAMPLE"
SLACK_TOKEN = "xoxb-1234567890-AbCdEfGhIj"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.Sfl2KxwRJSMeKKF2QT4f"
RANDOM_TOKEN = "KzV8w3Qp9XyT2mLr7NcB4aHdF6gJ1sEu"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (f"clone failed with {GITHUB_TOKEN}: 401", "clone failed with ghp_<redacted>: 401"),
        (f"upstream said: invalid key {OPENAI_KEY}", "upstream said: invalid key sk-<redacted>"),
        (f"using {AWS_KEY_ID} in eu-west-1", "using <redacted> in eu-west-1"),
        (f"posting with {SLACK_TOKEN}", "posting with xoxb-<redacted>"),
        (f"token {JWT} expired", "token <redacted> expired"),
        (
            "-----BEGIN RSA PRIVATE KEY-----\nMIIEow3\n-----END RSA PRIVATE KEY----- read",
            "<redacted> read",
        ),
    ],
)
def test_provider_tokens_and_keys_are_redacted_keeping_only_their_public_head(line: str, expected: str) -> None:
    assert redact_secrets(line) == expected


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("Authorization: Bearer abc.def-123_456", "Authorization: Bearer <redacted>"),
        ("authorization: basic dXNlcjpwYXNzd29yZA==", "authorization: basic <redacted>"),
        ("connect failed: password=hunter2x user=bob", "connect failed: password=<redacted> user=bob"),
        ('{"api_key": "AbC123xyz789"}', '{"api_key": "<redacted>"}'),
        ("CLIENT_SECRET=9f8e7d6c5b4a", "CLIENT_SECRET=<redacted>"),
    ],
)
def test_credentials_in_headers_and_assignments_are_redacted(line: str, expected: str) -> None:
    assert redact_secrets(line) == expected


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("connecting to postgres://user:pass@host/db", "connecting to postgres://user:<redacted>@host/db"),
        ("redis://:p4ss@cache:6379/0 refused", "redis://:<redacted>@cache:6379/0 refused"),
        # An unencoded `@` in the password must not leave its tail visible.
        ("dsn='mysql://app:p@ss@db/app'", "dsn='mysql://app:<redacted>@db/app'"),
        (
            "GET /callback?access_token=ya29.a0AfH6&state=xyz",
            "GET /callback?access_token=<redacted>&state=xyz",
        ),
        (
            "fetch https://bucket/obj?X-Amz-Signature=abcdef123456&X-Amz-Date=20260101",
            "fetch https://bucket/obj?X-Amz-Signature=<redacted>&X-Amz-Date=20260101",
        ),
        ("https://maps/api?key=short&zoom=3", "https://maps/api?key=<redacted>&zoom=3"),
    ],
)
def test_credentials_in_urls_are_redacted_whatever_they_look_like(line: str, expected: str) -> None:
    assert redact_secrets(line) == expected


def test_long_random_tokens_are_redacted_with_their_length() -> None:
    assert redact_secrets(f"session {RANDOM_TOKEN} closed") == "session <redacted 32 chars> closed"


@pytest.mark.parametrize(
    "line",
    [
        "the token expires in 5 minutes",
        "password: required",
        "pwd: short",
        "Restarting worker time after 3 failures (exit status 1)",
        "see https://example.com/docs?page=2&sort=asc for details",
        "git@github.com:org/repo.git",
        "https://user@host/path",
        "http://host:8080/path@v2",
        "a_very_long_identifier_name_without_any_digits_at_all",
        "Bearer tokens are read from the Authorization header.",
    ],
)
def test_plain_prose_urls_and_short_words_are_untouched(line: str) -> None:
    assert redact_secrets(line) == line


def test_spans_are_ordered_disjoint_and_cover_every_secret() -> None:
    line = f"a {GITHUB_TOKEN} b password=hunter2x c postgres://u:pw@h/db d {RANDOM_TOKEN} e"
    spans = secret_spans(line)
    assert len(spans) == 4
    for (_, end, _), (start, _, _) in pairwise(spans):
        assert end <= start
    covered = "".join(line[start:end] for start, end, _ in spans)
    for secret in (GITHUB_TOKEN, "hunter2x", "pw", RANDOM_TOKEN):
        assert secret in covered


def test_findings_only_leaves_out_what_is_redacted_but_proves_nothing() -> None:
    """Placeholders in URLs and hashes are redacted, but are no evidence of a live secret."""
    placeholders = f"postgres://user:password@localhost/db?api_key=YOUR_KEY commit {RANDOM_TOKEN}"
    assert len(secret_spans(placeholders)) == 3
    assert secret_spans(placeholders, findings_only=True) == []
    live = f"export GITHUB_TOKEN={GITHUB_TOKEN}"
    assert [label for _, _, label in secret_spans(live, findings_only=True)] == ["ghp_<redacted>"]


@pytest.mark.parametrize(
    "line",
    [
        '  File "/usr/lib/python3.11/site-packages/mcp/server/streamable_http.py", line 381, in run',
        "error python3.11/site-packages/anyio/_backends/_asyncio_task.py:381 boom",
        "/home/me/.venv/lib/python3.12/site-packages/mcp/server/lowlevel/server.py:381",
    ],
)
def test_a_source_path_in_a_log_line_is_left_whole(line: str) -> None:
    """`ctl tail` showed `python3.<redacted 42 chars>.py:381`: a path of words is no token."""
    assert redact_secrets(line) == line


def test_a_token_with_slashes_is_still_redacted() -> None:
    assert "aGVsbG8" not in redact_secrets("key aGVsbG8gd29ybGQ/Zm9vYmFyYmF6cXV4/MTIzNDU2Nzg5MA== x")
