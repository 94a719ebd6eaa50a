"""The web console at /ui, and the operator door that it and the admin API (/api/v1) share.

Who may pass (`OperatorDoor`): whoever the request boundary admits as an admin principal, that is
the local user on a workstation (the boundary's peer check) or an admin token with tenants. A
browser cannot send a bearer token by itself, so with tenants an operator trades an admin token
for a console session at /ui/login: an HttpOnly, SameSite=Strict cookie that these two surfaces
accept, and no other path.

A browser also carries ambient authority: the peer check admits any page the local user has
open, and a cookie travels with any request to this host. So every request that changes
something must come from the same origin (Origin and Sec-Fetch-Site headers) and carry the
session's CSRF token (`X-CSRF-Token`), unless it authenticates with a bearer token, which no
browser attaches to a cross-site request.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from html import escape
from importlib import resources
from typing import Final
from urllib.parse import parse_qs, urlsplit

from mcpvisor.frontend.endpoints.auth import PRINCIPAL_KEY, InvalidToken, Principal, bearer_token, principal_of
from mcpvisor.frontend.endpoints.boundary import send_json
from mcpvisor.frontend.endpoints.http_server import Receive, Scope, Send
from mcpvisor.store.tokens import TokenStore

log = logging.getLogger(__name__)

Admit = Callable[[Scope, Receive, Send], Awaitable[Receive | None]]  # the request boundary
Authenticate = Callable[[Scope], Awaitable[Principal]]  # a bearer token -> principal (raises InvalidToken)

COOKIE: Final = "mcpvisor_console"
CSRF_HEADER: Final = b"x-csrf-token"
SESSION_IDLE: Final = 12 * 3600.0  # seconds without a request before a session is forgotten
MAX_SESSIONS: Final = 1000  # the oldest are dropped past this: a login loop cannot grow memory
MAX_FORM: Final = 8192
SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
PREFIX: Final = "/ui"
STATIC: Final = "console_static"

# Every console page: no framing (clickjacking), scripts and styles from this origin only.
PAGE_HEADERS: Final = [
    (b"content-security-policy", b"default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]
_TYPES: Final = {
    ".html": b"text/html; charset=utf-8",
    ".js": b"text/javascript; charset=utf-8",
    ".css": b"text/css; charset=utf-8",
    ".svg": b"image/svg+xml",
}


@dataclass
class Session:
    id: str
    csrf: str
    principal: Principal | None  # who logged in (tenants); None: the boundary decides each request
    seen: float = field(default_factory=time.monotonic)


class Sessions:
    """Console sessions in memory: a frontend restart logs everyone out, which is the safe way to fail."""

    def __init__(self, *, idle: float = SESSION_IDLE, limit: int = MAX_SESSIONS) -> None:
        self.idle = idle
        self.limit = limit
        self._items: OrderedDict[str, Session] = OrderedDict()

    def new(self, principal: Principal | None) -> Session:
        session = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32), principal)
        self._items[session.id] = session
        while len(self._items) > self.limit:
            self._items.popitem(last=False)
        return session

    def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        session = self._items.get(session_id)
        now = time.monotonic()
        if session is None or now - session.seen > self.idle:
            self._items.pop(session_id, None)
            return None
        session.seen = now
        self._items.move_to_end(session_id)
        return session

    def drop(self, session_id: str) -> None:
        self._items.pop(session_id, None)


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def cookie(scope: Scope, name: str) -> str | None:
    raw = header(scope, b"cookie")
    if not raw:
        return None
    for part in raw.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


def session_cookie(scope: Scope, session: Session | None) -> tuple[bytes, bytes]:
    """`Set-Cookie` for `session` (None: clear it)."""
    secure = "; Secure" if scope.get("scheme") == "https" else ""
    if session is None:
        return b"set-cookie", f"{COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict{secure}".encode()
    return b"set-cookie", f"{COOKIE}={session.id}; Path=/; HttpOnly; SameSite=Strict{secure}".encode()


def cross_site(scope: Scope) -> str | None:
    """Why a request that changes something looks cross-site (one line), or None."""
    fetch_site = header(scope, b"sec-fetch-site")
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        return f"cross-site request refused (Sec-Fetch-Site: {fetch_site[:40]})"
    origin = header(scope, b"origin")
    if origin is None:
        return None  # not sent by a browser; the CSRF token (or a bearer token) still decides
    host = header(scope, b"host") or ""
    scheme = scope.get("scheme", "http")
    try:
        parts = urlsplit(origin)
    except ValueError:
        return "cross-site request refused (Origin is not a URL)"
    if origin == "null" or parts.scheme != scheme or parts.netloc.lower() != host.lower():
        return f"cross-site request refused (Origin {origin[:80]} is not {scheme}://{host[:80]})"
    return None


@dataclass
class Admitted:
    principal: Principal
    session: Session | None
    receive: Receive
    by_token: bool  # authenticated by an Authorization header, which browsers never add on their own


class OperatorDoor:
    """Admits operators to /api/v1 and /ui: an admin principal, and CSRF rules for changes."""

    def __init__(
        self,
        admit: Admit,
        *,
        authenticate: Authenticate | None = None,
        tokens: TokenStore | None = None,
        sessions: Sessions | None = None,
    ):
        self.admit = admit  # the request boundary every other path passes
        self.authenticate = authenticate  # set when tokens are required (tenants or an issuer)
        self.tokens = tokens  # a session ends when the token it was opened with is revoked or expires
        self.sessions = sessions or Sessions()

    @property
    def tokens_required(self) -> bool:
        return self.authenticate is not None

    async def session_of(self, scope: Scope) -> Session | None:
        session = self.sessions.get(cookie(scope, COOKIE))
        if session is not None and session.principal is not None and not await self._token_alive(session.principal):
            self.sessions.drop(session.id)
            return None
        return session

    async def _token_alive(self, principal: Principal) -> bool:
        """Whether the stored token a session was opened with still admits.

        Only tokens of the state store are checked here; a session opened with a JWT or a token
        file lives until it is idle or the frontend restarts (which rereads the files).
        """
        if self.tokens is None or principal.subject != f"token {principal.token_id}":
            return True
        now = time.time()
        return any(
            info.id == principal.token_id and (info.expires is None or info.expires > now)
            for info in await self.tokens.alist()
        )

    async def enter(self, scope: Scope, receive: Receive, send: Send, *, page: bool = False) -> Admitted | None:
        """The admitted operator, or None once a refusal (401/403, or a redirect to the login) is sent."""
        session = await self.session_of(scope)
        by_token = bearer_token(scope) is not None
        if session is not None and session.principal is not None and not by_token:
            # A logged-in console session; the boundary would ask for a bearer token it cannot have.
            scope[PRINCIPAL_KEY] = session.principal
        elif self.tokens_required and not by_token and page:
            await redirect(send, f"{PREFIX}/login")
            return None
        else:
            admitted = await self.admit(scope, receive, send)
            if admitted is None:
                return None
            receive = admitted
        principal = principal_of(scope)
        if principal is None:
            await send_json(send, 401, {"error": "unauthorized", "message": "no operator credentials"})
            return None
        if not principal.admin:
            message = "the admin API and the console are for operators: this token belongs to a tenant's clients"
            await send_json(send, 403, {"error": "forbidden", "message": message})
            return None
        if scope["method"] not in SAFE_METHODS and (refusal := self.refuse_change(scope, session, by_token)):
            await send_json(send, 403, {"error": "forbidden", "message": refusal})
            return None
        return Admitted(principal, session, receive, by_token)

    @staticmethod
    def refuse_change(scope: Scope, session: Session | None, by_token: bool) -> str | None:
        """Why a request that changes something is refused (cross-site, no CSRF token), or None."""
        if (reason := cross_site(scope)) is not None:
            return reason
        if by_token:
            return None
        given = header(scope, CSRF_HEADER)
        if session is None or not given:
            return (
                "this request changes something and needs the console session's CSRF token: GET /api/v1/session, "
                "then send its csrf_token as X-CSRF-Token together with its cookie (or use a bearer token)"
            )
        if not hmac.compare_digest(given.encode(), session.csrf.encode()):
            return "the X-CSRF-Token does not match this session's; reload the console"
        return None


async def redirect(send: Send, location: str, headers: list[tuple[bytes, bytes]] = ()) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 303,
            "headers": [(b"location", location.encode()), (b"content-length", b"0"), *headers],
        }
    )
    await send({"type": "http.response.body", "body": b""})


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The request body, or None when it is larger than `limit`."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            break
    return b"".join(chunks)


class Console:
    """Serves /ui: the single-page console (static files from the package) and the login of tenant setups."""

    def __init__(self, door: OperatorDoor) -> None:
        self.door = door
        self._files = resources.files("mcpvisor.frontend.endpoints").joinpath(STATIC)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        rest = path[len(PREFIX) :].lstrip("/")
        if rest == "login":
            await self._login(scope, receive, send)
            return
        if rest == "logout" and scope["method"] == "POST":
            await self._logout(scope, receive, send)
            return
        if rest in ("", "index.html"):
            rest = "index.html"
        elif rest.startswith("static/"):
            rest = rest.removeprefix("static/")
        else:
            await self._page(send, 404, b"<h1>Not found</h1>")
            return
        if scope["method"] not in ("GET", "HEAD"):
            await send_json(send, 405, {"error": "method_not_allowed", "message": f"{scope['method']} {path}"})
            return
        # Assets hold nothing secret: with tokens the login page needs them before any session
        # exists. On a workstation they pass the boundary's peer check like every other path.
        public = self.door.tokens_required and rest != "index.html"
        if not public and await self.door.enter(scope, receive, send, page=rest == "index.html") is None:
            return
        await self._static(send, rest)

    async def _static(self, send: Send, name: str) -> None:
        if "/" in name or name.startswith(".") or not any(name.endswith(ext) for ext in _TYPES):
            await self._page(send, 404, b"<h1>Not found</h1>")
            return
        item = self._files.joinpath(name)
        if not item.is_file():
            await self._page(send, 404, b"<h1>Not found</h1>")
            return
        await self._page(send, 200, item.read_bytes(), _TYPES[name[name.rindex(".") :]])

    async def _page(
        self,
        send: Send,
        status: int,
        body: bytes,
        content_type: bytes = _TYPES[".html"],
        headers: list[tuple[bytes, bytes]] = (),
    ) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", content_type),
                    (b"content-length", str(len(body)).encode()),
                    *PAGE_HEADERS,
                    *headers,
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def _login(self, scope: Scope, receive: Receive, send: Send) -> None:
        """GET: the form; POST: an admin token for a session cookie (tenant setups only)."""
        if not self.door.tokens_required:
            await redirect(send, f"{PREFIX}/")  # on a workstation the local user needs no login
            return
        if scope["method"] == "GET":
            await self._static(send, "login.html")
            return
        if scope["method"] != "POST":
            await send_json(send, 405, {"error": "method_not_allowed", "message": "use GET or POST"})
            return
        if (reason := cross_site(scope)) is not None:
            await send_json(send, 403, {"error": "forbidden", "message": reason})
            return
        body = await read_body(receive, MAX_FORM)
        token = ""
        if body is not None:
            token = (parse_qs(body.decode("utf-8", "replace")).get("token") or [""])[0].strip()
        principal: Principal | None = None
        error = "give an admin token (mcpvisor token add --admin)"
        if token and self.door.authenticate is not None:
            probe = {**scope, "headers": [(b"authorization", f"Bearer {token}".encode())]}
            try:
                principal = await self.door.authenticate(probe)
            except InvalidToken as exc:
                error = exc.message
            if principal is not None and not principal.admin:
                principal, error = None, "this token belongs to a tenant's clients; the console needs an admin token"
        if principal is None:
            log.info("console login refused: %s", error)
            await self._page(send, 401, _login_failed(error))
            return
        session = self.door.sessions.new(principal)
        log.info("console login: %s", principal.subject)
        await redirect(send, f"{PREFIX}/", [session_cookie(scope, session)])

    async def _logout(self, scope: Scope, receive: Receive, send: Send) -> None:
        admitted = await self.door.enter(scope, receive, send)
        if admitted is None:
            return
        if admitted.session is not None:
            self.door.sessions.drop(admitted.session.id)
        await send_json(send, 200, {"logged_out": True}, headers=[session_cookie(scope, None)])


def _login_failed(reason: str) -> bytes:
    return (
        "<!doctype html><meta charset=utf-8><title>mcpvisor: login</title>"
        "<link rel=stylesheet href=/ui/static/console.css>"
        f"<main class=login><h1>mcpvisor</h1><p class=error>{escape(reason)}</p>"
        "<p><a href=/ui/login>Try again</a></p></main>"
    ).encode()
