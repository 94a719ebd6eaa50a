"""`upstream_servers`: list, add, remove, patch, enable, disable, restart upstream servers and tail their logs.

Listing reads the frontend's own view. An MCP client may be steered by a prompt injection, so what
it asks to change about what runs never takes effect here: `add`, a patch of what a server runs or
where it connects, `remove`, `enable` and `disable` become proposals the supervisor keeps until an
operator approves them (`mcpvisor ctl approve NAME`). Only a patch of `policy` and `restart` act
at once. Secret references (`${env:...}`, `${file:...}`) are refused in anything a client sends;
the supervisor checks all of this again, so a bug here is not enough to get around it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec

from mcpvisor.frontend.door.calls import ClientCall
from mcpvisor.frontend.door.control import ControlClient, ControlError
from mcpvisor.frontend.door.upstreams import UpstreamError, Upstreams
from mcpvisor.frontend.tool_args import (
    ToolInputError,
    check_parameters,
    decode_json,
    error_result,
    get_integer,
    get_string,
    json_result,
    json_type,
)
from mcpvisor.store.proposals import describe_references, secret_references
from mcpvisor.wire.config import CLIENT_FIELDS, DIRECT_FIELDS, ServerConfig, server_name_problem
from mcpvisor.wire.merge import deep_merge
from mcpvisor.wire.redaction import redact_secrets, redact_table, redact_url

UPSTREAM_TOOL_NAME: Final = "upstream_servers"
OPERATIONS: Final = (
    "list",
    "add",
    "remove",
    "update",
    "patch",
    "enable",
    "disable",
    "restart",
    "tail_log",
    "login",
    "logout",
)
DEFAULT_LINES: Final = 50
MAX_LINES: Final = 1000

# Fields that also come as JSON text (`args_json`, ...), for clients that cannot send nested values.
_JSON_FIELDS: Final = ("args", "env", "headers", "policy")
_TABLE_PARAMETERS: Final = (*CLIENT_FIELDS, *(f"{field}_json" for field in _JSON_FIELDS))
_ALLOWED: Final[dict[str, tuple[str, ...]]] = {
    "list": (),
    "add": _TABLE_PARAMETERS,
    "remove": (),
    "update": _TABLE_PARAMETERS,
    "patch": _TABLE_PARAMETERS,
    "enable": (),
    "disable": (),
    "restart": (),
    "tail_log": ("lines",),
    "login": (),
    "logout": (),
}


def nullable(schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    """`schema` or null (null removes the field in a patch), written as `anyOf` branches of one `type`
    each: a `type` list is legal JSON Schema but not portable to clients with single-type dialects."""
    found: dict[str, Any] = {"anyOf": [schema, {"type": "null"}]}
    if description:
        found["description"] = description
    return found


UPSTREAM_SERVERS_TOOL: Final[dict[str, Any]] = {
    "name": UPSTREAM_TOOL_NAME,
    "description": (
        "Manage the upstream MCP servers.\n"
        "- list: every server with its state, tool count, enabled, quarantined, transport and command or "
        "URL (secret values redacted).\n"
        "- add: propose a new server (`name` and `command` or `url`, with `args`, `env`, `cwd`, `headers`, "
        "`transport`, `enabled`, `policy`).\n"
        "- update / patch: change only the fields given (scalars replace, maps such as env and headers "
        "merge, arrays such as args replace, null removes a field). A change of `policy` alone applies at "
        "once; any other is proposed.\n"
        "- remove, enable, disable: propose it for server `name`. restart: restart it now.\n"
        "- tail_log: the last `lines` lines of the server's log.\n"
        "- login: connect your own account to server `name` (a link to open in a browser); logout: "
        "disconnect it (its tokens are forgotten).\n"
        "A proposal is pending: nothing runs, connects or changes until an operator approves it with "
        "`mcpvisor ctl approve NAME`; `list` shows what is pending. Secret references (${env:...}, "
        "${file:...}) are refused: only the operator may write them, in the config file.\n"
        "Nested values may also be passed as JSON text: args_json, env_json, headers_json, policy_json."
    ),
    "inputSchema": {
        "type": "object",
        "properties": {
            "operation": {"type": "string", "enum": list(OPERATIONS), "description": "What to do."},
            "action": {"type": "string", "enum": list(OPERATIONS), "description": "Same as `operation`."},
            "name": {"type": "string", "description": "Server name (every operation but list)."},
            "command": nullable({"type": "string"}, "Program of a stdio server."),
            "args": nullable({"type": "array", "items": {"type": "string"}}, "Its arguments."),
            "args_json": {"type": "string", "description": "`args` as a JSON array string."},
            "env": nullable(
                {"type": "object", "additionalProperties": nullable({"type": "string"})},
                "Environment variables (literal values; ${env:...} and ${file:...} are refused).",
            ),
            "env_json": {"type": "string", "description": "`env` as a JSON object string."},
            "cwd": nullable({"type": "string"}, "Working directory of a stdio server."),
            "url": nullable({"type": "string"}, "URL of a streamable HTTP or SSE server."),
            "transport": nullable(
                {"type": "string", "enum": ["auto", "stdio", "streamable-http", "sse"]}, "Transport (default auto)."
            ),
            "headers": nullable(
                {"type": "object", "additionalProperties": nullable({"type": "string"})},
                "HTTP headers (literal values; ${env:...} and ${file:...} are refused).",
            ),
            "headers_json": {"type": "string", "description": "`headers` as a JSON object string."},
            "enabled": nullable({"type": "boolean"}, "Whether the server runs."),
            "policy": nullable(
                {"type": "object"}, "Timeouts and restart policy (init_timeout, call_timeout, startretries, ...)."
            ),
            "policy_json": {"type": "string", "description": "`policy` as a JSON object string."},
            "lines": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_LINES,
                "default": DEFAULT_LINES,
                "description": "Number of log lines for tail_log.",
            },
        },
        "additionalProperties": False,
    },
    "annotations": {
        "title": "Upstream servers",
        "readOnlyHint": False,
        "destructiveHint": True,
        "idempotentHint": False,
        "openWorldHint": False,
    },
}


class UpstreamServers:
    """The `upstream_servers` tool."""

    def __init__(self, upstreams: Upstreams, control: ControlClient) -> None:
        self.upstreams = upstreams
        self.control = control

    async def __call__(self, arguments: Mapping[str, Any], ctx: Any = None) -> dict[str, Any]:
        operation = _operation(arguments)
        what = f"{UPSTREAM_TOOL_NAME} operation '{operation}'"
        allowed = ("operation", "action", *(("name",) if operation != "list" else ()), *_ALLOWED[operation])
        check_parameters(arguments, allowed, what=what)
        if operation == "list":
            return json_result({"servers": self.list_servers(), **await self._pending()})
        name = get_string(arguments, "name", required=True)
        assert name is not None
        if operation == "tail_log":
            self._known(name)
            lines = get_integer(arguments, "lines", default=DEFAULT_LINES, minimum=1, maximum=MAX_LINES)
            return await self._control(operation, name, "tail", [name, "--lines", str(lines)])
        if operation in ("login", "logout"):
            # The tenant's own account at the upstream: not a change of what runs, never a proposal.
            self._known(name)
            return await self._account(operation, name, ctx)
        self._refuse_when_off(operation)
        if operation == "add":
            return await self._add(name, arguments)
        self._known(name)
        if operation in ("update", "patch"):
            return await self._patch(name, arguments)
        if operation == "restart":
            return await self._control(operation, name, operation, [name])
        return await self._propose(operation, name, {"name": name, "action": operation})

    def list_servers(self) -> list[dict[str, Any]]:
        """Every configured server, with what the frontend knows of its state; secrets redacted."""
        servers = []
        for name in sorted(set(self.upstreams.servers) | set(self.upstreams.catalog.servers)):
            config = self.upstreams.servers.get(name)
            view = self.upstreams.catalog.servers.get(name)
            if config is not None and not config.enabled:
                state = "disabled"
            elif view is None or not view.alive:
                state = "not running"
            else:
                state = str(view.state)
            entry: dict[str, Any] = {
                "name": name,
                "state": state,
                "tool_count": len(view.tools) if view is not None else 0,
                "enabled": config.enabled if config is not None else True,
                "quarantined": config.quarantined if config is not None else False,
            }
            if view is not None and view.error and state != "ready":
                entry["error"] = redact_secrets(view.error)
            if view is not None and view.alive and view.login:
                entry["state"] = "waiting for your login"
                entry["login"] = f"connect your account with the tool `{name}:login` (or operation 'login')"
            if config is not None:
                entry["transport"] = config.kind
                if config.command is not None:
                    entry["command"] = config.command
                    entry["args"] = [redact_secrets(arg) for arg in config.args]
                    if config.cwd is not None:
                        entry["cwd"] = config.cwd
                    entry["env"] = redact_table(config.env)
                else:
                    entry["url"] = redact_url(config.url or "")
                    entry["headers"] = redact_table(config.headers)
            servers.append(entry)
        return servers

    async def _pending(self) -> dict[str, Any]:
        """The changes clients proposed that wait for an operator, as the supervisor keeps them."""
        try:
            result = await self.control.call("server.proposals")
        except ControlError as exc:
            return {"pending_error": f"the pending proposals could not be read: {exc}"}
        return {"pending": result.get("proposals", []) if isinstance(result, dict) else []}

    # -- changes ---------------------------------------------------------------------------------

    async def _add(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        table = {key: value for key, value in _table_fields(arguments).items() if value is not None}
        return await self.propose_add(name, table)

    async def propose_add(self, name: str, table: Mapping[str, Any]) -> dict[str, Any]:
        """Propose a new server with this table: checked here, kept by the supervisor, run only once approved."""
        if (problem := server_name_problem(name)) is not None:
            raise ToolInputError(f"Invalid server name '{name}': {problem}")
        if name in self.upstreams.servers:
            raise ToolInputError(f"Server '{name}' already exists; change it with operation 'patch'")
        _refuse_references(name, table)
        _check_table(name, table)
        return await self._propose("add", name, {"name": name, "action": "add", "config": dict(table)})

    async def _patch(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        patch = _table_fields(arguments)
        if not patch:
            accepted = ", ".join(_TABLE_PARAMETERS)
            raise ToolInputError(f"Nothing to change for server '{name}': give one or more of {accepted}")
        _refuse_references(name, patch)
        current = msgspec.to_builtins(self.upstreams.servers[name])
        _check_table(name, deep_merge(current, patch))
        if set(patch) <= DIRECT_FIELDS:  # timeouts and restart limits: nothing new runs or connects
            return await self._control("patch", name, "server.patch", data={"name": name, "patch": patch})
        return await self._propose("patch", name, {"name": name, "action": "patch", "patch": patch})

    async def _propose(self, operation: str, name: str, data: dict[str, Any]) -> dict[str, Any]:
        answer = await self._control(operation, name, "server.propose", data=data)
        if answer["isError"]:
            return answer
        result = dict(answer["structuredContent"])
        if not result.get("pending"):
            result["message"] = f"Server '{name}' is already as asked; nothing to change."
            return json_result(result)
        action = result.get("action", operation)
        result["message"] = (
            f"PENDING, NOT APPLIED: the {action} of server '{name}' is proposed. Nothing runs, connects or "
            f"changes until an operator approves it with `mcpvisor ctl approve {name}` (after reviewing it with "
            f"`mcpvisor ctl inspect {name}`); an operator may also reject it. upstream_servers list shows it "
            "under 'pending'. Do not retry: a new proposal for the same server replaces this one."
        )
        return json_result(result)

    async def _account(self, operation: str, name: str, ctx: Any) -> dict[str, Any]:
        upstreams = self.upstreams
        if not upstreams.tenant:
            raise ToolInputError(
                f"Server '{name}': an operator logs in with `mcpvisor ctl login {name}` and out with `ctl logout`"
            )
        if operation == "login":
            call = ClientCall(ctx, name) if ctx is not None else None
            return await upstreams.connect_account(name, call)
        try:
            result = await upstreams.disconnect_account(name)
        except UpstreamError as exc:
            return error_result(f"{UPSTREAM_TOOL_NAME} logout '{name}' failed: {exc.message}")
        was = "was disconnected" if result.get("connected") else "was not connected"
        message = f"Your {name} account {was}; its tokens are forgotten. Connect it again with `{name}:login`."
        return json_result({"name": name, "operation": operation, "message": message})

    def _refuse_when_off(self, operation: str) -> None:
        if self.upstreams.settings.client_server_changes == "off":
            raise ToolInputError(
                f"{UPSTREAM_TOOL_NAME} {operation} is refused: the operator has turned off changes to the servers "
                'from MCP clients (client_server_changes = "off" in [mcpvisor]). Ask the operator to make the '
                "change in the config file or with mcpvisor ctl."
            )

    async def _control(
        self, operation: str, name: str, command: str, args: list[str] | None = None, data: Any = None
    ) -> dict[str, Any]:
        try:
            result = await self.control.call(command, args, data)
        except ControlError as exc:
            return error_result(f"{UPSTREAM_TOOL_NAME} {operation} '{name}' failed: {exc}")
        answer: dict[str, Any] = {"name": name, "operation": operation}
        if operation == "tail_log" and isinstance(result, dict) and "streams" in result:
            answer["logs"] = _log_lines(result["streams"])
        elif isinstance(result, dict):
            answer.update({key: value for key, value in result.items() if key != "name"})
        elif result is not None:
            answer["result"] = result
        return json_result(answer)

    def _known(self, name: str) -> None:
        if name not in self.upstreams.servers:
            known = ", ".join(sorted(self.upstreams.servers)) or "none"
            raise ToolInputError(f"Unknown server '{name}' (servers: {known})")


def _operation(arguments: Mapping[str, Any]) -> str:
    operation = get_string(arguments, "operation", choices=OPERATIONS)
    alias = get_string(arguments, "action", choices=OPERATIONS)
    if operation is not None and alias is not None and operation != alias:
        raise ToolInputError("Parameters 'operation' and 'action' disagree; give one of them")
    chosen = operation or alias
    if chosen is None:
        raise ToolInputError(f"Parameter 'operation' is required: one of {', '.join(OPERATIONS)}")
    return chosen


def _log_lines(streams: Any) -> dict[str, list[str]]:
    """Log text by stream (the worker's log, the upstream's stderr) as lines; file paths left out."""
    logs: dict[str, list[str]] = {}
    for stream in streams if isinstance(streams, list) else []:
        if isinstance(stream, dict) and isinstance(stream.get("text"), str):
            logs[str(stream.get("stream", "log"))] = stream["text"].splitlines()
    return logs


def _table_fields(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The server table fields given (an explicit null kept: it removes the field in a patch)."""
    table: dict[str, Any] = {}
    for field, kind in CLIENT_FIELDS.items():
        json_key = f"{field}_json"
        if field in arguments and json_key in arguments:
            raise ToolInputError(f"Give '{field}' or '{json_key}', not both")
        if json_key in arguments:
            text = arguments[json_key]
            if not isinstance(text, str):
                raise ToolInputError(f"Parameter '{json_key}' must be a string of JSON, got {json_type(text)}")
            value = decode_json(text, json_key)
        elif field in arguments:
            value = arguments[field]
        else:
            continue
        if value is not None and not isinstance(value, kind):
            expected = {str: "a string", list: "an array", dict: "an object", bool: "a boolean"}[kind]
            raise ToolInputError(f"Parameter '{field}' must be {expected} or null, got {json_type(value)}")
        table[field] = value
    return table


def _refuse_references(name: str, table: Mapping[str, Any]) -> None:
    """A secret reference is the operator's to write: from a client it would read any file or variable."""
    if where := secret_references(table):
        raise ToolInputError(describe_references(name, where))


def _check_table(name: str, table: Mapping[str, Any]) -> None:
    """Refuse a server table the supervisor would refuse, with a message that names the field."""
    try:
        config = msgspec.convert(dict(table), ServerConfig)
    except msgspec.ValidationError as exc:
        raise ToolInputError(f"Invalid settings for server '{name}': {exc}") from None
    if (problem := config.problem(quote="'")) is not None:
        raise ToolInputError(f"Server '{name}': {problem}")
