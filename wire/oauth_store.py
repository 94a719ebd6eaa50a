"""Where a worker keeps its upstream login: one file per worker id in DATA_DIR/oauth, mode 0600.

The worker writes it (tokens, its registration, the servers' metadata); the supervisor reads only
`expires_at` (for `ctl status`) and removes the file on `ctl logout` when no worker is running.
Nothing else reads it, and no listing, log line or error shows what is inside.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import quote

import msgspec

DIR_NAME = "oauth"
# The one non-MCP request the frontend sends a worker: a login's redirect, from /oauth/callback.
CALLBACK_METHOD = "mcpvisor/oauth_callback"


class TokenFile(msgspec.Struct, kw_only=True, omit_defaults=True):
    tokens: dict[str, Any] | None = None  # the token response (access, refresh, scope, expires_in)
    expires_at: float | None = None  # Unix time the access token expires, when the server said
    client: dict[str, Any] | None = None  # this client's registration (dynamic or a metadata document)
    server_metadata: dict[str, Any] | None = None  # the authorization server's (RFC 8414)
    resource_metadata: dict[str, Any] | None = None  # the upstream's protected resource metadata (RFC 9728)


_decoder = msgspec.json.Decoder(TokenFile)


def token_path(data_dir: Path, worker_id: str) -> Path:
    """The file of worker `server` or `tenant/server`; the `/` is escaped, so ids never collide."""
    return Path(data_dir) / DIR_NAME / f"{quote(worker_id, safe='')}.json"


def load(path: Path) -> TokenFile:
    """The stored login, or an empty one when there is none or it cannot be read."""
    try:
        return _decoder.decode(path.read_bytes())
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return TokenFile()


def expires_at(path: Path) -> float | None:
    """When the stored access token expires (Unix time); None without a token or a known expiry."""
    stored = load(path)
    return stored.expires_at if stored.tokens else None


def save(path: Path, content: TokenFile) -> None:
    """Replace the file atomically; it is created 0600 and never exists with wider permissions."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")  # mkstemp creates 0600
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(msgspec.json.encode(content))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def remove(path: Path) -> bool:
    """Forget the login; whether there was one."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True
