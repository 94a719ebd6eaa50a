"""The admin API under /api/v1: JSON for operators, described by /api/v1/openapi.json.

One implementation, two doors: every change goes to the supervisor as the control command `ctl`
sends (start, stop, restart, enable, disable, approve, block, ...), or as the operator's
`server.add | update | remove` (supervisor/commands/server_admin.py), so the config file is
written back exactly as `ctl` writes it. What the API reads itself is what only the frontend
holds: the upstreams' tools and their pins, and the definitions approved before a change (for the
diff an operator reviews). Who may call it is decided by the operator door (console.py).
"""

from __future__ import annotations

import difflib
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol
from urllib.parse import parse_qs, unquote

import msgspec
import trio

from mcpvisor.frontend.door.catalog import ServerView
from mcpvisor.frontend.door.control import ControlClient, ControlError
from mcpvisor.frontend.endpoints.boundary import check_json, send_json
from mcpvisor.frontend.endpoints.console import (
    Admitted,
    OperatorDoor,
    Receive,
    Scope,
    Send,
    header,
    read_body,
    session_cookie,
)
from mcpvisor.frontend.gate.approvals import ToolApprovals, definition_hash
from mcpvisor.frontend.gate.store_writer import StoreWriter
from mcpvisor.frontend.gate.waiting_calls import UnknownCall, WaitingCalls, operator_answer
from mcpvisor.store.state_db import STORE_ERRORS, is_shared
from mcpvisor.store.tokens import TokenError, TokenStore, parse_expiry
from mcpvisor.wire.config import ServerConfig, TenantConfig

log = logging.getLogger(__name__)


class Views(Protocol):
    """Where the upstreams' tools are read: a catalog, or every tenant's catalogs merged by server."""

    @property
    def servers(self) -> Mapping[str, ServerView]: ...


PREFIX: Final = "/api/v1"
MAX_BODY: Final = 1024 * 1024
MAX_LINES: Final = 5000
MAX_ACTIVITY: Final = 1000
FOLLOW_EVERY: Final = 0.5  # seconds between reads of a followed log
KEEPALIVE_EVERY: Final = 15.0
NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-/]{0,127}$")


class ApiError(Exception):
    """An answer other than 2xx; the message tells the caller what to change."""

    def __init__(self, status: int, message: str, error: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error = error or _ERRORS.get(status, "error")


_ERRORS: Final = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    503: "unavailable",
}
_EXIT_STATUS: Final = {2: 400, 3: 409, 4: 404}


def from_control(exc: ControlError) -> ApiError:
    """The supervisor's refusal as an HTTP answer: 400 a bad argument, 404 an unknown name, 409 otherwise."""
    return ApiError(_EXIT_STATUS.get(exc.exit_code, 409), str(exc))


# -- approved definitions, for the diff of a changed tool -------------------------------------------


class DefinitionArchive:
    """The definition behind each pinned hash, kept beside the pins so a changed tool can be diffed.

    The pins (gate/approvals.py) hold hashes only. Whenever a server's catalog changes, the
    definitions that match their pins are stored here; a definition that later differs from its
    pin is then compared with the one that was approved.
    """

    def __init__(self, db: Any, approvals: ToolApprovals, catalog: Views, writer: StoreWriter | None = None) -> None:
        self.db = db
        self.approvals = approvals
        self.catalog = catalog
        self._writer = writer or StoreWriter(db)
        db.execute(
            "CREATE TABLE IF NOT EXISTS approved_definitions (server TEXT NOT NULL, name TEXT NOT NULL,"
            " hash TEXT NOT NULL, definition TEXT NOT NULL, PRIMARY KEY (server, name))"
        )

    def observe(self, worker: str) -> None:
        """Record the tools of a worker's server that match their pins (called on every catalog change)."""
        server = worker.rpartition("/")[2]  # pins are per server name, for every tenant
        view = self.catalog.servers.get(server)
        pins = self.approvals.approved(server)
        if view is None or not pins:
            return
        rows = []
        for tool in view.tools:
            name = tool.get("name")
            if isinstance(name, str) and pins.get(name) == (digest := definition_hash(tool)):
                rows.append((server, name, digest, json.dumps(tool, sort_keys=True)))
        if not rows:
            return

        def write() -> None:
            self.db.executemany(
                "INSERT INTO approved_definitions (server, name, hash, definition) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (server, name) DO UPDATE SET hash = excluded.hash, definition = excluded.definition"
                " WHERE approved_definitions.hash != excluded.hash",
                rows,
            )

        try:
            self._writer.submit(write, f"the approved definitions of {server}")
        except STORE_ERRORS as exc:  # the diff is a convenience; the pins themselves are elsewhere
            log.warning("cannot record the approved definitions of %s: %s", server, exc)

    async def aapproved(self, server: str, name: str) -> dict[str, Any] | None:
        """`approved`, off the event loop when the store is shared."""
        if is_shared(self.db):
            return await trio.to_thread.run_sync(self.approved, server, name)
        return self.approved(server, name)

    def approved(self, server: str, name: str) -> dict[str, Any] | None:
        """The approved definition of a tool, if it was seen while approved."""
        pins = self.approvals.approved(server) or {}
        row = self.db.execute(
            "SELECT hash, definition FROM approved_definitions WHERE server = ? AND name = ?", (server, name)
        ).fetchone()
        if row is None or pins.get(name) != row[0]:
            return None
        return json.loads(row[1])


def definition_diff(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None, name: str) -> str:
    """A unified diff of two tool definitions as indented JSON."""

    def lines(value: Mapping[str, Any] | None) -> list[str]:
        return [] if value is None else json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False).splitlines()

    diff = difflib.unified_diff(lines(before), lines(after), f"{name} (approved)", f"{name} (now)", lineterm="")
    return "\n".join(diff)


# -- routing -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    method: str
    pattern: str  # "/servers/{name}/tools"
    handler: str  # AdminApi method name
    summary: str
    query: tuple[tuple[str, str, str], ...] = ()  # (name, type, description)
    body: str | None = None  # components/schemas entry of the request body
    stream: bool = False  # answers text/event-stream

    def match(self, method: str, path: str) -> dict[str, str] | None:
        if method != self.method:
            return None
        parts, wanted = path.strip("/").split("/"), self.pattern.strip("/").split("/")
        if len(parts) != len(wanted):
            return None
        found = {}
        for part, want in zip(parts, wanted, strict=True):
            if want.startswith("{"):
                if not part:
                    return None
                found[want[1:-1]] = unquote(part)
            elif part != want:
                return None
        return found


_LOG_QUERY = (
    ("stream", "string", "worker or stderr (default: both)"),
    ("lines", "integer", f"how many lines, at most {MAX_LINES} (default 100)"),
)
ROUTES: Final = (
    Route("GET", "/openapi.json", "openapi", "This document"),
    Route("GET", "/session", "session", "The console session: its CSRF token (sets the session cookie)"),
    Route("GET", "/status", "status", "Every supervised process (frontend, workers) as `ctl status` shows it"),
    Route("GET", "/servers", "list_servers", "Servers: state, upstream state, tool count, pid, uptime, restarts"),
    Route("POST", "/servers", "add_server", "Add a server (written to the config file, started)", body="NewServer"),
    Route("GET", "/servers/{name}", "get_server", "One server: its status and its configuration (redacted)"),
    Route("PATCH", "/servers/{name}", "patch_server", "Change a server: a deep merge, null removes", body="Patch"),
    Route("DELETE", "/servers/{name}", "remove_server", "Remove a server (and its table in the config file)"),
    *(
        Route("POST", f"/servers/{{name}}/{verb}", verb, text)
        for verb, text in (
            ("start", "Start its worker (the only way out of FATAL)"),
            ("stop", "Stop its worker"),
            ("restart", "Restart its worker (a new upstream session)"),
            ("enable", "Enable it: start it and write enabled = true"),
            ("disable", "Disable it: stop it and write enabled = false"),
        )
    ),
    Route("POST", "/servers/{name}/approve", "approve", "Approve a proposal, a server or some tools", body="Tools"),
    Route(
        "POST",
        "/servers/{name}/block",
        "block",
        "Reject a proposal, quarantine a server, or withhold tools",
        body="Tools",
    ),
    Route("GET", "/servers/{name}/tools", "tools", "Its tools, each with its pin: approved, changed, new, unapproved"),
    Route("GET", "/servers/{name}/logs", "logs", "The end of its logs (worker, upstream stderr)", query=_LOG_QUERY),
    Route(
        "GET",
        "/servers/{name}/logs/follow",
        "follow_logs",
        "Follow its logs as server-sent events (one `log` event per new chunk)",
        query=_LOG_QUERY[:1],
        stream=True,
    ),
    Route("GET", "/pending", "pending", "What waits for an operator: proposals, quarantined servers, changed tools"),
    Route("GET", "/pending/{name}", "inspect", "The review of one: analysis, exact command or URL, diffs"),
    Route(
        "GET",
        "/activity",
        "activity",
        "The activity log, oldest first; page forward with after = the previous answer's last",
        query=(
            ("server", "string", "only this server's calls"),
            ("since", "string", "only the last 30s, 15m, 2h, 7d"),
            ("after", "integer", "only rows with a larger id (the `last` of the previous page)"),
            ("limit", "integer", f"at most this many rows, the newest (1-{MAX_ACTIVITY}, default 100)"),
        ),
    ),
    Route("GET", "/calls", "waiting_calls", "Calls waiting for an operator's approval (arguments redacted)"),
    Route("POST", "/calls/{id}/allow", "allow_call", "Allow a waiting call: it runs now"),
    Route("POST", "/calls/{id}/deny", "deny_call", "Deny a waiting call; its client is told the reason", body="Reason"),
    Route("GET", "/tenants", "tenants", "Tenants: their servers, limits and token counts"),
    Route("GET", "/tokens", "list_tokens", "Access tokens (never the token itself)"),
    Route("POST", "/tokens", "add_token", "Create a token; the answer is the only time it is shown", body="NewToken"),
    Route("DELETE", "/tokens/{id}", "revoke_token", "Revoke a token"),
    Route("GET", "/accounts", "accounts", "Upstream logins kept: worker, tenant, server, expiry (never a token)"),
    Route(
        "DELETE",
        "/accounts/{tenant}/{server}",
        "revoke_account",
        "Disconnect a tenant's upstream account (its tokens are forgotten; it logs in again)",
    ),
)


class AdminApi:
    """Serves /api/v1 to operators, through `control` for everything that acts."""

    def __init__(
        self,
        door: OperatorDoor,
        control: ControlClient,
        *,
        servers: Callable[[], Mapping[str, ServerConfig]],
        catalog: Views,
        approvals: ToolApprovals,
        archive: DefinitionArchive | None = None,
        tenants: Callable[[], Mapping[str, TenantConfig]] = dict,
        tokens: TokenStore | None = None,
        waiting: WaitingCalls | None = None,
    ) -> None:
        self.waiting = waiting
        self.door = door
        self.control = control
        self._servers = servers
        self.catalog = catalog
        self.approvals = approvals
        self.archive = archive
        self._tenants = tenants
        self.tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        admitted = await self.door.enter(scope, receive, send)
        if admitted is None:
            return
        path = scope["path"][len(PREFIX) :] or "/"
        method = scope["method"]
        try:
            route, params = self._route(method, path)
            body = await self._body(scope, admitted.receive) if route.body is not None else None
            query = _query(scope)
            if route.stream:
                await getattr(self, route.handler)(send, admitted.receive, query=query, **params)
                return
            handler: Callable[..., Awaitable[tuple[int, Any]]] = getattr(self, route.handler)
            status, result = await handler(**params, query=query, body=body, admitted=admitted, scope=scope)
        except ApiError as exc:
            await send_json(send, exc.status, {"error": exc.error, "message": exc.message})
            return
        except ControlError as exc:
            error = from_control(exc)
            await send_json(send, error.status, {"error": error.error, "message": error.message})
            return
        headers: list[tuple[bytes, bytes]] = []
        if isinstance(result, _WithHeaders):
            result, headers = result.body, result.headers
        await send_json(send, status, result, headers=headers)

    def _route(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        allowed = []
        for route in ROUTES:
            if (params := route.match(method, path)) is not None:
                for key, value in params.items():
                    if not NAME.match(value):
                        raise ApiError(400, f"invalid {key} {value[:80]!r}")
                return route, params
            if route.match(route.method, path) is not None:
                allowed.append(route.method)
        if allowed:
            raise ApiError(405, f"{method} is not allowed on {PREFIX}{path} (allowed: {', '.join(sorted(allowed))})")
        raise ApiError(404, f"no such route: {method} {PREFIX}{path} (see {PREFIX}/openapi.json)")

    async def _body(self, scope: Scope, receive: Receive) -> dict[str, Any]:
        content_type = (header(scope, b"content-type") or "").split(";", 1)[0].strip().lower()
        raw = await read_body(receive, MAX_BODY)
        if raw is None:
            raise ApiError(413, f"the request body is larger than {MAX_BODY} bytes")
        if not raw.strip():
            return {}
        if content_type != "application/json":
            raise ApiError(415, "send the request body as application/json")
        if (problem := check_json(raw)) is not None:
            raise ApiError(
                400, problem[1].replace("Parse error", "the body is not JSON").replace("Invalid request", "bad body")
            )
        value = json.loads(raw)
        if not isinstance(value, dict):
            raise ApiError(400, "the request body must be a JSON object")
        return value

    # -- reads -------------------------------------------------------------------------------------

    async def openapi(self, **_: Any) -> tuple[int, Any]:
        return 200, openapi_document()

    async def session(self, *, admitted: Admitted, scope: Scope, **_: Any) -> tuple[int, Any]:
        session = admitted.session
        headers = []
        if session is None:
            # The boundary admitted this request (workstation peer, or a bearer token): bind a CSRF token.
            session = self.door.sessions.new(None)
            headers.append(session_cookie(scope, session))
        body = {
            "csrf_token": session.csrf,
            "operator": admitted.principal.subject,
            "tokens_required": self.door.tokens_required,
        }
        return 200, _WithHeaders(body, headers)

    async def status(self, **_: Any) -> tuple[int, Any]:
        return 200, await self.control.call("status", data={})

    async def list_servers(self, **_: Any) -> tuple[int, Any]:
        rows = await self.control.call("status", data={})
        configs = self._servers()
        servers = []
        listed: set[str] = set()
        for row in rows:
            # A disabled server may be listed twice: its stopped process and its config entry.
            if row["name"] == "frontend" or row["name"] in listed:
                continue
            listed.add(row["name"])
            tenant, _, server = row["name"].rpartition("/")
            servers.append(self._server_row(server, row, configs.get(server), tenant or None))
        for name, config in configs.items():
            if name not in listed:  # configured but not yet reported (just added)
                servers.append(self._server_row(name, None, config, None))
        frontend = next((row for row in rows if row["name"] == "frontend"), None)
        return 200, {"servers": servers, "frontend": frontend}

    def _server_row(
        self, name: str, row: Mapping[str, Any] | None, config: ServerConfig | None, tenant: str | None
    ) -> dict[str, Any]:
        row = row or {"state": "STOPPED", "description": "", "pid": 0, "uptime": 0, "restarts": 0}
        view = self.catalog.servers.get(name)
        pins = self.approvals.drift(name, view.tools) if view is not None and tenant is None else None
        return {
            "name": f"{tenant}/{name}" if tenant else name,
            "server": name,
            "tenant": tenant,
            "state": row["state"],
            "description": row.get("description", ""),
            "pid": row.get("pid", 0),
            "uptime": row.get("uptime", 0),
            "restarts": row.get("restarts", 0),
            "upstream": row.get("upstream") or (str(view.state) if view is not None else ""),
            "tools": row.get("tools", len(view.tools) if view is not None else 0),
            "error": row.get("error", ""),
            "enabled": config.enabled if config is not None else None,
            "quarantined": config.quarantined if config is not None else None,
            "transport": config.kind if config is not None else "",
            "changed_tools": len(pins.unapproved) if pins is not None and self.approvals.approved(name) else 0,
        }

    def _config(self, name: str) -> ServerConfig:
        config = self._servers().get(name)
        if config is None:
            known = ", ".join(sorted(self._servers())) or "none"
            raise ApiError(404, f"{name}: no such server (servers: {known})")
        return config

    async def get_server(self, *, name: str, **_: Any) -> tuple[int, Any]:
        config = self._config(name)
        rows = await self.control.call("status", data={})
        row = next((row for row in rows if row["name"] == name), None)
        inspection = await self.control.call("inspect", data={"name": name})
        if inspection.get("kind") == "proposal":  # a change pending for it: the server is as it runs now
            inspection = inspection.get("server", {})
        result = self._server_row(name, row, config, None)
        result["config"] = {
            "transport": inspection.get("transport", ""),
            "command": inspection.get("command", []),
            "cwd": inspection.get("cwd", ""),
            "url": inspection.get("url", ""),
            "env": inspection.get("env", []),
            "headers": inspection.get("headers", []),
            "enabled": config.enabled,
            "quarantined": config.quarantined,
            "policy": _builtins(config.policy),
        }
        result["risk"] = inspection.get("risk", "")
        # What each sandbox of the server allows (its own, each tenant's), as `ctl inspect` shows it.
        result["sandboxes"] = inspection.get("sandboxes", {})
        return 200, result

    async def tools(self, *, name: str, **_: Any) -> tuple[int, Any]:
        config = self._config(name)
        view = self.catalog.servers.get(name)
        tools = view.tools if view is not None else []
        pins = self.approvals.approved(name)
        drift = self.approvals.drift(name, tools)
        rows = []
        for tool in tools:
            tool_name = tool.get("name", "")
            if config.quarantined and pins is None:
                pin = "quarantined"
            elif pins is None:
                pin = "not pinned yet"
            elif tool_name in drift.changed:
                pin = "changed"
            elif tool_name in drift.added:
                pin = "new"
            else:
                pin = "approved"
            rows.append(
                {
                    "name": tool_name,
                    "title": tool.get("title"),
                    "description": tool.get("description", ""),
                    "annotations": tool.get("annotations"),
                    "inputSchema": tool.get("inputSchema"),
                    "pin": pin,
                    "hash": definition_hash(tool),
                    "pinned_hash": (pins or {}).get(tool_name),
                }
            )
        return 200, {
            "name": name,
            "ready": view is not None and view.ready,
            "quarantined": config.quarantined,
            "tools": rows,
            "removed_since_approval": drift.removed,
        }

    async def logs(self, *, name: str, query: Mapping[str, str], **_: Any) -> tuple[int, Any]:
        data: dict[str, Any] = {"name": name, "lines": _int(query, "lines", 100, 0, MAX_LINES)}
        if "stream" in query:
            data["stream"] = query["stream"]
        return 200, await self.control.call("tail", data=data)

    async def follow_logs(self, send: Send, receive: Receive, *, name: str, query: Mapping[str, str]) -> None:
        """Server-sent events: `log` events with {stream, text} as the files grow, until the client leaves."""
        data: dict[str, Any] = {"name": name, "lines": 0}
        if "stream" in query:
            data["stream"] = query["stream"]
        first = await self.control.call("tail", data=data)  # refusals (unknown name) are a 4xx, before the stream
        offsets = {stream["stream"]: stream["offset"] for stream in first["streams"]}
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-store"),
                    (b"x-accel-buffering", b"no"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": b": following\n\n", "more_body": True})

        async def stream_chunks(cancel: trio.CancelScope) -> None:
            quiet = 0.0
            while True:
                await trio.sleep(FOLLOW_EVERY)
                try:
                    result = await self.control.call("tail", data={**data, "from": offsets})
                except ControlError as exc:
                    event = json.dumps({"error": str(exc)})
                    await send({"type": "http.response.body", "body": f"event: error\ndata: {event}\n\n".encode()})
                    cancel.cancel()
                    return
                chunks = []
                for stream in result["streams"]:
                    offsets[stream["stream"]] = stream["offset"]
                    if stream["text"]:
                        event = json.dumps({"stream": stream["stream"], "text": stream["text"]})
                        chunks.append(f"event: log\ndata: {event}\n\n")
                quiet = 0.0 if chunks else quiet + FOLLOW_EVERY
                if quiet >= KEEPALIVE_EVERY:
                    chunks.append(": keepalive\n\n")
                    quiet = 0.0
                if chunks:
                    await send({"type": "http.response.body", "body": "".join(chunks).encode(), "more_body": True})

        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream_chunks, nursery.cancel_scope)
            while (await receive())["type"] != "http.disconnect":
                pass
            nursery.cancel_scope.cancel()

    async def pending(self, **_: Any) -> tuple[int, Any]:
        return 200, await self.control.call("pending", data={})

    async def inspect(self, *, name: str, **_: Any) -> tuple[int, Any]:
        result = await self.control.call("inspect", data={"name": name})
        server = result.get("server", result) if result.get("kind") == "proposal" else result
        diffs = []
        view = self.catalog.servers.get(name)
        current = {tool.get("name"): tool for tool in view.tools} if view is not None else {}
        for review in server.get("tools", []):
            if review.get("approval") not in ("changed since approval", "new since approval"):
                continue
            tool = review["tool"]
            before = await self.archive.aapproved(name, tool) if self.archive is not None else None
            after = current.get(tool)
            known = before is not None or review["approval"] == "new since approval"
            diffs.append(
                {
                    "tool": tool,
                    "approval": review["approval"],
                    "before": before,
                    "after": after,
                    "diff": definition_diff(before, after, tool) if known else "",
                    "note": "" if known else "the approved definition was not recorded; the current one is shown",
                }
            )
        result["diffs"] = diffs
        return 200, result

    async def activity(self, *, query: Mapping[str, str], **_: Any) -> tuple[int, Any]:
        data: dict[str, Any] = {"lines": _int(query, "limit", 100, 1, MAX_ACTIVITY)}
        if query.get("server"):
            data["server"] = query["server"]
        if query.get("since"):
            data["since"] = query["since"]
        if "after" in query:
            data["after"] = _int(query, "after", 0, 0, 2**62)
        result = await self.control.call("activity", data=data)
        return 200, {"rows": result["rows"], "last": result["last"]}

    async def waiting_calls(self, **_: Any) -> tuple[int, Any]:
        return 200, {"calls": _builtins(await self._calls("calls", "", "", "")).get("calls", [])}

    async def allow_call(self, *, id: str, admitted: Admitted, **_: Any) -> tuple[int, Any]:
        return 200, _builtins(await self._calls("allow", id, "", f"api:{admitted.principal.subject}"))

    async def deny_call(self, *, id: str, body: dict[str, Any], admitted: Admitted, **_: Any) -> tuple[int, Any]:
        reason = body.get("reason", "")
        if not isinstance(reason, str) or len(reason) > 1000 or set(body) - {"reason"}:
            raise ApiError(400, '"reason" must be text of at most 1000 characters (and the only field)')
        return 200, _builtins(await self._calls("deny", id, reason, f"api:{admitted.principal.subject}"))

    async def _calls(self, action: str, call_id: str, reason: str, decided_by: str) -> Any:
        """The waiting calls, or a verdict: straight to the registry, which the supervisor refuses to reach for us."""
        if self.waiting is None:
            raise ApiError(404, "this mcpvisor holds no calls for approval")
        try:
            return await operator_answer(self.waiting, action, call_id, reason, decided_by)
        except UnknownCall as exc:
            raise ApiError(404, str(exc)) from None

    async def tenants(self, **_: Any) -> tuple[int, Any]:
        counts: dict[str, int] = {}
        for info in await self.tokens.alist() if self.tokens is not None else []:
            counts[info.tenant] = counts.get(info.tenant, 0) + 1
        return 200, {
            "tenants": [
                {**_builtins(tenant), "name": name, "tokens": counts.get(name, 0)}
                for name, tenant in sorted(self._tenants().items())
            ]
        }

    def _token_store(self) -> TokenStore:
        if self.tokens is None:
            raise ApiError(404, "this mcpvisor keeps no tokens")
        return self.tokens

    async def accounts(self, **_: Any) -> tuple[int, Any]:
        return 200, {"accounts": await self.control.call("logins")}

    async def revoke_account(self, *, tenant: str, server: str, **_: Any) -> tuple[int, Any]:
        return 200, await self.control.call("logout", [f"{tenant}/{server}"])

    async def list_tokens(self, **_: Any) -> tuple[int, Any]:
        return 200, {"tokens": [info.as_row() for info in await self._token_store().alist()]}

    # -- changes -----------------------------------------------------------------------------------

    async def add_server(self, *, body: dict[str, Any], **_: Any) -> tuple[int, Any]:
        name, config = body.get("name"), body.get("config")
        if not isinstance(name, str) or not name:
            raise ApiError(400, 'give the server\'s "name" (a string)')
        if not isinstance(config, dict):
            raise ApiError(400, 'give the server\'s table as "config" (an object: command and args, or url)')
        extra = sorted(set(body) - {"name", "config"})
        if extra:
            raise ApiError(400, f"unknown field {extra[0]!r} (give name and config)")
        return 201, await self.control.call("server.add", data={"name": name, "config": config})

    async def patch_server(self, *, name: str, body: dict[str, Any], **_: Any) -> tuple[int, Any]:
        self._config(name)
        if not body:
            raise ApiError(400, "give the fields to change as a JSON object (null removes one)")
        return 200, await self.control.call("server.update", data={"name": name, "patch": body})

    async def remove_server(self, *, name: str, **_: Any) -> tuple[int, Any]:
        self._config(name)
        return 200, await self.control.call("server.remove", data={"name": name})

    async def _lifecycle(self, verb: str, name: str) -> tuple[int, Any]:
        self._config(name)
        if verb in ("enable", "disable"):
            return 200, await self.control.call(verb, data={"name": name})
        rows = await self.control.call(verb, data={"names": [name]})
        return 200, {"name": name, "action": verb, "processes": rows}

    async def start(self, *, name: str, **_: Any) -> tuple[int, Any]:
        return await self._lifecycle("start", name)

    async def stop(self, *, name: str, **_: Any) -> tuple[int, Any]:
        return await self._lifecycle("stop", name)

    async def restart(self, *, name: str, **_: Any) -> tuple[int, Any]:
        return await self._lifecycle("restart", name)

    async def enable(self, *, name: str, **_: Any) -> tuple[int, Any]:
        return await self._lifecycle("enable", name)

    async def disable(self, *, name: str, **_: Any) -> tuple[int, Any]:
        return await self._lifecycle("disable", name)

    async def approve(self, *, name: str, body: dict[str, Any], **_: Any) -> tuple[int, Any]:
        return 200, await self.control.call("approve", data={"name": name, "tools": _tools(body)})

    async def block(self, *, name: str, body: dict[str, Any], **_: Any) -> tuple[int, Any]:
        return 200, await self.control.call("block", data={"name": name, "tools": _tools(body)})

    async def add_token(self, *, body: dict[str, Any], **_: Any) -> tuple[int, Any]:
        store = self._token_store()
        tenant, admin, expires = body.get("tenant"), body.get("admin", False), body.get("expires")
        if not isinstance(admin, bool):
            raise ApiError(400, '"admin" must be true or false')
        if not isinstance(tenant, str) or not tenant:
            raise ApiError(400, 'give the token\'s "tenant" (a string)')
        if not admin and tenant not in self._tenants():
            known = ", ".join(sorted(self._tenants())) or "none configured"
            raise ApiError(404, f"no tenant {tenant!r} (tenants: {known})")
        if expires is not None and not isinstance(expires, str):
            raise ApiError(400, '"expires" is a duration (30d, 12h) or an ISO date')
        try:
            info, token = await store.aadd(tenant, admin=admin, expires=parse_expiry(expires) if expires else None)
        except TokenError as exc:
            raise ApiError(400, str(exc)) from None
        log.info("token %s added for tenant %r over the admin API (admin: %s)", info.id, tenant, admin)
        return 201, {**info.as_row(), "token": token}

    async def revoke_token(self, *, id: str, **_: Any) -> tuple[int, Any]:
        try:
            info = await self._token_store().arevoke(id)
        except TokenError as exc:
            raise ApiError(404, str(exc)) from None
        return 200, {**info.as_row(), "revoked": True}


@dataclass(frozen=True)
class _WithHeaders:
    body: Any
    headers: list[tuple[bytes, bytes]]


def _builtins(value: Any) -> Any:
    return msgspec.to_builtins(value)


def _query(scope: Scope) -> dict[str, str]:
    """The query parameters, the last of each name; bytes that are not UTF-8 cannot fail the request."""
    text = scope.get("query_string", b"").decode("utf-8", "replace")
    return {key: values[-1] for key, values in parse_qs(text).items()}


def _int(query: Mapping[str, str], key: str, default: int, low: int, high: int) -> int:
    raw = query.get(key)
    if raw is None or raw == "":
        return default
    if not re.fullmatch(r"\d{1,19}", raw.strip()):
        raise ApiError(400, f"{key} must be a whole number from {low} to {high}, got {raw[:40]!r}")
    value = int(raw)
    if not low <= value <= high:
        raise ApiError(400, f"{key} must be from {low} to {high}, got {value}")
    return value


def _tools(body: Mapping[str, Any]) -> list[str]:
    tools = body.get("tools", [])
    if not isinstance(tools, list) or not all(isinstance(tool, str) and tool for tool in tools):
        raise ApiError(400, '"tools" must be a list of tool names (leave it out for the whole server)')
    extra = sorted(set(body) - {"tools"})
    if extra:
        raise ApiError(400, f'unknown field {extra[0]!r} (only "tools")')
    return tools


# -- OpenAPI -------------------------------------------------------------------------------------------

_SCHEMAS: Final = {
    "Error": {
        "type": "object",
        "required": ["error", "message"],
        "properties": {"error": {"type": "string"}, "message": {"type": "string"}},
    },
    "NewServer": {
        "type": "object",
        "required": ["name", "config"],
        "properties": {
            "name": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"},
            "config": {
                "type": "object",
                "description": "The server's table as in the config file: command, args, env, cwd; or url, "
                "headers, transport; enabled, quarantined, policy",
            },
        },
    },
    "Patch": {"type": "object", "description": "Fields of the server's table; objects merge, null removes a key"},
    "Tools": {
        "type": "object",
        "properties": {"tools": {"type": "array", "items": {"type": "string"}, "description": "only these tools"}},
    },
    "Reason": {
        "type": "object",
        "properties": {"reason": {"type": "string", "description": "told to the client whose call is denied"}},
    },
    "NewToken": {
        "type": "object",
        "required": ["tenant"],
        "properties": {
            "tenant": {"type": "string"},
            "admin": {"type": "boolean", "default": False},
            "expires": {"type": "string", "description": "30d, 12h, 90m, or an ISO date"},
        },
    },
}


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 description of /api/v1, built from the route table it serves."""
    paths: dict[str, dict[str, Any]] = {}
    error = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    for route in ROUTES:
        names = re.findall(r"\{(\w+)\}", route.pattern)
        operation: dict[str, Any] = {
            "operationId": route.handler,
            "summary": route.summary,
            "parameters": [
                {"name": name, "in": "path", "required": True, "schema": {"type": "string"}} for name in names
            ]
            + [
                {"name": name, "in": "query", "required": False, "schema": {"type": kind}, "description": text}
                for name, kind, text in route.query
            ],
            "responses": {
                "200" if route.handler not in ("add_server", "add_token") else "201": {
                    "description": "OK",
                    "content": {"text/event-stream" if route.stream else "application/json": {}},
                },
                "400": {"description": "Bad input", **error},
                "401": {"description": "No operator credentials", **error},
                "403": {"description": "Not an operator, or a cross-site change", **error},
                "404": {"description": "Unknown name", **error},
            },
        }
        if route.body is not None:
            operation["requestBody"] = {
                "required": route.body in ("NewServer", "Patch", "NewToken"),
                "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{route.body}"}}},
            }
        if route.method not in ("GET", "HEAD"):
            operation["parameters"].append(
                {
                    "name": "X-CSRF-Token",
                    "in": "header",
                    "required": False,
                    "schema": {"type": "string"},
                    "description": "the session's csrf_token (GET /session); needed unless a bearer token is sent",
                }
            )
        paths.setdefault(PREFIX + route.pattern, {})[route.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "mcpvisor admin API",
            "version": "1",
            "description": "What `mcpvisor ctl` does, over HTTP, for operators: the local user on a workstation, "
            "an admin token (`mcpvisor token add --admin`) with tenants.",
        },
        "servers": [{"url": "/"}],
        "paths": paths,
        "components": {
            "schemas": _SCHEMAS,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}, {}],
    }
