"""Finding secrets in free text: provider tokens, keys, passwords, credentials in URLs.

Every room that writes text someone else reads (log lines, error messages, reports) redacts with
`redact_secrets`; `secret_spans` gives the spans themselves, for callers that map them back onto a
text they have transformed. Unlike `secrets.Redactor`, which removes values known to be secret,
these patterns recognize what merely looks like one.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

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
# A password in a URL's userinfo (`postgres://user:PASSWORD@host/db`); it runs to the last `@`
# of the authority, so a password with an unencoded `@` is still hidden whole.
_URL_PASSWORD = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:\"'<>]*:([^\s/?#\"'<>]+)@")
_QUERY_PARAMETER = re.compile(r"[?&;]([A-Za-z][\w.-]{0,63})=([^&#\s\"'<>]+)")
# The last word of a query parameter's name that makes its value a secret (`access_token`,
# `apiKey`, `X-Amz-Signature`).
_SECRET_PARAMETER_WORDS = frozenset(
    {"token", "secret", "password", "passwd", "pwd", "pass", "key", "apikey", "sig", "signature", "auth"}
    | {"credential", "credentials", "session", "sessionid"}
)
# The public, recognizable head of a provider token ("ghp_", "sk-", "github_pat_").
_TOKEN_PREFIX = re.compile(r"[A-Za-z]+[-_](?:pat_)?")
_LONG_TOKEN = re.compile(r"(?<![\w/+=-])[A-Za-z0-9+/_-]{32,}={0,2}(?![\w/+=-])")


def _looks_random(value: str) -> bool:
    return any(ch.isdigit() for ch in value) and any(ch.isalpha() for ch in value)


def _is_secret_parameter(name: str) -> bool:
    words = re.split(r"[_.-]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower())
    return words[-1] in _SECRET_PARAMETER_WORDS


def secret_spans(text: str, *, findings_only: bool = False) -> list[tuple[int, int, str]]:
    """Spans of `text` that look like secrets, with the placeholder that replaces each.

    By default the spans also cover any long random-looking token (base64, hex) and every
    password in a URL or secret-named query parameter, whatever it looks like: all are redacted,
    but they are too common (hashes, ids, encoded data) or too often placeholders
    (`user:pass@host`, `?api_key=YOUR_KEY`) to be evidence of a live secret. `findings_only` keeps
    only the spans that are.
    """
    # The list order is the priority: a specific label ("ghp_<redacted>") wins over a generic one.
    spans: list[tuple[int, int, str]] = []
    for pattern, keep_prefix in _SECRET_PATTERNS:
        for match in pattern.finditer(text):
            if not _looks_random(match.group()) and keep_prefix:
                continue
            head = _TOKEN_PREFIX.match(match.group()) if keep_prefix else None
            prefix = head.group() if head else ""
            spans.append((match.start(), match.end(), f"{prefix}<redacted>"))
    for pattern in (_SCHEME_SECRET, _ASSIGNED_SECRET):
        for match in pattern.finditer(text):
            value = match.group(1)
            if _looks_random(value) or (len(value) >= 12 and not value.isalpha()):
                spans.append((match.start(1), match.end(1), "<redacted>"))
    if not findings_only:
        for match in _URL_PASSWORD.finditer(text):
            spans.append((match.start(1), match.end(1), "<redacted>"))
        for match in _QUERY_PARAMETER.finditer(text):
            if _is_secret_parameter(match.group(1)):
                spans.append((match.start(2), match.end(2), "<redacted>"))
        for match in _LONG_TOKEN.finditer(text):
            if _looks_random(match.group()):
                spans.append((match.start(), match.end(), f"<redacted {len(match.group())} chars>"))
    ordered = sorted(enumerate(spans), key=lambda item: (item[1][0], item[0]))
    merged: list[tuple[int, int, str]] = []
    for _, (start, end, label) in ordered:
        if merged and start < merged[-1][1]:
            last = merged[-1]
            merged[-1] = (last[0], max(last[1], end), last[2])
        else:
            merged.append((start, end, label))
    return merged


def redact_secrets(text: str) -> str:
    """Return `text` with anything that looks like a token, key or password replaced."""
    parts, position = [], 0
    for start, end, label in secret_spans(text):
        parts += [text[position:start], label]
        position = end
    parts.append(text[position:])
    return "".join(parts)


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
