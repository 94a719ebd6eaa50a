"""What may be shown of a text, a URL or a table value: anything that looks like a secret is hidden.

Every room that writes text someone else reads (log lines, error messages, listings, reports)
redacts with `redact_secrets`, every URL it shows with `redact_url`, every env or header table with
`redact_table`; `secret_spans` gives the spans themselves, for callers that map them back onto a
text they have transformed. Unlike `secrets.Redactor`, which removes values known to be secret,
these rules recognize what merely looks like one.

A URL is shown the same way wherever it appears, alone or inside a longer text:
- the password of its user info becomes `***` (`https://user:***@host/`; the user name stays);
- so does the value of a query or fragment parameter whose name says it is a secret: its last
  word (`access_token`, `apiKey`, `X-Amz-Signature`, `code`) is one of `_SECRET_PARAMETER_WORDS`,
  or it ends with one of `_SECRET_PARAMETER_ENDINGS` (`sslpassword`, `accesstoken`);
- a value that is exactly one secret reference (`${env:NAME}`, `${file:PATH}`) is shown as
  written: it names where the secret lives, not the secret, as in env and header listings;
- anything else that looks like a token (`ghp_...`, a long random string) is hidden as in free text.
A URL is taken apart as RFC 3986 says (its host is the one a client connects to); only when that
reading gives no valid port, and an `@` follows, is the password taken to run to that `@` (an
unencoded `/` or `?` in it). A text that is not a URL is not shown at all (`***`).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping
from typing import Any

import msgspec

from mcpvisor.wire.secrets import REDACTED, SECRET_REF

_SECRET_PATTERNS: list[tuple[re.Pattern[str], bool]] = [
    # (pattern, keep the prefix up to the first separator)
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)", re.S), False),
    (re.compile(r"\b(?:sk|pk|rk)-(?:[A-Za-z0-9]+-)*[A-Za-z0-9_]{12,}"), True),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{16,}"), True),
    (re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"), True),
    (re.compile(r"\bglpat-[A-Za-z0-9_-]{16,}"), True),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"), True),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), False),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{30,}"), False),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{4,}"), False),
]
_SCHEME_SECRET = re.compile(r"(?i)\b(?:bearer|basic|token)\s+([A-Za-z0-9._~+/-]{8,}=*)")
_ASSIGNED_SECRET = re.compile(
    r"(?i)\b(?:api[_-]?key|apikey|access[_-]?key|secret(?:[_-]?key)?|client[_-]?secret|password|passwd|pwd"
    r"|token|auth)[\"']?\s*[:=]\s*[\"']?([^\s\"',;]{6,})"
)
# A URL inside free text: a scheme, `://`, and everything up to a space, a quote or an angle bracket.
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>]+")
# A host and port as RFC 3986 reads them: a bracketed IPv6 address or a name, then digits or nothing.
_HOST_PORT = re.compile(r"(?:\[[^\]]*\]|[^:\[\]]*)(?::[0-9]*)?")
# A parameter of a query or fragment, in a URL or in a request line (`GET /cb?code=...`). A value
# ends at `;` too, so that `a=1;token=...` cannot carry a token inside the value of `a`.
_QUERY_PARAMETER = re.compile(r"[?&;#]([A-Za-z][\w.-]{0,63})=([^&;#\s\"'<>]+)")
# The last word of a parameter's name that makes its value a secret (`access_token`, `apiKey`,
# `X-Amz-Signature`, OAuth's `code`), and the endings of names run together (`sslpassword`).
_SECRET_PARAMETER_WORDS = frozenset(
    {"token", "secret", "password", "passwd", "pwd", "pass", "key", "apikey", "sig", "signature", "auth"}
    | {"credential", "credentials", "session", "sessionid", "code"}
)
_SECRET_PARAMETER_ENDINGS = ("password", "passwd", "secret", "token", "apikey", "signature")
# The public, recognizable head of a provider token ("ghp_", "sk-", "github_pat_").
_TOKEN_PREFIX = re.compile(r"[A-Za-z]+[-_](?:pat_)?")
_LONG_TOKEN = re.compile(r"(?<![\w/+=-])[A-Za-z0-9+/_-]{32,}={0,2}(?![\w/+=-])")
# Header and variable names whose values are credentials even when written inline.
_SENSITIVE_NAME = re.compile(r"authorization|token|secret|key|cookie|passw|pwd|credential|private", re.I)


def _looks_random(value: str) -> bool:
    return any(ch.isdigit() for ch in value) and any(ch.isalpha() for ch in value)


def _is_secret_parameter(name: str) -> bool:
    words = re.split(r"[_.-]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower())
    return words[-1] in _SECRET_PARAMETER_WORDS or "".join(words).endswith(_SECRET_PARAMETER_ENDINGS)


def _without_references(text: str) -> str:
    """`text` with each secret reference blanked to as many `x`, so no `/`, `@` or `:` in one counts."""
    return SECRET_REF.sub(lambda match: "x" * len(match.group()), text)


def _url_password(url: str) -> tuple[int, int] | None:
    """Where the password of `url`'s user info stands (start, end), or None when it has none."""
    scheme_end = url.find("://")
    if scheme_end < 0:
        return None
    blank = _without_references(url)
    start = scheme_end + 3
    end = next((i for i in range(start, len(blank)) if blank[i] in "/?#"), len(blank))
    at = blank.rfind("@", start, end)
    host = blank[(at + 1 if at >= 0 else start) : end]
    if not _HOST_PORT.fullmatch(host) and (later := blank.rfind("@", end)) >= 0:
        # No client could connect to a port that is not a number: the password held an unencoded
        # `/`, `?` or `#`, and the user info runs to the last `@`.
        at = later
    if at < 0:
        return None
    colon = blank.find(":", start, at)
    return (colon + 1, at) if 0 <= colon < at - 1 else None


def _url_spans(text: str) -> list[tuple[int, int, str]]:
    """The user info passwords of the URLs in `text`."""
    spans = []
    for match in _URL.finditer(text):
        found = _url_password(match.group())
        if found is not None:
            spans.append((match.start() + found[0], match.start() + found[1], REDACTED))
    return spans


def _within(span: tuple[int, int, str], references: list[tuple[int, int]], starts: list[int]) -> bool:
    """Whether `span` lies inside one of `references` (ordered, apart, `starts` their starts)."""
    index = bisect.bisect_right(starts, span[0]) - 1
    return index >= 0 and span[1] <= references[index][1]


def secret_spans(text: str, *, findings_only: bool = False) -> list[tuple[int, int, str]]:
    """Spans of `text` that look like secrets, with the placeholder that replaces each.

    By default the spans also cover any long random-looking token (base64, hex) and every
    password in a URL or secret-named query parameter, whatever it looks like: all are redacted,
    but they are too common (hashes, ids, encoded data) or too often placeholders
    (`user:pass@host`, `?api_key=YOUR_KEY`) to be evidence of a live secret. `findings_only` keeps
    only the spans that are. A span that lies within a secret reference is none: the reference
    names where a secret lives.
    """
    # The list order is the priority: a URL's own rules first, so that a URL reads the same alone
    # and in a text; then a specific label ("ghp_<redacted>") before a generic one.
    spans: list[tuple[int, int, str]] = []
    if not findings_only:
        spans += _url_spans(text)
        for match in _QUERY_PARAMETER.finditer(text):
            if _is_secret_parameter(match.group(1)):
                spans.append((match.start(2), match.end(2), REDACTED))
    for pattern, keep_prefix in _SECRET_PATTERNS:
        for match in pattern.finditer(text):
            if not _looks_random(match.group()) and keep_prefix:
                continue
            head = _TOKEN_PREFIX.match(match.group()) if keep_prefix else None
            prefix = head.group() if head else ""
            spans.append((match.start(), match.end(), f"{prefix}<redacted>"))
    for pattern in (_SCHEME_SECRET, _ASSIGNED_SECRET):
        for match in pattern.finditer(text):
            if match.start() > 0 and text[match.start() - 1] in "?&;#":
                continue  # a URL's parameter: the rule for those decides, in a URL and out of one
            value = match.group(1)
            if _looks_random(value) or (len(value) >= 12 and not value.isalpha()):
                spans.append((match.start(1), match.end(1), "<redacted>"))
    if not findings_only:
        for match in _LONG_TOKEN.finditer(text):
            if _looks_random(match.group()):
                spans.append((match.start(), match.end(), f"<redacted {len(match.group())} chars>"))
    references = [match.span() for match in SECRET_REF.finditer(text)]
    if references:
        starts = [start for start, _ in references]
        spans = [span for span in spans if not _within(span, references, starts)]
    ordered = sorted(enumerate(spans), key=lambda item: (item[1][0], item[0]))
    merged: list[tuple[int, int, str]] = []
    for _, (start, end, label) in ordered:
        if merged and start < merged[-1][1]:
            last = merged[-1]
            merged[-1] = (last[0], max(last[1], end), last[2])
        else:
            merged.append((start, end, label))
    return merged


def _apply(text: str, spans: list[tuple[int, int, str]]) -> str:
    parts, position = [], 0
    for start, end, label in spans:
        parts += [text[position:start], label]
        position = end
    parts.append(text[position:])
    return "".join(parts)


def redact_secrets(text: str) -> str:
    """Return `text` with anything that looks like a token, key or password replaced."""
    return _apply(text, secret_spans(text))


def redact_url(url: str) -> str:
    """`url` as it may be shown anywhere: its password and secret parameters `***` (see the module's rules).

    The same URL inside a longer text comes out of `redact_secrets` the same way; "" stays "".
    """
    if not url:
        return url
    if _URL.fullmatch(url) is None:
        return REDACTED  # not a URL one can take apart (no scheme, a space, a quote): show none of it
    return redact_secrets(url)


def redact_value(key: str, value: str) -> str:
    """What a listing shows for one env/header value: references as written, literal secrets masked.

    A value is masked whole when its name says it is a credential; otherwise what looks like one
    inside it (a URL's password, a token, `password=...`) is.
    """
    if SECRET_REF.search(value):
        # The reference names where the secret lives, not the secret; a literal beside it may be one.
        return redact_secrets(value)
    if _SENSITIVE_NAME.search(key):
        return REDACTED
    return redact_secrets(value)


def redact_table(table: Mapping[str, str]) -> dict[str, str]:
    """An env or header table as a listing shows it (`redact_value` of each value)."""
    return {key: redact_value(key, value) for key, value in table.items()}


JSON_TEXT_LIMIT = 16_384  # characters of arguments or a result kept, where an operator asks for them


def redacted_json(value: Any, limit: int = JSON_TEXT_LIMIT) -> str | None:
    """Arguments or a result (JSON bytes, or what encodes to JSON) as text with secrets redacted, cut at `limit`.

    None when `value` is not JSON. A wider window than is kept is redacted, so that no secret cut at
    the limit survives as a fragment.
    """
    try:
        data = value if isinstance(value, bytes) else msgspec.json.encode(value)
    except (TypeError, msgspec.EncodeError):
        return None
    return redact_secrets(data[: 2 * limit].decode(errors="replace"))[:limit]
