"""The aggregated catalog: every worker's snapshot, and the names clients see for it."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
from mcp.shared.uri_template import UriTemplate

from mcpvisor.frontend.door.logins import login_tool
from mcpvisor.wire.redaction import redact_secrets
from mcpvisor.wire.states import UpstreamState

log = logging.getLogger(__name__)

MAX_TOOL_NAME = 64  # what many LLM APIs accept: [A-Za-z0-9_-]{1,64}
_catalog_decoder = msgspec.json.Decoder(dict[str, list[dict[str, Any]]])
_initialize_decoder = msgspec.json.Decoder(dict[str, Any])


@dataclass
class ServerView:
    """What the frontend knows of one worker and its upstream."""

    id: str
    state: UpstreamState = UpstreamState.DISCONNECTED
    error: str = ""
    pid: int = 0
    catalog_seq: int = -1
    last_seen: float = 0.0
    alive: bool = False  # the worker process is reachable
    tools: list[dict[str, Any]] = field(default_factory=list)
    resources: list[dict[str, Any]] = field(default_factory=list)
    templates: list[dict[str, Any]] = field(default_factory=list)
    prompts: list[dict[str, Any]] = field(default_factory=list)
    catalog_raw: bytes = b""
    # The upstream's initialize result (protocolVersion, capabilities, serverInfo, instructions).
    initialize: dict[str, Any] = field(default_factory=dict)
    initialize_raw: bytes = b""
    # Waiting for this tenant to connect its own account: the one tool listed is `SERVER:login`.
    login: bool = False

    @property
    def ready(self) -> bool:
        return self.alive and self.state is UpstreamState.READY

    @property
    def listed(self) -> bool:
        """Clients see tools of it: the upstream's when ready, the login tool while it waits for one."""
        return self.ready or (self.alive and self.login)


def exposed_name(server: str, tool: str, style: Literal["colon", "underscore"]) -> str:
    """The name a client sees: `server:tool` or `server__tool`, shortened deterministically past 64."""
    sep = ":" if style == "colon" else "__"
    name = f"{server}{sep}{tool}"
    if style == "underscore":
        name = "".join(c if (c.isascii() and c.isalnum()) or c in "_-" else "_" for c in name)
    if len(name) <= MAX_TOOL_NAME:
        return name
    # Keep a readable head and make it unique with a hash of the whole original name, so two long
    # names never collide by being cut at the same place.
    digest = hashlib.sha256(f"{server}\x00{tool}".encode()).hexdigest()[:10]
    return f"{name[: MAX_TOOL_NAME - 11]}_{digest}"


def split_name(name: str) -> tuple[str, str] | None:
    """`server:tool` -> (server, tool); None when there is no server prefix."""
    server, sep, tool = name.partition(":")
    if not sep or not server or not tool:
        return None
    return server, tool


class Catalog:
    """Snapshots from every worker, and lookups by exposed name and URI."""

    def __init__(self, name_style: Literal["colon", "underscore"] = "colon") -> None:
        self.name_style = name_style
        self.servers: dict[str, ServerView] = {}
        self.version = 0  # bumps on every change a client could see
        self._tool_index: dict[str, tuple[str, str]] = {}
        self._tool_defs: dict[str, dict[str, Any]] = {}
        self._templates: list[tuple[UriTemplate, str]] = []
        self._prompt_index: dict[str, tuple[str, str]] = {}
        self._resource_index: dict[str, str] = {}

    def view(self, server_id: str) -> ServerView:
        view = self.servers.get(server_id)
        if view is None:
            view = self.servers[server_id] = ServerView(server_id)
        return view

    def apply_snapshot(
        self,
        server_id: str,
        *,
        pid: int,
        catalog_seq: int,
        state: UpstreamState,
        error: str,
        catalog: bytes | None,
        initialize: bytes = b"",
        login: bool = False,
    ) -> bool:
        """Take in a worker's snapshot; True when what clients see changed."""
        view = self.view(server_id)
        was_ready, was_login = view.ready, view.listed and view.login
        login = login and state is UpstreamState.AUTHENTICATING
        # An upstream's error may echo what it was sent; no listing shows a credential.
        view.pid, view.catalog_seq, view.state, view.error = pid, catalog_seq, state, redact_secrets(error)
        view.alive, view.last_seen = True, time.monotonic()
        view.login = login
        lists_changed = False
        if initialize and initialize != view.initialize_raw:
            try:
                view.initialize = _initialize_decoder.decode(initialize)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.error("worker %s sent an undecodable initialize result: %s", server_id, exc)
            view.initialize_raw = initialize
        if catalog is not None and (catalog != view.catalog_raw or login != was_login):
            try:
                data = _catalog_decoder.decode(catalog)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.error("worker %s sent an undecodable catalog: %s", server_id, exc)
                data = {}
            view.catalog_raw = catalog
            # While it waits for the tenant's login its one tool is mcpvisor's own, not the upstream's.
            view.tools = [login_tool(server_id.rpartition("/")[2])] if login else data.get("tools", [])
            view.resources = data.get("resources", []) if not login else []
            view.templates = data.get("resourceTemplates", []) if not login else []
            view.prompts = data.get("prompts", []) if not login else []
            lists_changed = True
        now_login = view.listed and view.login
        return self._changed(was_ready != view.ready or was_login != now_login or (view.listed and lists_changed))

    def mark_gone(self, server_id: str, reason: str) -> bool:
        """The worker died or stopped answering; True when what clients see changed."""
        view = self.servers.get(server_id)
        if view is None:
            return False
        was_listed = view.listed
        view.alive = False
        view.error = reason
        view.catalog_seq = -1  # ask for a fresh snapshot when it comes back
        return self._changed(was_listed)

    def remove(self, server_id: str) -> bool:
        view = self.servers.pop(server_id, None)
        return view is not None and self._changed(True)

    def _changed(self, changed: bool) -> bool:
        if changed:
            self._reindex()
            self.version += 1
        return changed

    def _reindex(self) -> None:
        tools: dict[str, tuple[str, str]] = {}
        defs: dict[str, dict[str, Any]] = {}
        templates: list[tuple[UriTemplate, str]] = []
        prompts: dict[str, tuple[str, str]] = {}
        resources: dict[str, str] = {}
        for server_id in sorted(self.servers):
            view = self.servers[server_id]
            if not view.listed:
                continue
            for tool in view.tools:
                if not isinstance(tool.get("name"), str):
                    continue  # an upstream that lists a nameless tool: nothing can call it
                name = exposed_name(server_id, tool["name"], self.name_style)
                if name in tools:
                    log.warning("tool name %s is exposed twice; %s keeps it", name, tools[name][0])
                    continue
                tools[name] = (server_id, tool["name"])
                defs[name] = tool
            for prompt in view.prompts:
                if not isinstance(prompt.get("name"), str):
                    continue
                prompts.setdefault(f"{server_id}:{prompt['name']}", (server_id, prompt["name"]))
            for resource in view.resources:
                if not isinstance(resource.get("uri"), str):
                    continue
                owner = resources.setdefault(resource["uri"], server_id)
                if owner != server_id:
                    log.warning(
                        "resource %s is offered by %s and %s; %s serves it",
                        resource["uri"],
                        owner,
                        server_id,
                        owner,
                    )
            for template in view.templates:
                # Parsed once here, not on every read that has to be matched against them.
                try:
                    templates.append((UriTemplate.parse(template["uriTemplate"]), server_id))
                except (ValueError, KeyError, TypeError):
                    log.warning("server %s lists an unusable resource template: %.100r", server_id, template)
        self._tool_index, self._prompt_index, self._resource_index = tools, prompts, resources
        self._tool_defs = defs
        self._templates = templates

    # -- lookups ---------------------------------------------------------------------------------

    def ready_servers(self, allowed: Iterable[str] | None = None) -> Iterator[ServerView]:
        allowed_set = None if allowed is None else set(allowed)
        for server_id in sorted(self.servers):
            view = self.servers[server_id]
            if view.ready and (allowed_set is None or server_id in allowed_set):
                yield view

    def listed_servers(self) -> Iterator[ServerView]:
        """The servers whose tools clients see: ready ones, and those waiting for the tenant's login."""
        for server_id in sorted(self.servers):
            view = self.servers[server_id]
            if view.listed:
                yield view

    def resolve_tool(self, name: str) -> tuple[str, str] | None:
        """Exposed tool name -> (server id, upstream tool name)."""
        return self._tool_index.get(name)

    def tool_definition(self, name: str) -> dict[str, Any] | None:
        """The upstream's definition of an exposed tool (with its original name)."""
        return self._tool_defs.get(name)

    def resolve_prompt(self, name: str) -> tuple[str, str] | None:
        return self._prompt_index.get(name)

    def resolve_resource(self, uri: str) -> str | None:
        """The server that serves `uri`: a listed resource, else the first template that matches it."""
        if (server := self._resource_index.get(uri)) is not None:
            return server
        return next((server for template, server in self._templates if template.match(uri) is not None), None)

    def describe_unavailable(self, server_id: str) -> str:
        view = self.servers.get(server_id)
        if view is None:
            return f"server '{server_id}' is not configured"
        if not view.alive:
            why = f" ({view.error})" if view.error else ""
            return f"server '{server_id}' is not running{why}; it is being restarted"
        detail = f": {view.error}" if view.error else ""
        return f"server '{server_id}' is {view.state}{detail}"
