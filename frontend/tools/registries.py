"""Server registries: `list_registries`, `search_servers` and what `add_from_registry` proposes.

One protocol is spoken, the official MCP Registry API v0.1 (`GET /v0.1/servers?search=&limit=&cursor=`
answering `{"servers": [{"server": {...}, "_meta": {...}}], "metadata": {"nextCursor": ...}}`, and
`GET /v0.1/servers/{name}/versions/latest`). Registries come from `[registries.ID]` tables; one
more, `reference`, is built in and works offline: the MCP reference servers.

A registry entry becomes a ready-to-propose server config: a stdio command from its npm (`npx`),
PyPI (`uvx`) or OCI (`docker run`) package, else its remote URL and transport. Values the entry
marks secret, or leaves for the user to fill in, are never guessed: their names are listed in
`needs` and the config carries no value for them. What a registry returns is only ever proposed.

Fetching guards: the registry's host must not resolve to a loopback, private, link-local or other
non-public address unless `allow_private_registry_fetch` is true; redirects are not followed;
a `nextCursor` that is a URL is followed only on the configured host; each response is read up
to 4 MB; every failure is a RegistryError naming the registry and what went wrong, never its token.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

from mcpvisor.frontend.tool_args import (
    ToolInputError,
    check_parameters,
    error_result,
    get_integer,
    get_string,
    json_result,
)
from mcpvisor.runtime.addresses import Reach, resolve_reach
from mcpvisor.runtime.fetch import FetchError, get_json
from mcpvisor.wire.config import RegistryConfig
from mcpvisor.wire.secrets import SecretError, resolve

BUILTIN_ID = "reference"
PROTOCOL = "modelcontextprotocol/registry"
MAX_RESPONSE_BYTES = 4 * 1024 * 1024
MAX_PAGES = 5  # pages read for one search before answering with what was found
DEFAULT_LIMIT = 10
MAX_LIMIT = 50
REQUEST_TIMEOUT = 15.0
_NAME_PART = re.compile(r"[^A-Za-z0-9_.-]+")


class RegistryError(Exception):
    """A registry that cannot be used or answered badly; the message is safe to show a client."""


# -- the built-in offline list ----------------------------------------------------------------------


def _reference(name: str, title: str, description: str, kind: str, package: str, **extra: Any) -> dict:
    # No version: the list names the servers, and `npx -y`/`uvx` fetch their current release.
    pkg: dict[str, Any] = {"registryType": kind, "identifier": package, "transport": {"type": "stdio"}, **extra}
    return {
        "server": {
            "name": f"io.modelcontextprotocol/{name}",
            "title": title,
            "description": description,
            "repository": {
                "url": "https://github.com/modelcontextprotocol/servers",
                "source": "github",
                "subfolder": f"src/{name}",
            },
            "packages": [pkg],
        },
        "_meta": {"io.mcpvisor/builtin": {"tags": ["reference"]}},
    }


# The reference servers of the MCP project, in the registry's own schema (server.json).
BUILTIN_SERVERS: list[dict[str, Any]] = [
    _reference(
        "everything",
        "Everything",
        "Reference server that exercises every MCP feature: tools, resources, prompts, sampling, logging.",
        "npm",
        "@modelcontextprotocol/server-everything",
    ),
    _reference(
        "fetch", "Fetch", "Fetches a URL and returns its content as markdown for LLM use.", "pypi", "mcp-server-fetch"
    ),
    _reference(
        "filesystem",
        "Filesystem",
        "Secure file operations with configurable access controls.",
        "npm",
        "@modelcontextprotocol/server-filesystem",
        packageArguments=[
            {
                "type": "positional",
                "valueHint": "allowed_directory",
                "isRequired": True,
                "description": "A directory the server may read and write.",
            }
        ],
    ),
    _reference(
        "git",
        "Git",
        "Tools to read, search and change a Git repository.",
        "pypi",
        "mcp-server-git",
        packageArguments=[
            {
                "type": "named",
                "name": "--repository",
                "valueHint": "repository_path",
                "description": "The repository to work on.",
            }
        ],
    ),
    _reference(
        "memory", "Memory", "Knowledge-graph-based persistent memory.", "npm", "@modelcontextprotocol/server-memory"
    ),
    _reference(
        "sequentialthinking",
        "Sequential Thinking",
        "Dynamic and reflective problem-solving through thought sequences.",
        "npm",
        "@modelcontextprotocol/server-sequential-thinking",
    ),
    _reference(
        "time",
        "Time",
        "Time and timezone conversion.",
        "pypi",
        "mcp-server-time",
        packageArguments=[
            {
                "type": "named",
                "name": "--local-timezone",
                "valueHint": "timezone",
                "description": "IANA timezone used as local time.",
            }
        ],
    ),
]


# -- turning an entry into a proposal ---------------------------------------------------------------


@dataclass
class Needs:
    env: list[str] = field(default_factory=list)
    headers: list[str] = field(default_factory=list)
    arguments: list[str] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "env": self.env,
            "headers": self.headers,
            "arguments": self.arguments,
            "needs_secrets": bool(self.secrets),
            "secret_names": self.secrets,
        }


@dataclass
class Hit:
    """One registry server as `search_servers` shows it."""

    id: str
    name: str
    title: str | None
    description: str
    version: str | None
    suggested_name: str
    config: dict[str, Any] | None
    needs: Needs
    source: str  # "npm", "pypi", "oci" or "remote"; "" when nothing here can run it
    note: str = ""
    repository: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out = {
            "id": self.id,
            "name": self.name,
            "title": self.title,
            "description": self.description,
            "version": self.version,
            "suggested_name": self.suggested_name,
            "source": self.source,
            "config": self.config,
            "needs": self.needs.as_dict(),
        }
        if self.repository:
            out["repository"] = self.repository
        if self.note:
            out["note"] = self.note
        return out


def suggested_name(registry_name: str) -> str:
    """`io.github.acme/weather-server` -> `weather-server`: a valid mcpvisor server name."""
    tail = registry_name.rsplit("/", 1)[-1]
    name = _NAME_PART.sub("-", tail).strip("-._") or "server"
    if not name[0].isalnum():
        name = "s" + name
    return name[:63]


def _input_value(item: Mapping[str, Any]) -> str | None:
    value = item.get("value")
    if value is None:
        value = item.get("default")
    return value if isinstance(value, str) and value and "{" not in value else None


def _arguments(items: Any, needs: Needs) -> list[str]:
    args: list[str] = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        value = _input_value(item)
        label = str(item.get("valueHint") or item.get("name") or "argument")
        if item.get("isSecret") and item.get("isRequired"):
            needs.secrets.append(label)
        if item.get("type") == "named":
            flag = item.get("name")
            if not isinstance(flag, str) or not flag:
                continue
            if value is not None and not item.get("isSecret"):
                args.append(f"{flag}={value}")
            elif item.get("isRequired"):
                needs.arguments.append(flag)
        elif value is not None and not item.get("isSecret"):
            args.append(value)
        elif item.get("isRequired"):
            needs.arguments.append(label)
    return args


def _key_values(items: Any, needed: list[str], needs: Needs) -> dict[str, str]:
    """Literal non-secret values go into the config; secret or empty ones are only named."""
    table: dict[str, str] = {}
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            continue
        name = item["name"]
        value = _input_value(item)
        if item.get("isSecret"):
            needs.secrets.append(name)
            needed.append(name)
        elif value is not None:
            table[name] = value
        elif item.get("isRequired"):
            needed.append(name)
    return table


def _package_config(pkg: Mapping[str, Any], needs: Needs) -> dict[str, Any] | None:
    kind = pkg.get("registryType")
    identifier = pkg.get("identifier")
    version = pkg.get("version")
    if not isinstance(identifier, str) or not identifier or (pkg.get("transport") or {}).get("type") != "stdio":
        return None
    env = _key_values(pkg.get("environmentVariables"), needs.env, needs)
    runtime_args = _arguments(pkg.get("runtimeArguments"), needs)
    package_args = _arguments(pkg.get("packageArguments"), needs)
    if kind == "npm":
        spec = f"{identifier}@{version}" if isinstance(version, str) and version else identifier
        config: dict[str, Any] = {"command": "npx", "args": ["-y", *runtime_args, spec, *package_args]}
    elif kind == "pypi":
        spec = f"{identifier}=={version}" if isinstance(version, str) and version else identifier
        config = {"command": "uvx", "args": [*runtime_args, spec, *package_args]}
    elif kind == "oci":
        image = identifier if ":" in identifier.rsplit("/", 1)[-1] or not version else f"{identifier}:{version}"
        env_flags = [arg for name in [*env, *needs.env] for arg in ("-e", name)]
        config = {"command": "docker", "args": ["run", "-i", "--rm", *env_flags, *runtime_args, image, *package_args]}
    else:
        return None
    if env:
        config["env"] = env
    return config


def _remote_config(remote: Mapping[str, Any], needs: Needs) -> dict[str, Any] | None:
    url = remote.get("url")
    kind = remote.get("type")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")) or "{" in url:
        return None
    if kind not in ("streamable-http", "sse"):
        return None
    config: dict[str, Any] = {"url": url, "transport": kind}
    headers = _key_values(remote.get("headers"), needs.headers, needs)
    if headers:
        config["headers"] = headers
    return config


def entry_to_hit(entry: Mapping[str, Any]) -> Hit:
    """A `{"server": {...}, "_meta": {...}}` item (or a bare server.json) as a search hit with its proposal."""
    server = entry.get("server", entry)
    if not isinstance(server, Mapping) or not isinstance(server.get("name"), str):
        raise RegistryError("a registry entry has no server name")
    name = server["name"]
    description = server.get("description") if isinstance(server.get("description"), str) else ""
    repository = server.get("repository")
    hit = Hit(
        id=name,
        name=name,
        title=server.get("title") if isinstance(server.get("title"), str) else None,
        description=description,
        version=server.get("version") if isinstance(server.get("version"), str) else None,
        suggested_name=suggested_name(name),
        config=None,
        needs=Needs(),
        source="",
        repository=repository.get("url") if isinstance(repository, Mapping) else None,
    )
    packages = [p for p in server.get("packages") or [] if isinstance(p, Mapping)]
    order = {"npm": 0, "pypi": 1, "oci": 2}
    for pkg in sorted(packages, key=lambda p: order.get(str(p.get("registryType")), 9)):
        needs = Needs()
        if (config := _package_config(pkg, needs)) is not None:
            hit.config, hit.needs, hit.source = config, needs, str(pkg["registryType"])
            return hit
    for remote in server.get("remotes") or []:
        if not isinstance(remote, Mapping):
            continue
        needs = Needs()
        if (config := _remote_config(remote, needs)) is not None:
            hit.config, hit.needs, hit.source = config, needs, "remote"
            return hit
    hit.note = "no npm, PyPI or OCI package with stdio transport and no usable remote: nothing here can run it"
    return hit


def entry_tags(entry: Mapping[str, Any]) -> set[str]:
    """Tags a `tag` filter matches: publisher-provided tags or keywords, package kinds, and `remote`."""
    tags: set[str] = set()
    server = entry.get("server", entry)
    metas = [entry.get("_meta"), server.get("_meta") if isinstance(server, Mapping) else None]
    for meta in metas:
        if not isinstance(meta, Mapping):
            continue
        for value in meta.values():
            if isinstance(value, Mapping):
                for key in ("tags", "keywords", "categories"):
                    if isinstance(value.get(key), list):
                        tags.update(str(t).lower() for t in value[key])
    if isinstance(server, Mapping):
        for pkg in server.get("packages") or []:
            if isinstance(pkg, Mapping) and pkg.get("registryType"):
                tags.add(str(pkg["registryType"]).lower())
        if server.get("remotes"):
            tags.add("remote")
    return tags


def _is_latest(entry: Mapping[str, Any]) -> bool:
    meta = entry.get("_meta")
    official = meta.get("io.modelcontextprotocol.registry/official") if isinstance(meta, Mapping) else None
    if isinstance(official, Mapping) and official.get("isLatest") is False:
        return False
    return not (isinstance(official, Mapping) and official.get("status") == "deleted")


# -- the registries ---------------------------------------------------------------------------------


def list_registries(configured: Mapping[str, RegistryConfig]) -> list[dict[str, Any]]:
    """Every registry a client may search: the built-in one first. Tokens are never shown."""
    out = [
        {
            "id": BUILTIN_ID,
            "name": "MCP reference servers (built in, offline)",
            "url": None,
            "protocol": PROTOCOL,
            "builtin": True,
            "has_token": False,
        }
    ]
    for rid, reg in sorted(configured.items()):
        out.append(
            {
                "id": rid,
                "name": reg.name,
                "url": reg.url,
                "protocol": reg.protocol,
                "builtin": False,
                "has_token": reg.token is not None,
            }
        )
    return out


async def check_host(url: str, *, allow_private: bool) -> None:
    """Refuse a registry whose host resolves to a non-public address (unless the operator allowed it)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RegistryError("the registry URL must be http:// or https:// with a host")
    if allow_private:
        return
    try:
        reach = await resolve_reach(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
    except OSError:
        raise RegistryError(f"the registry host {parts.hostname} cannot be resolved") from None
    if reach is not Reach.PUBLIC:
        raise RegistryError(
            f"the registry host {parts.hostname} resolves to a loopback, private or link-local address;"
            " set allow_private_registry_fetch = true in [mcpvisor] to allow it"
        )


def _servers_url(base: str) -> str:
    base = base.rstrip("/")
    if base.endswith("/v0.1/servers"):
        return base
    if base.endswith("/v0.1"):
        return base + "/servers"
    return base + "/v0.1/servers"


@dataclass
class RegistryClient:
    """One configured registry over HTTP."""

    rid: str
    config: RegistryConfig
    allow_private: bool = False
    environ: Mapping[str, str] | None = None

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "mcpvisor"}
        if self.config.token is not None:
            try:
                headers["Authorization"] = f"Bearer {resolve(self.config.token, self.environ)}"
            except SecretError as exc:
                raise RegistryError(f"registry {self.rid!r}: its token cannot be read: {exc}") from None
        return headers

    async def get_json(self, url: str, params: Mapping[str, str] | None = None) -> Any:
        await check_host(url, allow_private=self.allow_private)
        limit = f"{MAX_RESPONSE_BYTES // (1024 * 1024)} MB"
        try:
            return await get_json(
                url, timeout=REQUEST_TIMEOUT, max_bytes=MAX_RESPONSE_BYTES, headers=self._headers(), params=params
            )
        except FetchError as exc:
            name = f"registry {self.rid!r}"
            if exc.kind == "status" and exc.detail == 404:
                message = f"{name}: not found (HTTP 404)"
            elif exc.kind == "status" and 300 <= exc.detail < 400:
                message = f"{name} answered with a redirect, which is not followed"
            elif exc.kind == "status":
                message = f"{name} answered HTTP {exc.detail}"
            else:
                message = {
                    "too_large": f"{name}: the response is larger than {limit}",
                    "timeout": f"{name} did not answer within {REQUEST_TIMEOUT:.0f} s",
                    "unreachable": f"{name} cannot be reached: {exc.detail}",
                    "not_json": f"{name} did not answer with JSON",
                }[exc.kind]
            raise RegistryError(message) from None

    def _next_request(self, servers_url: str, cursor: str, params: dict[str, str]) -> tuple[str, dict[str, str]]:
        """The request for the next page: a URL cursor only on the configured host, else the cursor param."""
        if cursor.startswith(("http://", "https://")):
            here, there = urlsplit(servers_url), urlsplit(cursor)
            if (there.scheme, there.hostname, there.port) != (here.scheme, here.hostname, here.port):
                raise RegistryError(f"registry {self.rid!r} pointed its next page at another host; not followed")
            return cursor, {}
        return servers_url, {**params, "cursor": cursor}

    async def search(self, search: str | None, tag: str | None, limit: int) -> list[dict[str, Any]]:
        servers_url = _servers_url(self.config.url)
        params: dict[str, str] = {"limit": str(min(100, max(limit, 30) if tag else limit)), "version": "latest"}
        if search:
            params["search"] = search
        found: list[dict[str, Any]] = []
        url, page_params = servers_url, params
        for _ in range(MAX_PAGES):
            page = await self.get_json(url, page_params)
            if not isinstance(page, dict) or not isinstance(page.get("servers"), list):
                raise RegistryError(
                    f"registry {self.rid!r} answered without a `servers` list: not the MCP Registry API"
                )
            for entry in page["servers"]:
                if isinstance(entry, dict) and _is_latest(entry) and (not tag or tag.lower() in entry_tags(entry)):
                    found.append(entry)
            metadata = page.get("metadata") if isinstance(page.get("metadata"), dict) else {}
            cursor = metadata.get("nextCursor")
            if len(found) >= limit or not isinstance(cursor, str) or not cursor:
                break
            url, page_params = self._next_request(servers_url, cursor, params)
        return found[:limit]

    async def get(self, server_name: str) -> dict[str, Any]:
        url = f"{_servers_url(self.config.url)}/{quote(server_name, safe='')}/versions/latest"
        entry = await self.get_json(url)
        if not isinstance(entry, dict) or not isinstance(entry.get("server", entry), dict):
            raise RegistryError(f"registry {self.rid!r} answered without a server entry")
        return entry


def _check_limit(limit: Any) -> int:
    if limit is None:
        return DEFAULT_LIMIT
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise RegistryError(f"limit must be an integer from 1 to {MAX_LIMIT}")
    return limit


def _client(
    rid: str, configured: Mapping[str, RegistryConfig], allow_private: bool, environ: Mapping[str, str] | None
) -> RegistryClient:
    if rid not in configured:
        known = ", ".join([BUILTIN_ID, *sorted(configured)])
        raise RegistryError(f"unknown registry {rid!r}; known: {known}")
    return RegistryClient(rid, configured[rid], allow_private, environ)


def _builtin_matches(search: str | None, tag: str | None) -> list[dict[str, Any]]:
    needle = (search or "").lower()
    out = []
    for entry in BUILTIN_SERVERS:
        server = entry["server"]
        text = " ".join([server["name"], server.get("title", ""), server.get("description", "")]).lower()
        if needle in text and (not tag or tag.lower() in entry_tags(entry)):
            out.append(entry)
    return out


async def search_servers(
    registry: str,
    search: str | None = None,
    tag: str | None = None,
    limit: Any = None,
    *,
    configured: Mapping[str, RegistryConfig],
    allow_private: bool = False,
    environ: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Hits (as dicts) of one registry, each with its ready-to-propose config and what it needs."""
    count = _check_limit(limit)
    if not isinstance(registry, str) or not registry:
        raise RegistryError("registry must be the id of a registry (see list_registries)")
    if registry == BUILTIN_ID:
        entries = _builtin_matches(search, tag)[:count]
    else:
        entries = await _client(registry, configured, allow_private, environ).search(search, tag, count)
    hits = []
    for entry in entries:
        try:
            hits.append(entry_to_hit(entry).as_dict())
        except RegistryError:
            continue  # one malformed entry does not spoil the page
    return hits


@dataclass
class Proposal:
    """What `upstream_servers add_from_registry` proposes: pending until an operator approves it."""

    name: str
    config: dict[str, Any]
    registry: str
    registry_server: str
    version: str | None
    needs: Needs


async def proposal_from_registry(
    registry: str,
    server_id: str,
    *,
    configured: Mapping[str, RegistryConfig],
    allow_private: bool = False,
    environ: Mapping[str, str] | None = None,
) -> Proposal:
    """Look up one registry server (its latest version) and turn it into a proposal."""
    if not isinstance(server_id, str) or not server_id or len(server_id) > 200:
        raise RegistryError("id must be the registry's server name, as search_servers shows it")
    if registry == BUILTIN_ID:
        entry = next((e for e in BUILTIN_SERVERS if e["server"]["name"] == server_id), None)
        if entry is None:
            raise RegistryError(f"the built-in registry has no server {server_id!r}")
    else:
        entry = await _client(registry, configured, allow_private, environ).get(server_id)
    hit = entry_to_hit(entry)
    if hit.config is None:
        raise RegistryError(f"registry server {server_id!r} cannot be run here: {hit.note}")
    return Proposal(hit.suggested_name, hit.config, registry, hit.name, hit.version, hit.needs)


# -- the built-in tools -----------------------------------------------------------------------------

LIST_REGISTRIES_TOOL: dict[str, Any] = {
    "name": "list_registries",
    "description": "List the MCP server registries that search_servers can search: the built-in offline list of the"
    " MCP reference servers and the registries the operator configured.",
    "inputSchema": {"type": "object", "properties": {}},
    "annotations": {"title": "List server registries", "readOnlyHint": True, "openWorldHint": False},
}

SEARCH_SERVERS_TOOL: dict[str, Any] = {
    "name": "search_servers",
    "description": "Search one registry (see list_registries) for MCP servers. Each hit has name, description,"
    " version, a ready-to-propose config (a stdio command from its npm, PyPI or OCI package, or its remote URL and"
    " transport) and `needs`: the env variables, headers and arguments it asks for and whether any is a secret."
    " Propose one with upstream_servers add_from_registry; an operator approves it before it runs.",
    "inputSchema": {
        "type": "object",
        "properties": {
            "registry": {"type": "string", "description": "A registry id from list_registries."},
            "search": {"type": "string", "description": "Text to look for in server names."},
            "tag": {"type": "string", "description": "Keep servers with this tag (also: npm, pypi, oci, remote)."},
            "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT},
        },
        "required": ["registry"],
    },
    "annotations": {"title": "Search a server registry", "readOnlyHint": True, "openWorldHint": True},
}


def answer_list_registries(configured: Mapping[str, RegistryConfig]) -> dict[str, Any]:
    """The `list_registries` tool result."""
    registries = list_registries(configured)
    return json_result({"registries": registries, "total": len(registries)})


async def answer_search_servers(
    arguments: Mapping[str, Any],
    configured: Mapping[str, RegistryConfig],
    *,
    allow_private: bool = False,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The `search_servers` tool result; bad arguments and registry failures are `isError` results."""
    try:
        check_parameters(arguments, ("registry", "search", "tag", "limit"), what="search_servers")
        registry = get_string(arguments, "registry", required=True, max_length=64)
        search = get_string(arguments, "search", max_length=200)
        tag = get_string(arguments, "tag", max_length=100)
        limit = get_integer(arguments, "limit", default=DEFAULT_LIMIT, minimum=1, maximum=MAX_LIMIT)
    except ToolInputError as exc:
        return error_result(exc.message)
    assert registry is not None
    try:
        hits = await search_servers(
            registry, search, tag, limit, configured=configured, allow_private=allow_private, environ=environ
        )
    except RegistryError as exc:
        return error_result(str(exc))
    return json_result({"registry": registry, "servers": hits, "total": len(hits)})


# -- upstream_servers add_from_registry ------------------------------------------------------------

ADD_FROM_REGISTRY = "add_from_registry"


def with_add_from_registry(definition: Mapping[str, Any]) -> dict[str, Any]:
    """The upstream_servers tool definition with the `add_from_registry` operation added."""
    tool = copy.deepcopy(dict(definition))
    properties = tool["inputSchema"]["properties"]
    for key in ("operation", "action"):
        if key in properties and ADD_FROM_REGISTRY not in properties[key].get("enum", []):
            properties[key]["enum"] = [*properties[key]["enum"], ADD_FROM_REGISTRY]
    properties["registry"] = {"type": "string", "description": "add_from_registry: a registry id (list_registries)."}
    properties["id"] = {"type": "string", "description": "add_from_registry: the server's name in that registry."}
    tool["description"] = (
        tool["description"] + "\n- add_from_registry: `registry` and `id` (as search_servers shows them), optional "
        "`name`: proposes that registry server as a new server, exactly like add; it runs only once approved."
    )
    return tool


class AddFromRegistry:
    """Wraps the upstream_servers handler: `add_from_registry` becomes an `add` of the registry's proposal."""

    def __init__(
        self,
        upstream_servers: Any,
        configured: Mapping[str, RegistryConfig],
        *,
        allow_private: bool = False,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.upstream_servers = upstream_servers
        self.configured = configured
        self.allow_private = allow_private
        self.environ = environ

    async def __call__(self, arguments: Mapping[str, Any], ctx: Any = None) -> dict[str, Any]:
        if (arguments.get("operation") or arguments.get("action")) != ADD_FROM_REGISTRY:
            return await self.upstream_servers(arguments, ctx)
        check_parameters(arguments, ("operation", "action", "registry", "id", "name"), what=ADD_FROM_REGISTRY)
        registry = get_string(arguments, "registry", required=True, max_length=64)
        server_id = get_string(arguments, "id", required=True, max_length=200)
        name = get_string(arguments, "name", max_length=63)
        assert registry is not None and server_id is not None
        try:
            proposal = await proposal_from_registry(
                registry, server_id, configured=self.configured, allow_private=self.allow_private, environ=self.environ
            )
        except RegistryError as exc:
            return error_result(str(exc))
        # The same path as a client's `add`: checked, then kept as a proposal until an operator approves.
        answer = await self.upstream_servers(
            {"operation": "add", "name": name or proposal.name, **proposal.config}, ctx
        )
        if answer.get("isError") or not isinstance(answer.get("structuredContent"), dict):
            return answer
        result = dict(answer["structuredContent"])
        result["registry"] = {"id": registry, "server": proposal.registry_server, "version": proposal.version}
        needs = proposal.needs.as_dict()
        if needs["env"] or needs["headers"] or needs["arguments"]:
            result["needs"] = needs
            missing = ", ".join([*needs["env"], *needs["headers"], *needs["arguments"]])
            result["message"] = (
                f"{result.get('message', '')} The registry entry asks for values that are not set: {missing}; "
                "the operator supplies them (secrets as ${env:NAME} or ${file:PATH}) before or after approving."
            ).strip()
        return json_result(result)
