"""An MCP server that needs an OAuth 2.1 login, and the authorization server it trusts, on loopback.

`python oauth_upstream.py --port P --as-port A [--access-ttl S] [--expires-in N]` serves:
- on A, an authorization server: RFC 8414 metadata, dynamic registration (RFC 7591), an
  authorization endpoint that approves at once (it plays a user who clicks "allow") and redirects
  with `code`, `state` and `iss` (RFC 9207), and a token endpoint that checks PKCE (S256), the
  redirect URI and the `resource` (RFC 8707), and rotates refresh tokens; with `--reuse-revokes`, a
  refresh token used a second time revokes its whole grant, as OAuth 2.1 §4.3.1 advises for
  rotation (counted as `reused_refreshes`). `/admin/revoke` revokes
  every token (a user withdrawing consent), `/admin/revoke?only=access` the access tokens only;
  `/admin/stats` counts what happened. The person logged in at the authorization server is the
  browser's `user` cookie (default `someone`); each grant is that person's.
- on P, the echo tools of echo_server.py at /mcp (or legacy SSE at /sse with `--sse`) behind bearer tokens of that server, with its
  protected resource metadata (RFC 9728) and 401s that point at it. `write_note` needs the
  `notes:write` scope: without it the call gets 403 insufficient_scope (a step-up). `whoami`
  answers with the person whose token the call carried.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import secrets
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

sys.path.insert(0, str(Path(__file__).resolve().parent))
from echo_server import build

READ_SCOPE = "echo:read"
WRITE_SCOPE = "notes:write"


@dataclass
class Grant:
    client_id: str
    scope: str
    resource: str
    expires_at: float = 0.0
    user: str = "someone"
    family: str = ""  # the login this token descends from, by refresh after refresh


@dataclass
class State:
    issuer: str
    resource: str
    access_ttl: int
    reuse_revokes: bool = False
    expires_in: int | None = None  # what token answers announce, when not the real lifetime
    spent: dict[str, str] = field(default_factory=dict)  # used refresh token -> its grant's family
    clients: dict[str, dict[str, Any]] = field(default_factory=dict)
    codes: dict[str, tuple[Grant, str, str]] = field(default_factory=dict)  # code -> grant, challenge, redirect
    access: dict[str, Grant] = field(default_factory=dict)
    refresh: dict[str, Grant] = field(default_factory=dict)
    stats: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            (
                "registrations",
                "authorizations",
                "codes",
                "refreshes",
                "refused_refreshes",
                "refused_tokens",
                "reused_refreshes",
            ),
            0,
        )
    )


def _error(status: int, error: str, description: str) -> JSONResponse:
    return JSONResponse({"error": error, "error_description": description}, status_code=status)


def authorization_server(state: State) -> Starlette:
    async def metadata(_: Request) -> Response:
        return JSONResponse(
            {
                "issuer": state.issuer,
                "authorization_endpoint": f"{state.issuer}/authorize",
                "token_endpoint": f"{state.issuer}/token",
                "registration_endpoint": f"{state.issuer}/register",
                "response_types_supported": ["code"],
                "grant_types_supported": ["authorization_code", "refresh_token"],
                "code_challenge_methods_supported": ["S256"],
                "token_endpoint_auth_methods_supported": ["none"],
                "scopes_supported": [READ_SCOPE, WRITE_SCOPE],
                "authorization_response_iss_parameter_supported": True,
            }
        )

    async def register(request: Request) -> Response:
        body = await request.json()
        uris = body.get("redirect_uris")
        if not isinstance(uris, list) or not uris:
            return _error(400, "invalid_redirect_uri", "redirect_uris is required")
        client_id = f"client-{secrets.token_hex(8)}"
        state.clients[client_id] = {"redirect_uris": uris}
        state.stats["registrations"] += 1
        return JSONResponse(
            {"client_id": client_id, "redirect_uris": uris, "token_endpoint_auth_method": "none"}, status_code=201
        )

    async def authorize(request: Request) -> Response:
        q = request.query_params
        client = state.clients.get(q.get("client_id", ""))
        if client is None or q.get("redirect_uri") not in client["redirect_uris"]:
            return _error(400, "invalid_request", "unknown client or redirect_uri")
        if q.get("code_challenge_method") != "S256" or not q.get("code_challenge"):
            return _error(400, "invalid_request", "PKCE with S256 is required")
        if q.get("resource") != state.resource:
            return _error(400, "invalid_target", f"resource must be {state.resource}")
        state.stats["authorizations"] += 1
        code = secrets.token_urlsafe(24)
        grant = Grant(
            q["client_id"],
            q.get("scope", READ_SCOPE),
            q["resource"],
            user=request.cookies.get("user", "someone"),
            family=secrets.token_urlsafe(8),
        )
        state.codes[code] = (grant, q["code_challenge"], q["redirect_uri"])
        back = {"code": code, "state": q.get("state", ""), "iss": state.issuer}
        return RedirectResponse(f"{q['redirect_uri']}?{urlencode(back)}", status_code=302)

    async def token(request: Request) -> Response:
        form = parse_qs((await request.body()).decode())
        get = lambda key: form.get(key, [""])[0]  # noqa: E731
        if get("grant_type") == "authorization_code":
            entry = state.codes.pop(get("code"), None)
            if entry is None:
                return _error(400, "invalid_grant", "unknown or used code")
            grant, challenge, redirect = entry
            verifier = get("code_verifier").encode()
            computed = base64.urlsafe_b64encode(hashlib.sha256(verifier).digest()).rstrip(b"=").decode()
            if computed != challenge or get("redirect_uri") != redirect or get("client_id") != grant.client_id:
                return _error(400, "invalid_grant", "PKCE, redirect_uri or client_id do not match")
            if get("resource") != state.resource:
                return _error(400, "invalid_target", "resource does not match")
            state.stats["codes"] += 1
            return _issue(grant)
        if get("grant_type") == "refresh_token":
            used = get("refresh_token")
            grant = state.refresh.pop(used, None)  # rotation: each refresh token works once
            family = state.spent.get(used)
            if grant is None and family is not None and state.reuse_revokes:
                # A refresh token used twice: stolen, or a client that lost track. End the whole grant.
                state.stats["reused_refreshes"] += 1
                state.access = {key: value for key, value in state.access.items() if value.family != family}
                state.refresh = {key: value for key, value in state.refresh.items() if value.family != family}
            if grant is not None:
                state.spent[used] = grant.family
            if grant is None or get("client_id") != grant.client_id:
                state.stats["refused_refreshes"] += 1
                return _error(400, "invalid_grant", "unknown, used or revoked refresh token")
            state.stats["refreshes"] += 1
            return _issue(grant)
        return _error(400, "unsupported_grant_type", "authorization_code or refresh_token")

    def _issue(grant: Grant) -> Response:
        access, refresh = f"at-{secrets.token_urlsafe(24)}", f"rt-{secrets.token_urlsafe(24)}"
        issued = Grant(
            grant.client_id, grant.scope, grant.resource, time.time() + state.access_ttl, grant.user, grant.family
        )
        state.access[access] = issued
        state.refresh[refresh] = issued
        return JSONResponse(
            {
                "access_token": access,
                "token_type": "Bearer",
                "expires_in": state.access_ttl if state.expires_in is None else state.expires_in,
                "refresh_token": refresh,
                "scope": grant.scope,
            },
            headers={"Cache-Control": "no-store"},
        )

    async def revoke(request: Request) -> Response:
        state.access.clear()
        if request.query_params.get("only") != "access":
            state.refresh.clear()
        return JSONResponse({"revoked": True})

    async def stats(_: Request) -> Response:
        return JSONResponse(state.stats)

    return Starlette(
        routes=[
            Route("/.well-known/oauth-authorization-server", metadata),
            Route("/register", register, methods=["POST"]),
            Route("/authorize", authorize),
            Route("/token", token, methods=["POST"]),
            Route("/admin/revoke", revoke, methods=["POST"]),
            Route("/admin/stats", stats),
        ]
    )


class ProtectedResource:
    """The MCP app, answering only requests that carry a live token of the authorization server."""

    def __init__(self, app: Any, state: State, base: str, path: str) -> None:
        self.app = app
        self.state = state
        self.metadata_path = f"/.well-known/oauth-protected-resource{path}"
        self.metadata_url = f"{base}{self.metadata_path}"

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] == self.metadata_path:
            body = {
                "resource": self.state.resource,
                "authorization_servers": [self.state.issuer],
                "scopes_supported": [READ_SCOPE, WRITE_SCOPE],
                "bearer_methods_supported": ["header"],
            }
            await JSONResponse(body)(scope, receive, send)
            return
        headers = dict(scope["headers"])
        token = headers.get(b"authorization", b"").decode().removeprefix("Bearer ")
        grant = self.state.access.get(token)
        if grant is None or grant.expires_at < time.time() or grant.resource != self.state.resource:
            challenge = f'Bearer resource_metadata="{self.metadata_url}", scope="{READ_SCOPE}"'
            if token:
                challenge += ', error="invalid_token"'
                self.state.stats["refused_tokens"] += 1
            await _error(401, "invalid_token", "a valid bearer token is required")(
                scope, receive, _with_header(send, challenge)
            )
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = _as_user(b"".join(chunks), grant.user)
        if WRITE_SCOPE not in grant.scope.split() and _calls_tool(body, "write_note"):
            challenge = (
                f'Bearer resource_metadata="{self.metadata_url}", scope="{READ_SCOPE} {WRITE_SCOPE}", '
                'error="insufficient_scope"'
            )
            await _error(403, "insufficient_scope", "write_note needs notes:write")(
                scope, receive, _with_header(send, challenge)
            )
            return
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _calls_tool(body: bytes, name: str) -> bool:
    try:
        message = json.loads(body or b"null")
    except ValueError:
        return False
    return (
        isinstance(message, dict)
        and message.get("method") == "tools/call"
        and ((message.get("params") or {}).get("name") == name)
    )


def _as_user(body: bytes, user: str) -> bytes:
    """A call of `whoami` gets the token's owner as its argument, whatever the caller sent."""
    if not _calls_tool(body, "whoami"):
        return body
    message = json.loads(body)
    message["params"]["arguments"] = {"user": user}
    return json.dumps(message).encode()


def _with_header(send: Any, challenge: str) -> Any:
    async def sending(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), (b"www-authenticate", challenge.encode())]}
        await send(message)

    return sending


async def serve(
    port: int, as_port: int, access_ttl: int, sse: bool, reuse_revokes: bool = False, expires_in: int | None = None
) -> None:
    base, issuer = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{as_port}"
    path = "/sse" if sse else "/mcp"
    state = State(
        issuer=issuer,
        resource=f"{base}{path}",
        access_ttl=access_ttl,
        reuse_revokes=reuse_revokes,
        expires_in=expires_in,
    )
    server = build("oauth-echo")

    @server.tool(description="Write a note (needs the notes:write scope).")
    def write_note(text: str) -> str:
        return f"noted: {text}"

    @server.tool(description="Who the call's token belongs to at this server.")
    def whoami(user: str = "") -> str:
        return f"you are {user}"

    app = server.sse_app() if sse else server.streamable_http_app()
    resource = ProtectedResource(app, state, base, path)
    servers = [
        uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=p, log_level="warning", lifespan=lifespan))
        for app, p, lifespan in ((authorization_server(state), as_port, "off"), (resource, port, "on"))
    ]
    await asyncio.gather(*(s.serve() for s in servers))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True, help="the MCP server's port")
    parser.add_argument("--as-port", type=int, required=True, help="the authorization server's port")
    parser.add_argument("--access-ttl", type=int, default=3600, help="access token lifetime in seconds")
    parser.add_argument("--sse", action="store_true", help="legacy SSE at /sse instead of streamable HTTP at /mcp")
    parser.add_argument("--reuse-revokes", action="store_true", help="a refresh token used twice revokes its grant")
    parser.add_argument("--expires-in", type=int, help="the expires_in token answers announce (default: the lifetime)")
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.as_port, args.access_ttl, args.sse, args.reuse_revokes, args.expires_in))


if __name__ == "__main__":
    main()
