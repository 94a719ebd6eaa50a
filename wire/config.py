"""The configuration's Structs, shared by every process: a server, its policy, the settings.

The TOML loader that fills them from a file is the supervisor's (supervisor/config.py); the
frontend and the workers receive them in their launch specs and in `ConfigChanged`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Final, Literal
from urllib.parse import urlsplit

import msgspec

from mcpvisor.wire.secrets import SECRET_REF

# \Z, not $: "$" also matches before a final newline, and a name ends up in paths and log lines.
SERVER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")


class ConfigError(Exception):
    """A configuration file that cannot be used; the message names the file and, where known, the line."""


class _Strict(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    pass


Seconds = Annotated[float, msgspec.Meta(ge=0)]
PositiveSeconds = Annotated[float, msgspec.Meta(gt=0)]


class Policy(_Strict):
    """`[servers.NAME.policy]`: how the worker is started, kept up and stopped, and how it talks to its upstream.

    Every key is optional; the defaults suit most servers. The restart keys (`autorestart`,
    `startsecs`, `startretries`, `stopsignal`, `stopwaitsecs`, `exitcodes`) mean what they mean to
    supervisord. `ctl update` applies a changed policy; a client's `upstream_servers patch` of the
    policy alone applies at once.
    """

    init_timeout: Annotated[
        PositiveSeconds,
        msgspec.Meta(description="Seconds allowed to connect to the upstream and complete `initialize`."),
    ] = 30.0
    discovery_timeout: Annotated[
        PositiveSeconds,
        msgspec.Meta(
            description="Seconds allowed to list the upstream's tools, resources, resource templates and prompts"
            " (every page)."
        ),
    ] = 30.0
    poll_interval: Annotated[
        PositiveSeconds,
        msgspec.Meta(
            description="Seconds between rediscoveries of an upstream that does not announce changes to its lists"
            " (`list_changed`)."
        ),
    ] = 300.0
    call_timeout: Annotated[
        PositiveSeconds | None,
        msgspec.Meta(
            description="Seconds a call to this server may take (progress notifications reset it); unset, the"
            " `[mcpvisor]` `call_timeout` applies."
        ),
    ] = None
    reconnect_backoff_max: Annotated[
        PositiveSeconds,
        msgspec.Meta(
            description="The longest wait between the worker's reconnects to an upstream that died or dropped"
            " the connection: 0.5 s, 1 s, 2 s, ... capped here."
        ),
    ] = 60.0
    ping_interval: Annotated[
        PositiveSeconds,
        msgspec.Meta(
            description="Seconds between the worker's pings to its upstream; an upstream that does not answer"
            " within `ping_timeout` is hung and is replaced."
        ),
    ] = 10.0
    ping_timeout: Annotated[PositiveSeconds, msgspec.Meta(description="Seconds the upstream has to answer a ping.")] = (
        5.0
    )
    heartbeat_timeout: Annotated[
        PositiveSeconds,
        msgspec.Meta(description="A worker silent this many seconds is hung: the supervisor kills and restarts it."),
    ] = 5.0
    autorestart: Annotated[
        Literal["true", "false", "unexpected"] | bool,
        msgspec.Meta(
            description='Restart the worker when it exits: true (always), false (never) or "unexpected"'
            " (only when its exit code is not in `exitcodes`)."
        ),
    ] = True
    startsecs: Annotated[
        Seconds,
        msgspec.Meta(
            description="Seconds a worker must stay up (and its upstream become ready) before it counts as"
            " RUNNING; an earlier exit is a failed start."
        ),
    ] = 1.0
    startretries: Annotated[
        Annotated[int, msgspec.Meta(ge=0)],
        msgspec.Meta(
            description="Failed starts retried before the worker is FATAL (`ctl start` is the way out of FATAL)."
        ),
    ] = 5
    backoff_max: Annotated[
        PositiveSeconds,
        msgspec.Meta(description="The longest wait in BACKOFF between restarts: 1, 2, 4, ... seconds, capped here."),
    ] = 300.0
    stopsignal: Annotated[
        Literal["TERM", "INT", "HUP", "QUIT", "KILL", "USR1", "USR2"],
        msgspec.Meta(description="The signal sent to the worker's process group to stop it."),
    ] = "TERM"
    stopwaitsecs: Annotated[
        Seconds,
        msgspec.Meta(
            description="Seconds a stopping worker gets to finish its calls in flight (it refuses new ones)"
            " before SIGKILL."
        ),
    ] = 10.0
    exitcodes: Annotated[
        tuple[int, ...],
        msgspec.Meta(description='Exit codes that count as expected, for `autorestart = "unexpected"`.'),
    ] = (0,)
    flap_window: Annotated[
        PositiveSeconds,
        msgspec.Meta(description="The window, in seconds, in which `flap_count` exits mean the worker is flapping."),
    ] = 60.0
    flap_count: Annotated[
        Annotated[int, msgspec.Meta(ge=2)],
        msgspec.Meta(
            description="Exits within `flap_window` that make a worker flapping: its restarts are slowed down"
            " by backoff."
        ),
    ] = 10
    max_inflight: Annotated[
        Annotated[int, msgspec.Meta(ge=1)],
        msgspec.Meta(description='Calls in flight to this server at once; more get a "busy" error at once.'),
    ] = 64


class UpstreamOAuth(_Strict):
    """`[servers.NAME.oauth]`: the client mcpvisor is at a remote upstream's authorization server.

    All optional: without it mcpvisor registers itself (a Client ID Metadata Document, else
    dynamic registration) when the upstream asks for a login (`mcpvisor ctl login NAME`).
    """

    client_id: Annotated[
        str | None,
        msgspec.Meta(
            description="A client id the operator registered at the authorization server, for servers that offer"
            " no registration."
        ),
    ] = None
    client_secret: Annotated[
        str | None,
        msgspec.Meta(
            description="The secret of `client_id`, as a reference only: ${env:NAME} or ${file:PATH}, never the"
            " secret itself."
        ),
    ] = None
    scopes: Annotated[list[str], msgspec.Meta(description="Scopes asked for when the server names none.")] = []
    client_metadata_url: Annotated[
        str | None,
        msgspec.Meta(
            description="An https URL serving this client's metadata document (a Client ID Metadata Document),"
            " used where the server supports one."
        ),
    ] = None
    shared: Annotated[
        bool,
        msgspec.Meta(
            description="One operator login (`mcpvisor ctl login NAME`) serves every tenant, for a service account."
            " By default each tenant connects its own account with the server's `NAME:login` tool."
        ),
    ] = False

    def __post_init__(self) -> None:
        if self.client_secret is not None and not SECRET_REF.fullmatch(self.client_secret):
            raise ValueError("oauth.client_secret must be a reference (${env:NAME} or ${file:PATH}), not the secret")


def _bind_path(path: str) -> bool:
    return path.startswith("/") and ".." not in path.split("/") and "\0" not in path


class SandboxConfig(_Strict):
    """A `sandbox` table: the bubblewrap sandbox a server's process runs in, and its limits.

    `sandbox = true` is this table with its defaults. Set under [mcpvisor] for every server, under
    a server, or under a tenant (its limits and binds apply to each of its servers). Unset limits
    take the defaults: 1024 MiB of memory and 256 processes; for a tenant's server also one core
    of CPU, a 1024 MiB home and a network of its own.
    """

    enabled: Annotated[bool, msgspec.Meta(description="Run the server's process in a sandbox.")] = True
    network: Annotated[
        bool | Literal["outbound", "host"] | None,
        msgspec.Meta(
            description='"outbound" (or true): a network of its own that reaches out but never the host, its'
            ' loopback or link-local addresses; "host": the host\'s network, loopback included; false: loopback'
            ' only. Default "outbound" for tenants\' servers, "host" for the others.'
        ),
    ] = None
    private_networks: Annotated[
        bool | None,
        msgspec.Meta(
            description="With an outbound network, reach the private ranges too (10/8, 172.16/12, 192.168/16,"
            " 100.64/10, fc00::/7). Default false."
        ),
    ] = None
    home_mb: Annotated[
        Annotated[int, msgspec.Meta(ge=1)] | None,
        msgspec.Meta(
            description="Size of the sandbox's home, in MiB; over it, writes fail (quota) or the process is stopped."
            " Default 1024 for tenants' servers, unlimited for the others."
        ),
    ] = None
    memory_mb: Annotated[
        Annotated[int, msgspec.Meta(ge=16)] | None,
        msgspec.Meta(description="Memory of the sandbox's processes together, in MiB; above it they are killed."),
    ] = None
    max_processes: Annotated[
        Annotated[int, msgspec.Meta(ge=1)] | None,
        msgspec.Meta(description="Processes and threads the sandbox may run at once."),
    ] = None
    cpu: Annotated[
        Annotated[float, msgspec.Meta(gt=0)] | None,
        msgspec.Meta(description="CPU time as a number of cores (0.5: half of one); unlimited when unset."),
    ] = None
    ro: Annotated[
        list[str],
        msgspec.Meta(
            description="Host paths shown read-only inside, at the same path; `{tenant}` becomes the tenant's name."
        ),
    ] = []
    rw: Annotated[
        list[str],
        msgspec.Meta(description="Host paths shown writable inside, at the same path; `{tenant}` as in `ro`."),
    ] = []
    limits: Annotated[
        Literal["auto", "cgroup", "watchdog"],
        msgspec.Meta(
            description="How limits are enforced: a cgroup where one is writable, else a watchdog (auto; for"
            " tenants a missing cgroup is an error); `cgroup` refuses to start without one; `watchdog` opts into"
            " the watchdog."
        ),
    ] = "auto"

    def __post_init__(self) -> None:
        for path in (*self.ro, *self.rw):
            if not _bind_path(path):
                raise ValueError(f"sandbox bind {path!r} must be an absolute path without '..'")


class ServerConfig(_Strict):
    """`[servers.NAME]`: one upstream MCP server, run as a command (stdio) or reached at a URL.

    Exactly one of `command` and `url` is given. NAME is letters, digits, `_`, `-` or `.` (no `:`
    or `/`), at most 63 characters; `frontend` is reserved.
    """

    command: Annotated[
        str | None,
        msgspec.Meta(
            description="The program to run as a stdio upstream, found on the supervisor's PATH or in the folder"
            " of the Python that runs mcpvisor."
        ),
    ] = None
    args: Annotated[list[str], msgspec.Meta(description="Arguments of `command`.")] = []
    env: Annotated[
        dict[str, str],
        msgspec.Meta(
            description="Environment variables of `command`; values may be secret references, ${env:NAME} or"
            " ${file:PATH}, resolved in the worker."
        ),
    ] = {}
    cwd: Annotated[str | None, msgspec.Meta(description="The working directory of `command`.")] = None
    url: Annotated[
        str | None,
        msgspec.Meta(description="The http(s) URL of a remote upstream (streamable HTTP, or SSE)."),
    ] = None
    transport: Annotated[
        Literal["auto", "stdio", "streamable-http", "sse"],
        msgspec.Meta(
            description='How to reach the upstream; "auto" is stdio for a command, SSE for a URL ending in'
            " /sse, else streamable HTTP."
        ),
    ] = "auto"
    headers: Annotated[
        dict[str, str],
        msgspec.Meta(
            description="HTTP headers sent to a remote upstream; values may be secret references, ${env:NAME} or"
            " ${file:PATH}."
        ),
    ] = {}
    enabled: Annotated[
        bool,
        msgspec.Meta(description="false: configured but not started (`ctl enable` and `ctl disable` write it)."),
    ] = True
    quarantined: Annotated[
        bool,
        msgspec.Meta(
            description="true: started, but its tools are neither shown nor run until an operator approves it"
            " (`ctl approve NAME`)."
        ),
    ] = False
    endpoint: Annotated[
        bool | None,
        msgspec.Meta(
            description="Serve this server alone at /mcp/servers/NAME (true) or not (false); unset, the"
            " `[mcpvisor]` `enable_server_endpoints` applies."
        ),
    ] = None
    policy: Annotated[Policy, msgspec.Meta(description="Restart, connection and discovery policy.")] = msgspec.field(
        default_factory=Policy
    )
    oauth: Annotated[
        UpstreamOAuth | None,
        msgspec.Meta(
            description="The OAuth client settings of a remote server that needs a login (`mcpvisor ctl login NAME`)."
        ),
    ] = None
    sandbox: Annotated[
        bool | SandboxConfig | None,
        msgspec.Meta(
            description="Run this server's process in a sandbox (true, or a table of options); unset follows"
            " `[mcpvisor]` `sandbox`. Tenants' servers always run in one."
        ),
    ] = None

    @property
    def kind(self) -> Literal["stdio", "streamable-http", "sse"]:
        """The transport actually used."""
        if self.command is not None:
            return "stdio"
        if self.transport == "sse" or (self.transport == "auto" and (self.url or "").rstrip("/").endswith("/sse")):
            return "sse"
        return "streamable-http"

    def call_timeout(self, default: float, asked: float = 0.0) -> float:
        """Seconds a call to this server may take: its policy's `call_timeout`, else `default`.

        `default` is `[mcpvisor] call_timeout`; `asked` (when > 0) is the caller's own deadline,
        which shortens the call, never lengthens it. The frontend decides with this what it asks of
        the worker, and the worker decides again with it, so both hold the same deadline, and a
        worker launched from an older config (during a reload) still holds the shorter.
        """
        own = self.policy.call_timeout if self.policy.call_timeout is not None else default
        return min(asked, own) if asked > 0 else own

    def problem(self, quote: str = "`") -> str | None:
        """What keeps this server from running, or None: the rules of a server table, wherever one comes from.

        Exactly one of `command` and `url`, a transport that fits it, a URL a client can connect to.
        The config loader, the admin API, approvals and a client's `upstream_servers` all ask this;
        each puts the server's name in front. `quote` marks field names as the caller's readers
        write them (`url` in a config file's messages, 'url' in a tool's). Never repeats the URL,
        which may hold a secret.
        """
        command, url = f"{quote}command{quote}", f"{quote}url{quote}"
        if (self.command is None) == (self.url is None):
            return f"needs exactly one of {command} (stdio) or {url} (HTTP)"
        if self.command is not None and self.transport not in ("auto", "stdio"):
            return "has a command, so its transport is stdio"
        if self.url is not None:
            if self.transport == "stdio":
                return "has a url, so its transport cannot be stdio"
            if (problem := _url_problem(self.url)) is not None:
                return f"{url} {problem}"
        return None


def _url_problem(url: str) -> str | None:
    """What makes `url` unusable as an upstream's address, or None."""
    if not url.startswith(("http://", "https://")):
        return "must start with http:// or https://"
    if any(char.isspace() or not char.isprintable() or char in "\"'<>\\" for char in url):
        # Nor what ends a URL inside a text: a listing or a log line could not redact its tail.
        return (
            "must not contain spaces, quotes, angle brackets, backslashes or control characters (percent-encode them)"
        )
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - reading the port is the check
    except ValueError:
        return "is not a valid URL: its host or port cannot be read (a port is a number up to 65535)"
    if not parts.hostname:
        return "has no host: give one, as in https://example.com/mcp"
    return None


def server_name_problem(name: str) -> str | None:
    """What keeps `name` from naming a server, or None; the caller puts the name in front."""
    if name == "frontend":
        return "is reserved for mcpvisor's own frontend process"
    if not SERVER_NAME.match(name):
        return (
            "must be letters, digits, '_', '-' or '.' (no ':' or '/'), at most 63 characters, starting with a"
            " letter or digit"
        )
    return None


# What an MCP client may give of a server table (`upstream_servers add` and `patch`), in the order
# listings show it, with each field's JSON type. `quarantined` is not among them: leaving quarantine
# is an operator's approval, not a config edit; nor are `oauth`, `sandbox` and `endpoint`.
CLIENT_FIELDS: Final[Mapping[str, type]] = MappingProxyType(
    {
        "command": str,
        "args": list,
        "cwd": str,
        "url": str,
        "transport": str,
        "env": dict,
        "headers": dict,
        "enabled": bool,
        "policy": dict,
    }
)
# Of those, what a client's patch changes at once: timeouts and restart limits, so nothing new
# runs or connects. A change of any other field is a proposal an operator approves.
DIRECT_FIELDS: Final = frozenset({"policy"})


class Settings(_Strict):
    """`[mcpvisor]`: the listener, the endpoints, limits and the data dir."""

    listen: Annotated[
        str,
        msgspec.Meta(
            description="HOST:PORT of the HTTP listener (IPv6 as [::1]:PORT). An address other hosts can reach"
            " needs tenants, `[oauth]` or `allow_unauthenticated_network`."
        ),
    ] = "127.0.0.1:8080"
    enable_direct_endpoint: Annotated[
        bool,
        msgspec.Meta(description="Serve every upstream tool as `server:tool` at /mcp/direct (404 when false)."),
    ] = False
    enable_server_endpoints: Annotated[
        bool,
        msgspec.Meta(
            description="Serve every server alone at /mcp/servers/NAME; a server's own `endpoint` overrides this."
        ),
    ] = False
    direct_tool_names: Annotated[
        Literal["colon", "underscore"],
        msgspec.Meta(
            description='Tool names on /mcp/direct: "colon" gives server:tool, "underscore" gives'
            " server__tool (for LLM APIs that accept only [A-Za-z0-9_-]{1,64})."
        ),
    ] = "colon"
    tools_limit: Annotated[
        Annotated[int, msgspec.Meta(ge=1, le=100)],
        msgspec.Meta(
            description=(
                "The number of results `retrieve_tools` returns when the client names none and "
                "`[search] answer_tokens` is 0."
            )
        ),
    ] = 15
    tool_response_limit: Annotated[
        Annotated[int, msgspec.Meta(ge=0)],
        msgspec.Meta(
            description="Characters of a tool result returned at once (0: no limit); the rest is kept for"
            " `read_cache` to page through."
        ),
    ] = 20000
    call_timeout: Annotated[
        PositiveSeconds,
        msgspec.Meta(
            description="Seconds a tools/call, resources/read or prompts/get may take; progress notifications"
            " reset it. A server's policy may override it."
        ),
    ] = 120.0
    leave_delay: Annotated[
        Seconds,
        msgspec.Meta(
            description="After SIGTERM, seconds mcpvisor goes on serving while /healthz answers 503, so a load"
            " balancer's health checks take it out of rotation before it stops accepting. 0 on a single host."
        ),
    ] = 0.0
    leave_timeout: Annotated[
        PositiveSeconds,
        msgspec.Meta(
            description="Once it stops accepting, the longest mcpvisor waits for the calls in flight to finish"
            " before it stops the workers."
        ),
    ] = 30.0
    data_dir: Annotated[
        str | None,
        msgspec.Meta(
            description="Where state.sqlite, logs, OAuth tokens and proposals live (a relative path is relative"
            " to the config file); unset: $STATE_DIRECTORY, else $XDG_DATA_HOME/mcpvisor."
        ),
    ] = None
    log_level: Annotated[
        Literal["debug", "info", "warning", "error"],
        msgspec.Meta(description="The least severe log level written (`serve --log-level` overrides it)."),
    ] = "info"
    max_body_bytes: Annotated[
        Annotated[int, msgspec.Meta(ge=1024)],
        msgspec.Meta(description="The largest HTTP request body accepted; a larger one gets 413."),
    ] = 4 * 1024 * 1024
    max_result_bytes: Annotated[
        Annotated[int, msgspec.Meta(ge=1024)],
        msgspec.Meta(
            description="The largest answer an upstream may give to one request (a tool's result, a resource), in"
            " bytes of JSON; a larger one fails that request with an error naming both sizes, and the upstream"
            " goes on. Default 64 MiB."
        ),
    ] = 64 * 1024 * 1024
    page_size: Annotated[
        Annotated[int, msgspec.Meta(ge=1, le=10000)],
        msgspec.Meta(description="Items per page of tools/list, resources/list, prompts/list and the like."),
    ] = 500
    allow_unauthenticated_network: Annotated[
        bool,
        msgspec.Meta(
            description="true: listen on an address other hosts can reach without tenants or `[oauth]`, with a"
            " warning at every start. Configure tenants instead."
        ),
    ] = False
    enable_code_execution: Annotated[
        bool,
        msgspec.Meta(
            description="Offer the `code_execution` tool: JavaScript or TypeScript that calls upstream tools."
        ),
    ] = False
    code_execution_timeout_ms: Annotated[
        Annotated[int, msgspec.Meta(ge=1)],
        msgspec.Meta(description="Milliseconds one `code_execution` run may take."),
    ] = 120000
    code_execution_max_tool_calls: Annotated[
        Annotated[int, msgspec.Meta(ge=0)],
        msgspec.Meta(description="Tool calls one `code_execution` run may make (0: unlimited)."),
    ] = 0
    code_execution_max_parallel: Annotated[
        Annotated[int, msgspec.Meta(ge=1, le=32)],
        msgspec.Meta(description="Calls a `code_execution` run's `call_tools` makes at once unless it asks for fewer."),
    ] = 8
    allow_private_registry_fetch: Annotated[
        bool,
        msgspec.Meta(
            description="true: allow registries whose host resolves to a loopback, private or link-local address."
        ),
    ] = False
    client_server_changes: Annotated[
        Literal["propose", "off"],
        msgspec.Meta(
            description='What an MCP client\'s `upstream_servers` changes become: "propose" keeps them pending'
            ' until an operator runs `mcpvisor ctl approve NAME`; "off" refuses them.'
        ),
    ] = "propose"
    activity_record_arguments: Annotated[
        bool,
        msgspec.Meta(
            description="true: the activity log keeps each call's arguments and result too (16,384 characters"
            " each, redacted); false: the call alone."
        ),
    ] = False
    activity_retention_days: Annotated[
        Annotated[float, msgspec.Meta(gt=0)],
        msgspec.Meta(description="Activity rows older than this many days are pruned, at start and every minute."),
    ] = 30.0
    activity_max_rows: Annotated[
        Annotated[int, msgspec.Meta(ge=1)],
        msgspec.Meta(description="The activity log keeps at most this many rows, dropping the oldest."),
    ] = 100_000
    tenant_idle_stop: Annotated[
        Seconds,
        msgspec.Meta(
            description="A tenant's workers stop after this many seconds without a request of that tenant (0: never)."
        ),
    ] = 600.0
    admin_token_files: Annotated[
        list[str],
        msgspec.Meta(
            description="Files that each hold one operator (admin) token, for container secrets; read at start,"
            " kept as hashes."
        ),
    ] = []
    state_url: Annotated[
        str | None,
        msgspec.Meta(
            description="A PostgreSQL URL (postgresql://USER:PASSWORD@HOST:PORT/DB) of a state store shared by"
            " replicas; the password may be a ${env:NAME} or ${file:PATH} reference. Unset: SQLite in the data dir."
        ),
    ] = None
    sandbox: Annotated[
        bool | SandboxConfig,
        msgspec.Meta(
            description="Run every server's process in a sandbox (true, or a table of options). Tenants' servers"
            " always run in one."
        ),
    ] = False
    audit_required: Annotated[
        bool | None,
        msgspec.Meta(
            description="Refuse a tenant's calls while the activity log cannot record them, instead of running them"
            " unaudited. Default true when tenants are configured."
        ),
    ] = None
    data_reserve_mb: Annotated[
        Annotated[int, msgspec.Meta(ge=0)],
        msgspec.Meta(
            description="MiB the sandboxes' homes together always leave free on the volume of the state and logs;"
            " a sandbox writing past it is stopped."
        ),
    ] = 64
    login_link_ttl: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            le=3600,
            description="Seconds a tenant's upstream login link (from a `SERVER:login` tool) can be opened, once.",
        ),
    ] = 300.0
    public_url: Annotated[
        str | None,
        msgspec.Meta(
            description="The address people's browsers reach this mcpvisor at (e.g. https://mcp.example.com),"
            " for the links of upstream logins and their return to /oauth/callback. Default: the listen address."
        ),
    ] = None

    def __post_init__(self) -> None:
        if self.public_url is not None and not re.fullmatch(r"https?://[^/?#\s]+/?", self.public_url):
            raise ValueError("public_url must be an http(s) origin such as https://mcp.example.com (no path)")


TENANT_NAME = SERVER_NAME


class TenantConfig(_Strict):
    """`[tenants.NAME]`: the servers a tenant's clients may use, and their limits.

    Each (tenant, server) pair is its own worker (id `tenant/server`), started on the tenant's
    first request and stopped after `idle_stop` seconds without one. Configuring any tenant means
    every client presents a token (`mcpvisor token add NAME`).
    """

    servers: Annotated[
        list[str], msgspec.Meta(description="Names of `[servers.*]` tables this tenant's clients may use.")
    ] = []
    max_in_flight: Annotated[
        Annotated[int, msgspec.Meta(ge=1)],
        msgspec.Meta(description="Calls of this tenant running at once; more get HTTP 429 at once."),
    ] = 32
    calls_per_minute: Annotated[
        Annotated[int, msgspec.Meta(ge=1)] | None,
        msgspec.Meta(
            description="A token bucket of calls per minute; over it, HTTP 429 with Retry-After. Unset: no rate limit."
        ),
    ] = None
    idle_stop: Annotated[
        Seconds | None,
        msgspec.Meta(
            description="Seconds without a request after which this tenant's workers stop (0: never); unset, the"
            " `[mcpvisor]` `tenant_idle_stop` applies."
        ),
    ] = None
    claim_values: Annotated[
        list[str],
        msgspec.Meta(
            description="Values of the OAuth claim (`[oauth]` `claim`) that mean this tenant, besides its name."
        ),
    ] = []
    token_files: Annotated[
        list[str],
        msgspec.Meta(
            description="Files that each hold one token of this tenant (container secrets); read at start, kept as"
            " hashes."
        ),
    ] = []
    sandbox: Annotated[
        SandboxConfig | None,
        msgspec.Meta(description="Limits and extra binds of this tenant's sandboxes, over those of each server."),
    ] = None


class OAuthResourceConfig(_Strict):
    """`[oauth]`: mcpvisor as an OAuth 2.1 resource server, taking JWT access tokens from one issuer.

    Clients with OAuth support find the issuer from mcpvisor's 401 and the protected resource
    metadata (RFC 9728), log the user in, and send its access tokens.
    """

    issuer: Annotated[
        str, msgspec.Meta(description="The authorization server's issuer identifier (the `iss` of its tokens).")
    ]
    resource: Annotated[
        str,
        msgspec.Meta(
            description="This mcpvisor's resource identifier, as clients reach it: tokens must name it in `aud`."
        ),
    ]
    jwks_uri: Annotated[
        str | None,
        msgspec.Meta(description="Where the issuer's signing keys are; unset, taken from the issuer's metadata."),
    ] = None
    claim: Annotated[
        str,
        msgspec.Meta(
            description="The claim (a string or a list of strings) that names the tenant; a dotted name such as"
            " realm_access.roles reaches into objects."
        ),
    ] = "tenant"
    admin_values: Annotated[
        list[str], msgspec.Meta(description="Values of `claim` that make the bearer an operator.")
    ] = []
    scopes_supported: Annotated[
        list[str], msgspec.Meta(description="Scopes told to clients in the protected resource metadata.")
    ] = []
    algorithms: Annotated[
        list[str],
        msgspec.Meta(
            description="Signature algorithms accepted; public-key algorithms only (`none` and the HS family are"
            " refused)."
        ),
    ] = msgspec.field(default_factory=lambda: ["RS256", "ES256", "PS256", "EdDSA"])
    leeway: Annotated[Seconds, msgspec.Meta(description="Seconds of clock skew allowed on `exp`, `nbf` and `iat`.")] = (
        30.0
    )

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


class ToolLimit(_Strict):
    """`[[policy.limits]]`: calls per minute and calls in flight of the tools a pattern names, per tenant.

    Each tenant the rule names has its own count: with `tenant = "*"`, alice and bob each get the
    limit. A call over any rule that matches it is refused at once with a tool error that says when
    to retry.
    """

    tools: Annotated[
        str,
        msgspec.Meta(
            description='The tools, as a glob over `server:tool` ("search:*", "*:delete_*", "github:create_issue").'
        ),
    ]
    tenant: Annotated[
        str,
        msgspec.Meta(
            description='The tenant the rule counts for, or "*" for each tenant; "local" is the workstation user and'
            " operators."
        ),
    ] = "*"
    calls_per_minute: Annotated[
        Annotated[int, msgspec.Meta(ge=1)] | None,
        msgspec.Meta(description="A token bucket of calls per minute; over it, a tool error with Retry-After."),
    ] = None
    max_in_flight: Annotated[
        Annotated[int, msgspec.Meta(ge=1)] | None,
        msgspec.Meta(description="Calls running at once; more are refused at once."),
    ] = None

    def __post_init__(self) -> None:
        if self.calls_per_minute is None and self.max_in_flight is None:
            raise ValueError(f"policy.limits for {self.tools!r}: give calls_per_minute, max_in_flight or both")


class PolicyConfig(_Strict):
    """`[policy]`: who may see and call which tool with which arguments (Cedar policies), and per-tool limits.

    Without this table every tool a tenant's servers offer is listed and callable, as before.
    """

    files: Annotated[
        list[str],
        msgspec.Meta(
            description="Cedar policy files (a relative path is relative to the config file); `mcpvisor check`"
            " validates them. With files, a call no policy permits is refused."
        ),
    ] = []
    mode: Annotated[
        Literal["enforce", "dry-run"],
        msgspec.Meta(
            description='"enforce" refuses what the policies deny; "dry-run" decides and records ("would deny",'
            ' "would wait for approval") but refuses nothing.'
        ),
    ] = "enforce"
    approval_timeout: Annotated[
        PositiveSeconds,
        msgspec.Meta(description="Seconds a call that needs an operator's approval waits before it is refused."),
    ] = 300.0
    limits: Annotated[
        list[ToolLimit], msgspec.Meta(description="Calls per minute and in flight per (tenant, tool pattern).")
    ] = []


REGISTRY_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class RegistryConfig(_Strict):
    """`[registries.ID]`: a server registry speaking the official MCP Registry API (v0.1).

    Clients search it with `search_servers` for servers to propose. ID is 1-64 letters, digits,
    `_` or `-`.
    """

    name: Annotated[str, msgspec.Meta(description="The registry's name, as `list_registries` shows it.")]
    url: Annotated[str, msgspec.Meta(description="The registry's base http(s) URL; `/v0.1/servers` is appended.")]
    protocol: Annotated[
        Literal["modelcontextprotocol/registry"], msgspec.Meta(description="The API the registry speaks.")
    ] = "modelcontextprotocol/registry"
    token: Annotated[
        str | None,
        msgspec.Meta(description="A bearer token for the registry, as a reference only: ${env:NAME} or ${file:PATH}."),
    ] = None


class SearchConfig(_Strict):
    """The `[search]` table: how `retrieve_tools` ranks tools and how much its answer may cost a client.

    A `retrieve_tools` call without `limit` answers within a token budget: the best few tools in
    full (description, input schema, annotations), the next ones by name and a one-line summary,
    whose schemas `describe_tools` gives. Ranking fuses BM25 with text embeddings from the bundled
    model, or from an OpenAI-compatible embedding service when `embedding_url` is set.
    """

    answer_tokens: Annotated[
        int,
        msgspec.Meta(
            ge=0,
            le=100_000,
            description=(
                "Size of a `retrieve_tools` answer without `limit`, in tokens counted as characters / 4. "
                "0 answers `tools_limit` tools in full instead, as when a client sets `limit`."
            ),
        ),
    ] = 1000
    full_entries: Annotated[
        int,
        msgspec.Meta(
            ge=0,
            le=100,
            description=(
                "How many of the best tools the budgeted answer gives in full (with input schema), "
                "as long as they fit in half the budget; the rest are compact."
            ),
        ),
    ] = 1
    summary_chars: Annotated[
        int,
        msgspec.Meta(
            ge=0,
            le=1000,
            description=(
                "Longest one-line summary of a compact entry, in characters. Lower-ranked entries get "
                "shorter ones, down to the name alone, so that more tools fit the budget."
            ),
        ),
    ] = 100
    embedding_url: Annotated[
        str | None,
        msgspec.Meta(
            description=(
                "An OpenAI-compatible embeddings endpoint (Ollama, TEI, vLLM, an API), e.g. "
                "`http://127.0.0.1:11434/v1/embeddings`, used instead of the bundled model."
            )
        ),
    ] = None
    embedding_model: Annotated[str, msgspec.Meta(description="The `model` sent with every embedding request.")] = ""
    embedding_key: Annotated[
        str | None,
        msgspec.Meta(
            description=(
                "The service's API key, sent as `Authorization: Bearer`: a secret reference only "
                "(`${env:NAME}` or `${file:PATH}`), resolved by the frontend."
            )
        ),
    ] = None
    embedding_input_type: Annotated[
        bool,
        msgspec.Meta(
            description=(
                'Send `input_type` ("query" or "passage") with each request, for services of asymmetric '
                "models (E5, NV-Embed) that read it; the OpenAI API itself refuses the field."
            )
        ),
    ] = False
    embedding_timeout: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            le=60,
            description=(
                "Seconds a search waits for the service to embed its query; past it that search is "
                "ranked by the bundled model (or BM25 alone)."
            ),
        ),
    ] = 2.0
    embedding_batch: Annotated[
        int,
        msgspec.Meta(ge=1, le=4096, description="Tool texts sent in one request when a catalog changes."),
    ] = 64
    embedding_retry: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            le=3600,
            description="Seconds after a failure before the service is asked again; meanwhile searches fall back.",
        ),
    ] = 30.0

    def __post_init__(self) -> None:
        if self.embedding_key is not None and not SECRET_REF.fullmatch(self.embedding_key):
            raise ValueError("search.embedding_key must be a reference (${env:NAME} or ${file:PATH}), not the key")
        if self.embedding_url is not None and not self.embedding_url.startswith(("http://", "https://")):
            raise ValueError("search.embedding_url must start with http:// or https://")


class TelemetryConfig(_Strict):
    """The `[telemetry]` table: OpenTelemetry traces and metrics, each key one of the standard `OTEL_*` variables.

    A variable set in mcpvisor's environment wins over its key. Telemetry is off unless an exporter
    or an endpoint is configured, here or in the environment; the table is read when mcpvisor starts.
    """

    exporter: Annotated[
        str | None,
        msgspec.Meta(description="Where spans go (`OTEL_TRACES_EXPORTER`): `otlp`, `console` or `none`."),
    ] = None
    metrics_exporter: Annotated[
        str | None,
        msgspec.Meta(description="Where the MCP duration histograms go (`OTEL_METRICS_EXPORTER`): `otlp` or `none`."),
    ] = None
    endpoint: Annotated[
        str | None,
        msgspec.Meta(
            description="The collector's base URL (`OTEL_EXPORTER_OTLP_ENDPOINT`), e.g. `http://127.0.0.1:4318`; "
            "setting it alone turns traces and metrics on with the `otlp` exporter."
        ),
    ] = None
    protocol: Annotated[
        Literal["grpc", "http/protobuf"] | None,
        msgspec.Meta(description="The OTLP protocol (`OTEL_EXPORTER_OTLP_PROTOCOL`); the SDK's default is `grpc`."),
    ] = None
    headers: Annotated[
        dict[str, str],
        msgspec.Meta(
            description="Headers sent to the collector (`OTEL_EXPORTER_OTLP_HEADERS`); put a credential as "
            "${env:NAME} or ${file:PATH}."
        ),
    ] = {}
    sampler: Annotated[
        str | None,
        msgspec.Meta(
            description="`OTEL_TRACES_SAMPLER`, e.g. `parentbased_traceidratio`; the default follows the client's "
            "decision and samples every trace it starts."
        ),
    ] = None
    sampler_arg: Annotated[
        float | str | None,
        msgspec.Meta(description="`OTEL_TRACES_SAMPLER_ARG`: for a ratio sampler, the share of traces kept (0 to 1)."),
    ] = None
    service_name: Annotated[
        str | None,
        msgspec.Meta(description="`service.name` of every process (`OTEL_SERVICE_NAME`); `mcpvisor` if unset."),
    ] = None
    resource_attributes: Annotated[
        dict[str, str],
        msgspec.Meta(
            description="More resource attributes (`OTEL_RESOURCE_ATTRIBUTES`), such as `deployment.environment`."
        ),
    ] = {}
    record_arguments: Annotated[
        bool,
        msgspec.Meta(
            description="Record tool arguments and results on spans, redacted and cut at 16 KB as the activity log "
            "keeps them; off by default, as they may hold what a client should not leak."
        ),
    ] = False


def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or (":" in host and not host.startswith("[")):
        raise ConfigError(f"listen must be HOST:PORT (IPv6 as [::1]:PORT), got {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port)
