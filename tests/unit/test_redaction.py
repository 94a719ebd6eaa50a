"""Secrets in free text (log lines, error messages) are redacted; ordinary text is left alone."""

from __future__ import annotations

from itertools import pairwise

import pytest

from mcpvisor.wire.redaction import redact_secrets, redact_url, secret_spans

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
        ("connecting to postgres://user:pass@host/db", "connecting to postgres://user:***@host/db"),
        ("redis://:p4ss@cache:6379/0 refused", "redis://:***@cache:6379/0 refused"),
        # An unencoded `@` in the password must not leave its tail visible.
        ("dsn='mysql://app:p@ss@db/app'", "dsn='mysql://app:***@db/app'"),
        ("GET /callback?access_token=ya29.a0AfH6&state=xyz", "GET /callback?access_token=***&state=xyz"),
        (
            "fetch https://bucket/obj?X-Amz-Signature=abcdef123456&X-Amz-Date=20260101",
            "fetch https://bucket/obj?X-Amz-Signature=***&X-Amz-Date=20260101",
        ),
        ("https://maps/api?key=short&zoom=3", "https://maps/api?key=***&zoom=3"),
    ],
)
def test_credentials_in_urls_are_redacted_whatever_they_look_like(line: str, expected: str) -> None:
    assert redact_secrets(line) == expected


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        # The password of the user info; the user stays, so an operator can tell which account.
        ("https://user:pw@host.example/mcp", "https://user:***@host.example/mcp"),
        ("postgresql://app:s3cret@db:5432/mcpvisor", "postgresql://app:***@db:5432/mcpvisor"),
        ("redis://:p4ss@cache:6379/0", "redis://:***@cache:6379/0"),
        ("postgresql://app@db/mcpvisor", "postgresql://app@db/mcpvisor"),
        ("https://user@host/path", "https://user@host/path"),
        # Query and fragment parameters whose name says secret, whatever the value looks like.
        ("https://h.example/mcp?token=s3cr3t-value&x=1", "https://h.example/mcp?token=***&x=1"),
        ("https://h.example/mcp?api_key=abc123secret&x=1", "https://h.example/mcp?api_key=***&x=1"),
        ("https://h/cb?code=xyz&state=1#access_token=abc", "https://h/cb?code=***&state=1#access_token=***"),
        ("https://h/mcp?apiKey=k&sig=s&X-Amz-Signature=a1", "https://h/mcp?apiKey=***&sig=***&X-Amz-Signature=***"),
        ("postgresql://db/x?sslmode=require&PassWord=p@ss", "postgresql://db/x?sslmode=require&PassWord=***"),
        ("postgresql://app@db/x?password=s3cret&sslmode=require", "postgresql://app@db/x?password=***&sslmode=require"),
        ("https://h/a?x=1;token=zz", "https://h/a?x=1;token=***"),
        ("https://h/mcp?page=2&sort=asc", "https://h/mcp?page=2&sort=asc"),
        # A reference names where the secret lives: shown as written, as in env and header listings.
        ("postgresql://app:${env:PG_PASSWORD}@db/mcpvisor", "postgresql://app:${env:PG_PASSWORD}@db/mcpvisor"),
        (
            "postgresql://app:${file:/run/secrets/pg}@db/mcpvisor",
            "postgresql://app:${file:/run/secrets/pg}@db/mcpvisor",
        ),
        ("postgresql://db/x?sslpassword=${env:KEY_PW}", "postgresql://db/x?sslpassword=${env:KEY_PW}"),
        ("https://h/mcp?token=abc${env:T}", "https://h/mcp?token=***"),
        # Tokens that look like one, wherever they stand.
        ("https://ghp_aB3dE5gH7jK9mN1pQ3rS5@github.com/o/r", "https://ghp_<redacted>@github.com/o/r"),
        ("https://h/mcp?q=ghp_aB3dE5gH7jK9mN1pQ3rS5", "https://h/mcp?q=ghp_<redacted>"),
        # The host shown is the one a client connects to (RFC 3986), whatever `@` follows.
        ("https://u:p@evil.example/@good.example", "https://u:***@evil.example/@good.example"),
        ("http://host:8080/path@v2", "http://host:8080/path@v2"),
        ("https://[::1]:8080/mcp?sig=abc", "https://[::1]:8080/mcp?sig=***"),
        # No valid port: the password held an unencoded `/` and runs to the last `@`.
        ("postgres://app:p@ss:w/rd@db/x?sslmode=require", "postgres://app:***@db/x?sslmode=require"),
        ("postgresql://app:hunter22/x@db/x", "postgresql://app:***@db/x"),
        ("postgresql://app:lit%40eral-pw@[::1/mcpvisor", "postgresql://app:***@[::1/mcpvisor"),
        # Not a URL one can take apart: none of it.
        ("not a url at all", "***"),
        ("https://h/mcp?token=a b", "***"),
        ("", ""),
    ],
)
def test_a_url_is_shown_without_its_password_and_secret_parameters(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.mark.parametrize(
    "url",
    [
        "https://user:pw@host.example/mcp?token=s3cr3t-value&x=1",
        "postgresql://app:${env:PG_PASSWORD}@db/mcpvisor?sslpassword=lit&sslmode=require",
        "postgres://app:p@ss:w/rd@db/x",
        "https://h/cb?code=xyz&state=1#access_token=abc",
    ],
)
# A URL ends at a space, a quote or an angle bracket; a bracket written right after a secret value
# is hidden with it (a value may hold one), so these texts leave a space or a quote.
@pytest.mark.parametrize("around", ["{}", "connect to {} failed", "url '{}': 401", '{{"url": "{}"}}', "GET {}\n"])
def test_a_url_inside_a_text_reads_as_it_does_alone(url: str, around: str) -> None:
    assert redact_secrets(around.format(url)) == around.format(redact_url(url))


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
