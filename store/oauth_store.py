"""Where a worker keeps its upstream login: one file per worker id in DATA_DIR/oauth, mode 0600.

The worker writes it (tokens, its registration, the servers' metadata); the supervisor and the
admin API read only which logins exist and `expires_at` (for `ctl status`, `ctl logins`), and remove
a file on logout when no worker is running. A server with `oauth.shared` keeps one file, the plain
server's, which every tenant's worker of it reads. Nothing else reads it, and no listing, log line
or error shows what is inside.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import msgspec

from mcpvisor.wire.config import parse_listen

DIR_NAME = "oauth"
# The non-MCP requests the frontend sends a worker: a login's redirect, from /oauth/callback; a
# tenant's own login (the `SERVER:login` tool) and logout (`upstream_servers`, the admin API).
CALLBACK_METHOD = "mcpvisor/oauth_callback"
LOGIN_METHOD = "mcpvisor/oauth_login"
LOGOUT_METHOD = "mcpvisor/oauth_logout"
LOGIN_METHODS = frozenset({CALLBACK_METHOD, LOGIN_METHOD, LOGOUT_METHOD})
# The worker -> frontend notification that an account was connected or disconnected (activity log).
ACCOUNT_EVENT = "notifications/mcpvisor/account"
CALLBACK_PATH = "/oauth/callback"
START_PATH = "/oauth/start/"
# Once a tenant opens its login link, how long it has to log in at the authorization server: the
# login cookie's Max-Age, and what the worker waits beyond the link's own lifetime.
LOGIN_AFTER_OPENING = 600.0


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


def token_file_of(data_dir: Path, worker_id: str, *, shared: bool) -> Path:
    """The file a worker keeps its login in: its own, or the plain server's when the login is shared."""
    return token_path(data_dir, worker_id.rpartition("/")[2] if shared else worker_id)


def logins(data_dir: Path) -> list[tuple[str, float | None]]:
    """Every stored login with a token: (worker id, expiry or None), sorted by worker id."""
    folder = Path(data_dir) / DIR_NAME
    found = []
    try:
        names = sorted(entry.name for entry in folder.iterdir() if entry.name.endswith(".json"))
    except OSError:
        return []
    for name in names:
        if name.startswith(".tmp-"):
            continue
        stored = load(folder / name)
        if stored.tokens:
            found.append((unquote(name.removesuffix(".json")), stored.expires_at))
    return found


def base_url(listen: str, public_url: str | None = None) -> str:
    """Where a browser reaches this mcpvisor: `public_url`, else the listener (a wildcard on loopback)."""
    if public_url:
        return public_url.rstrip("/")
    host, port = parse_listen(listen)
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def redirect_uri(listen: str, public_url: str | None = None) -> str:
    """The redirect URI of every upstream login: mcpvisor's own /oauth/callback."""
    return base_url(listen, public_url) + CALLBACK_PATH


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


class FileRecord:
    """One worker's login kept in its file: the calls a worker makes on its record, whatever the store.

    The other kind is store/oauth_pg.py's `SharedRecord`, in the store every replica shares.
    """

    shared_store = False

    def __init__(self, path: Path) -> None:
        self.path = path

    def version(self) -> object | None:
        """What changes whenever the record is written: the file's (mtime, size); None without a file."""
        try:
            info = self.path.stat()
        except OSError:
            return None
        return info.st_mtime_ns, info.st_size

    def load(self) -> TokenFile:
        return load(self.path)

    def save(self, content: TokenFile) -> object | None:
        """Write the record; its new version."""
        save(self.path, content)
        return self.version()

    def remove(self) -> bool:
        return remove(self.path)
