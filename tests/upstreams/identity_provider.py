"""An OAuth 2.1 authorization server on loopback, for testing mcpvisor as a resource server.

Built on authlib's server side: authorization code with PKCE (S256 required), dynamic client
registration (RFC 7591, open, as MCP clients expect), RFC 8414 metadata and JWT access tokens
(RFC 9068) signed with an RSA key whose public half is published as a JWKS. The audience of a
token is the `resource` the client asked for (RFC 8707). There is no login page: the
authorization endpoint approves at once as the user named by `login_hint` (or the only user),
so a test logs in headlessly by following the redirect itself.

Tests also use it to mint tokens no honest server would issue (expired, for another audience,
signed by an unknown key) with `mint`, and to rotate its key.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx2
import trio
from authlib.oauth2 import AuthorizationServer, OAuth2Error
from authlib.oauth2.rfc6749 import ClientMixin, grants
from authlib.oauth2.rfc6749.requests import BasicOAuth2Payload, JsonPayload, JsonRequest, OAuth2Request
from authlib.oauth2.rfc7591 import ClientRegistrationEndpoint
from authlib.oauth2.rfc7636 import CodeChallenge
from authlib.oauth2.rfc9068 import JWTBearerTokenGenerator
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve
from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

AUTH_METHODS = ["none", "client_secret_basic", "client_secret_post"]
CODE_LIFETIME = 600


@dataclass
class Client(ClientMixin):
    """A client registered through RFC 7591."""

    client_id: str
    client_secret: str
    metadata: dict[str, Any]

    def get_client_id(self) -> str:
        return self.client_id

    def get_default_redirect_uri(self) -> str | None:
        uris = self.metadata.get("redirect_uris") or []
        return uris[0] if uris else None

    def get_allowed_scope(self, scope: str | None) -> str:
        return scope or ""

    def check_redirect_uri(self, redirect_uri: str) -> bool:
        return redirect_uri in (self.metadata.get("redirect_uris") or [])

    def check_client_secret(self, client_secret: str) -> bool:
        return secrets.compare_digest(client_secret, self.client_secret)

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        if endpoint == "token":
            return method == self.metadata.get("token_endpoint_auth_method", "client_secret_basic")
        return True

    def check_response_type(self, response_type: str) -> bool:
        return response_type in (self.metadata.get("response_types") or ["code"])

    def check_grant_type(self, grant_type: str) -> bool:
        return grant_type in (self.metadata.get("grant_types") or ["authorization_code"])


@dataclass
class Grantee:
    """Who a code was issued to, and for which resource (RFC 8707): the token's sub, claims and aud."""

    name: str
    claims: dict[str, Any]
    resource: str | None

    def get_user_id(self) -> str:
        return self.name


@dataclass
class AuthorizationCode:
    code: str
    client_id: str
    redirect_uri: str
    scope: str
    grantee: Grantee
    code_challenge: str | None
    code_challenge_method: str | None
    issued_at: float = field(default_factory=time.monotonic)

    def get_redirect_uri(self) -> str:
        return self.redirect_uri

    def get_scope(self) -> str:
        return self.scope


class _Request(OAuth2Request):
    """An authlib request built from what the Starlette handler already read."""

    def __init__(self, request: Request, data: Mapping[str, str]) -> None:
        super().__init__(request.method, str(request.url), headers=request.headers)
        self.payload = BasicOAuth2Payload(dict(data))
        self._args = dict(request.query_params)
        self._form = dict(data) if request.method == "POST" else {}

    @property
    def args(self) -> dict[str, str]:
        return self._args

    @property
    def form(self) -> dict[str, str]:
        return self._form


class _JsonRequest(JsonRequest):
    def __init__(self, request: Request, data: dict[str, Any]) -> None:
        super().__init__(request.method, str(request.url), request.headers)
        self.payload = _Json(data)


class _Json(JsonPayload):
    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    @property
    def data(self) -> dict[str, Any]:
        return self._data


class _CodeGrant(grants.AuthorizationCodeGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = AUTH_METHODS

    def save_authorization_code(self, code: str, request: OAuth2Request) -> None:
        data = request.payload.data
        grantee = Grantee(request.user.name, request.user.claims, data.get("resource"))
        self.server.idp.codes[code] = AuthorizationCode(
            code=code,
            client_id=request.client.get_client_id(),
            redirect_uri=data.get("redirect_uri", ""),
            scope=data.get("scope", ""),
            grantee=grantee,
            code_challenge=data.get("code_challenge"),
            code_challenge_method=data.get("code_challenge_method"),
        )

    def query_authorization_code(self, code: str, client: Client) -> AuthorizationCode | None:
        item = self.server.idp.codes.get(code)
        if item is None or item.client_id != client.get_client_id():
            return None
        if time.monotonic() - item.issued_at > CODE_LIFETIME:
            return None
        return item

    def delete_authorization_code(self, authorization_code: AuthorizationCode) -> None:
        self.server.idp.codes.pop(authorization_code.code, None)

    def authenticate_user(self, authorization_code: AuthorizationCode) -> Grantee:
        return authorization_code.grantee


class _Registration(ClientRegistrationEndpoint):
    def authenticate_token(self, request: JsonRequest) -> bool:
        return True  # open registration: MCP clients register themselves

    def get_server_metadata(self) -> dict[str, Any]:
        return self.server.idp.metadata()

    def save_client(self, client_info: dict[str, Any], client_metadata: dict[str, Any], request: JsonRequest) -> Client:
        client = Client(client_info["client_id"], client_info["client_secret"], client_metadata)
        self.server.idp.clients[client.client_id] = client
        return client


class _Tokens(JWTBearerTokenGenerator):
    """JWT access tokens whose audience is the requested resource and whose claims are the user's."""

    def __init__(self, idp: IdentityProvider) -> None:
        super().__init__(issuer="", expires_generator=lambda _client, _grant_type: idp.token_lifetime)
        self.idp = idp

    def access_token_generator(self, client: Client, grant_type: str, user: Grantee, scope: str) -> str:
        self.issuer = self.idp.issuer
        return super().access_token_generator(client, grant_type, user, scope)

    def get_jwks(self) -> KeySet:
        return KeySet([self.idp.key])  # one key: its kid goes into the token's header

    def get_audiences(self, client: Client, user: Grantee, scope: str) -> str:
        return user.resource or client.get_client_id()

    def get_extra_claims(self, client: Client, grant_type: str, user: Grantee, scope: str) -> dict[str, Any]:
        return dict(user.claims)


class _Server(AuthorizationServer):
    def __init__(self, idp: IdentityProvider) -> None:
        super().__init__(scopes_supported=idp.scopes)
        self.idp = idp

    def query_client(self, client_id: str) -> Client | None:
        return self.idp.clients.get(client_id)

    def save_token(self, token: dict[str, Any], request: OAuth2Request) -> None:
        self.idp.issued += 1

    def create_oauth2_request(self, request: OAuth2Request) -> OAuth2Request:
        return request

    def create_json_request(self, request: JsonRequest) -> JsonRequest:
        return request

    def handle_response(self, status: int, body: Any, headers: list[tuple[str, str]]) -> Response:
        if isinstance(body, dict):
            return JSONResponse(body, status_code=status, headers=dict(headers))
        return Response(body or b"", status_code=status, headers=dict(headers))

    def send_signal(self, name: str, *args: Any, **kwargs: Any) -> None:
        pass


class IdentityProvider:
    """The authorization server: users by name with the claims their tokens carry."""

    def __init__(
        self, users: Mapping[str, Mapping[str, Any]], *, scopes: list[str] | None = None, token_lifetime: int = 3600
    ) -> None:
        self.users = {name: dict(claims) for name, claims in users.items()}
        self.scopes = scopes or ["mcp"]
        self.token_lifetime = token_lifetime
        self.issuer = ""  # http://127.0.0.1:PORT, known once `serve` has bound
        self.key = RSAKey.generate_key(2048, auto_kid=True)
        self.retired: list[RSAKey] = []  # still published after a rotation
        self.clients: dict[str, Client] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.issued = 0
        self.jwks_requests = 0
        self.metadata_requests = 0
        self.server = _Server(self)
        self.server.register_grant(_CodeGrant, [CodeChallenge(required=True)])
        self.server.register_endpoint(_Registration)
        self.server.register_token_generator("default", _Tokens(self))
        self.app = Starlette(
            routes=[
                Route("/.well-known/oauth-authorization-server", self._metadata),
                Route("/jwks", self._jwks),
                Route("/authorize", self._authorize),
                Route("/token", self._token, methods=["POST"]),
                Route("/register", self._register, methods=["POST"]),
            ]
        )

    async def serve(self, *, task_status: trio.TaskStatus[IdentityProvider] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve on a free loopback port; reports itself started once its issuer URL is known."""
        config = HypercornConfig()
        config.bind = ["127.0.0.1:0"]
        config.accesslog = None
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(hypercorn_serve, self.app, config)
            self.issuer = binds[0]
            task_status.started(self)

    def metadata(self) -> dict[str, Any]:
        return {
            "issuer": self.issuer,
            "authorization_endpoint": f"{self.issuer}/authorize",
            "token_endpoint": f"{self.issuer}/token",
            "registration_endpoint": f"{self.issuer}/register",
            "jwks_uri": f"{self.issuer}/jwks",
            "scopes_supported": self.scopes,
            "response_types_supported": ["code"],
            "grant_types_supported": ["authorization_code", "refresh_token"],
            "token_endpoint_auth_methods_supported": AUTH_METHODS,
            "code_challenge_methods_supported": ["S256"],
        }

    def rotate_key(self, *, keep_old: bool = True) -> RSAKey:
        """Sign with a new key (a new kid) from now on; the old one stays published unless told otherwise."""
        if keep_old:
            self.retired.append(self.key)
        self.key = RSAKey.generate_key(2048, auto_kid=True)
        return self.key

    def claims(self, user: str, resource: str, *, lifetime: int | None = None, **overrides: Any) -> dict[str, Any]:
        """The claims a token of this server for `user` and `resource` carries; `overrides` replace any."""
        now = int(time.time())
        claims = {
            "iss": self.issuer,
            "sub": user,
            "aud": resource,
            "iat": now,
            "exp": now + (self.token_lifetime if lifetime is None else lifetime),
            "jti": secrets.token_hex(8),
            "client_id": "minted",
            **self.users[user],
        }
        claims.update(overrides)
        return {k: v for k, v in claims.items() if v is not None}

    def mint(
        self, claims: Mapping[str, Any], *, key: RSAKey | None = None, header: Mapping[str, Any] | None = None
    ) -> str:
        """A token with these claims signed by `key` (this server's current key by default)."""
        key = key or self.key
        return jwt.encode({"alg": "RS256", "typ": "at+jwt", "kid": key.kid, **(header or {})}, dict(claims), key)

    async def _metadata(self, request: Request) -> Response:
        self.metadata_requests += 1
        return JSONResponse(self.metadata())

    async def _jwks(self, request: Request) -> Response:
        self.jwks_requests += 1
        return JSONResponse(KeySet([self.key, *self.retired]).as_dict(private=False))

    async def _authorize(self, request: Request) -> Response:
        oauth_request = _Request(request, request.query_params)
        try:
            grant = self.server.get_consent_grant(oauth_request, end_user=None)
        except OAuth2Error as error:
            return self.server.handle_error_response(oauth_request, error)
        hint = request.query_params.get("login_hint")
        name = hint if hint is not None else (next(iter(self.users)) if len(self.users) == 1 else None)
        if name not in self.users:
            return JSONResponse({"error": "login_required", "error_description": "login_hint names no user"}, 400)
        grantee = Grantee(name, self.users[name], None)
        return self.server.create_authorization_response(oauth_request, grant_user=grantee, grant=grant)

    async def _token(self, request: Request) -> Response:
        form = await request.form()
        data = {k: v for k, v in form.items() if isinstance(v, str)}
        return self.server.create_token_response(_Request(request, data))

    async def _register(self, request: Request) -> Response:
        try:
            data = await request.json()
        except ValueError:
            return JSONResponse({"error": "invalid_client_metadata"}, 400)
        if not isinstance(data, dict):
            return JSONResponse({"error": "invalid_client_metadata"}, 400)
        return self.server.create_endpoint_response("client_registration", _JsonRequest(request, data))


async def login(issuer: str, user: str, resource: str, *, scope: str = "mcp") -> str:
    """An access token for `user` and `resource`, got the way a client would: register, authorize with PKCE, redeem."""
    from mcp.client.auth import PKCEParameters  # the SDK's own PKCE pair

    redirect_uri = "http://127.0.0.1:1/callback"
    async with httpx2.AsyncClient(timeout=10, follow_redirects=False, trust_env=False) as http:
        registered = await http.post(
            f"{issuer}/register",
            json={"redirect_uris": [redirect_uri], "token_endpoint_auth_method": "none", "client_name": "test"},
        )
        registered.raise_for_status()
        client_id = registered.json()["client_id"]
        pkce = PKCEParameters.generate()
        state = secrets.token_urlsafe(16)
        params = {
            "response_type": "code",
            "client_id": client_id,
            "redirect_uri": redirect_uri,
            "state": state,
            "scope": scope,
            "code_challenge": pkce.code_challenge,
            "code_challenge_method": "S256",
            "resource": resource,
            "login_hint": user,
        }
        answer = await http.get(f"{issuer}/authorize", params=params)
        assert answer.status_code == 302, answer.text
        query = parse_qs(urlsplit(answer.headers["location"]).query)
        assert query["state"] == [state]
        token = await http.post(
            f"{issuer}/token",
            data={
                "grant_type": "authorization_code",
                "code": query["code"][0],
                "redirect_uri": redirect_uri,
                "client_id": client_id,
                "code_verifier": pkce.code_verifier,
                "resource": resource,
            },
        )
        token.raise_for_status()
        return token.json()["access_token"]
