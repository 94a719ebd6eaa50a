"""The configuration's Structs, shared by every process: a server, its policy, the settings.

The TOML loader that fills them from a file is the supervisor's (supervisor/config.py); the
frontend and the workers receive them in their launch specs and in `ConfigChanged`.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

import msgspec

SERVER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


class ConfigError(Exception):
    """A configuration file that cannot be used; the message names the file and, where known, the line."""


class _Strict(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    pass


Seconds = Annotated[float, msgspec.Meta(ge=0)]
PositiveSeconds = Annotated[float, msgspec.Meta(gt=0)]


class Policy(_Strict):
    """Per-server restart, connection and discovery policy; every field has a default."""

    init_timeout: PositiveSeconds = 30.0
    discovery_timeout: PositiveSeconds = 30.0
    poll_interval: PositiveSeconds = 300.0
    call_timeout: PositiveSeconds | None = None  # falls back to [mcpvisor].call_timeout
    reconnect_backoff_max: PositiveSeconds = 60.0
    ping_interval: PositiveSeconds = 10.0  # the worker pings its upstream; no answer in ping_timeout: reconnect
    ping_timeout: PositiveSeconds = 5.0
    heartbeat_timeout: PositiveSeconds = 5.0  # a worker silent this long is hung: killed and restarted
    autorestart: Literal["true", "false", "unexpected"] | bool = True
    startsecs: Seconds = 1.0
    startretries: Annotated[int, msgspec.Meta(ge=0)] = 5
    backoff_max: PositiveSeconds = 300.0
    stopsignal: Literal["TERM", "INT", "HUP", "QUIT", "KILL", "USR1", "USR2"] = "TERM"
    stopwaitsecs: Seconds = 10.0
    exitcodes: tuple[int, ...] = (0,)
    flap_window: PositiveSeconds = 60.0
    flap_count: Annotated[int, msgspec.Meta(ge=2)] = 10
    max_inflight: Annotated[int, msgspec.Meta(ge=1)] = 64


class UpstreamOAuth(_Strict):
    """A server's `oauth` table: the client mcpvisor is at the upstream's authorization server.

    All optional: without it mcpvisor registers itself (a Client ID Metadata Document, else
    dynamic registration) when the upstream asks for a login.
    """

    client_id: str | None = None  # registered by the operator where the server offers no registration
    client_secret: str | None = None  # a secret reference only: ${env:NAME} or ${file:PATH}
    scopes: list[str] = []  # asked for when the server names none
    client_metadata_url: str | None = None  # an https URL serving this client's metadata document

    def __post_init__(self) -> None:
        if self.client_secret is not None and not SECRET_REFERENCE.fullmatch(self.client_secret):
            raise ValueError("oauth.client_secret must be a reference (${env:NAME} or ${file:PATH}), not the secret")


SECRET_REFERENCE = re.compile(r"\$\{(env|file):[^}]+\}")


class ServerConfig(_Strict):
    """One upstream MCP server: a command (stdio) or a URL (streamable HTTP or SSE)."""

    command: str | None = None
    args: list[str] = []
    env: dict[str, str] = {}
    cwd: str | None = None
    url: str | None = None
    transport: Literal["auto", "stdio", "streamable-http", "sse"] = "auto"
    headers: dict[str, str] = {}
    enabled: bool = True
    quarantined: bool = False
    endpoint: bool | None = None  # /mcp/servers/NAME; None follows [mcpvisor].enable_server_endpoints
    policy: Policy = msgspec.field(default_factory=Policy)
    oauth: UpstreamOAuth | None = None  # a remote server that needs a login (`mcpvisor ctl login NAME`)

    @property
    def kind(self) -> Literal["stdio", "streamable-http", "sse"]:
        """The transport actually used."""
        if self.command is not None:
            return "stdio"
        if self.transport == "sse" or (self.transport == "auto" and (self.url or "").rstrip("/").endswith("/sse")):
            return "sse"
        return "streamable-http"


class Settings(_Strict):
    """The `[mcpvisor]` table."""

    listen: str = "127.0.0.1:8080"
    enable_direct_endpoint: bool = False
    enable_server_endpoints: bool = False  # every server at /mcp/servers/NAME (a server's `endpoint` overrides)
    direct_tool_names: Literal["colon", "underscore"] = "colon"
    tools_limit: Annotated[int, msgspec.Meta(ge=1, le=100)] = 15
    tool_response_limit: Annotated[int, msgspec.Meta(ge=0)] = 20000
    call_timeout: PositiveSeconds = 120.0
    data_dir: str | None = None
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    max_body_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 4 * 1024 * 1024
    page_size: Annotated[int, msgspec.Meta(ge=1, le=10000)] = 500  # items per page of tools/list and the like
    # A listen address other hosts can reach needs authentication; true starts without it (with a warning).
    allow_unauthenticated_network: bool = False
    # code_execution (MCPProxy's setting names): off unless enabled; limits of one run.
    enable_code_execution: bool = False
    code_execution_timeout_ms: Annotated[int, msgspec.Meta(ge=1)] = 120000
    code_execution_max_tool_calls: Annotated[int, msgspec.Meta(ge=0)] = 0  # 0: unlimited
    code_execution_max_parallel: Annotated[int, msgspec.Meta(ge=1, le=32)] = 8  # call_tools' default
    # A registry whose host resolves to a loopback, private or link-local address is refused unless true.
    allow_private_registry_fetch: bool = False
    # What an MCP client's `upstream_servers` changes become: "propose" keeps them pending until an
    # operator runs `mcpvisor ctl approve NAME`; "off" refuses them.
    client_server_changes: Literal["propose", "off"] = "propose"
    # The activity log (state.sqlite): calls only, unless arguments and results (redacted) are asked for.
    activity_record_arguments: bool = False
    activity_retention_days: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    activity_max_rows: Annotated[int, msgspec.Meta(ge=1)] = 100_000
    # A tenant's workers stop after this long without a request of that tenant (0: never).
    tenant_idle_stop: Seconds = 600.0
    # Files that each hold one operator (admin) token, for containers; read at start, kept as hashes.
    admin_token_files: list[str] = []


TENANT_NAME = SERVER_NAME


class TenantConfig(_Strict):
    """One `[tenants.NAME]` table: the servers a tenant's clients may use, and their limits.

    Each (tenant, server) pair is its own worker (id `tenant/server`), started on the tenant's
    first request and stopped after `idle_stop` seconds without one.
    """

    servers: list[str] = []
    max_in_flight: Annotated[int, msgspec.Meta(ge=1)] = 32  # calls of this tenant running at once
    calls_per_minute: Annotated[int, msgspec.Meta(ge=1)] | None = None  # None: no rate limit
    idle_stop: Seconds | None = None  # None: [mcpvisor].tenant_idle_stop; 0: never stop
    # Values of the OAuth claim (`[oauth].claim`) that mean this tenant, besides its own name.
    claim_values: list[str] = []
    # Files that each hold one token of this tenant (container secrets); read at start, kept as hashes.
    token_files: list[str] = []


class OAuthResourceConfig(_Strict):
    """`[oauth]`: mcpvisor as an OAuth 2.1 resource server; JWT access tokens from one issuer."""

    issuer: str  # the authorization server's issuer identifier (the `iss` of its tokens)
    resource: str  # this mcpvisor's resource identifier: tokens must name it as their audience
    jwks_uri: str | None = None  # else taken from the issuer's metadata
    claim: str = "tenant"  # the claim (a string or a list of strings) that names the tenant
    admin_values: list[str] = []  # values of `claim` that make the bearer an operator
    scopes_supported: list[str] = []
    algorithms: list[str] = msgspec.field(default_factory=lambda: ["RS256", "ES256", "PS256", "EdDSA"])
    leeway: Seconds = 30.0  # clock skew allowed on exp/nbf/iat

    def __post_init__(self) -> None:
        # `none` and the HMAC family would let anyone holding the issuer's public key forge tokens.
        refused = [alg for alg in self.algorithms if alg not in JWT_ALGORITHMS]
        if refused:
            raise ValueError(
                f"oauth.algorithms: {refused[0]!r} is not accepted; use public-key algorithms of: "
                + ", ".join(JWT_ALGORITHMS)
            )
        if not self.algorithms:
            raise ValueError("oauth.algorithms must name at least one algorithm")


JWT_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA", "Ed25519")


REGISTRY_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class RegistryConfig(_Strict):
    """One `[registries.ID]` table: a server registry speaking the official MCP Registry API (v0.1)."""

    name: str
    url: str  # the registry's base URL; `/v0.1/servers` is appended
    protocol: Literal["modelcontextprotocol/registry"] = "modelcontextprotocol/registry"
    token: str | None = None  # a secret reference only: ${env:NAME} or ${file:PATH}


def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or (":" in host and not host.startswith("[")):
        raise ConfigError(f"listen must be HOST:PORT (IPv6 as [::1]:PORT), got {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port)
