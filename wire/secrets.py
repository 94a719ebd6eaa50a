"""Secret references (`${env:NAME}`, `${file:PATH}`): resolved where used, redacted everywhere else.

What a listing shows of a value (references as written, literal secrets masked) is
`redaction.redact_value`; `Redactor` scrubs values known to be secret out of free text.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

SECRET_REF = re.compile(r"\$\{(env|file):([^}]+)\}")
REDACTED = "***"


class SecretError(Exception):
    """A reference that cannot be resolved; the message names the reference, never a value."""


def resolve(value: str, environ: Mapping[str, str] | None = None) -> str:
    """Replace every `${env:NAME}` / `${file:PATH}` in `value`."""
    env = os.environ if environ is None else environ

    def substitute(m: re.Match[str]) -> str:
        kind, ref = m.group(1), m.group(2)
        if kind == "env":
            if ref not in env:
                raise SecretError(f"environment variable {ref} is not set")
            return env[ref]
        try:
            return Path(os.path.expanduser(ref)).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise SecretError(f"cannot read secret file {ref}: {exc.strerror or type(exc).__name__}") from None

    return SECRET_REF.sub(substitute, value)


def resolve_all(table: Mapping[str, str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    return {key: resolve(value, environ) for key, value in table.items()}


class Redactor:
    """Scrubs known secret values out of free text (log lines, upstream error messages)."""

    def __init__(self, secrets: list[str] | None = None) -> None:
        self._secrets: list[str] = []
        for secret in secrets or []:
            self.add(secret)

    def add(self, secret: str) -> None:
        # Very short values would mangle ordinary text and are not worth hiding from it.
        if len(secret) >= 4 and secret not in self._secrets:
            self._secrets.append(secret)
            self._secrets.sort(key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text
