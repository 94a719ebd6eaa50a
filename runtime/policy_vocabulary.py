"""What a Cedar policy sees of a request: the principal, the two actions, the resources and the context.

- principal: `Tenant::"NAME"`; the clients of the plain endpoints (the user running mcpvisor on
  a workstation, operators' admin tokens on a shared host) are `Tenant::"local"`.
- action: `Action::"list"` (is it shown) and `Action::"call"` (may it run: tools/call,
  resources/read, prompts/get).
- resource: `Tool::"server:tool"`, `Resource::"server:uri"`, `Prompt::"server:prompt"`, with the
  attributes of `SCHEMA`. A tool's annotations are read as the MCP specification defines their
  defaults: a tool that says nothing is not read-only, destructive, not idempotent and open-world.
- context: `args` (the call's arguments; `{}` for list), `endpoint` (the HTTP path the client
  called, "" for list) and `via` (the way of calling: direct, call_tool_read, proxy, ...).

Every value comes from a client or an upstream, so entity ids travel in Cedar's JSON form (never
spliced into policy text), and arguments are made into plain Cedar values by `cedar_args`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

Action = Literal["list", "call"]
Kind = Literal["tool", "resource", "prompt"]

LOCAL_TENANT: Final = "local"  # the principal of the plain endpoints (no tenant)
ENTITY_TYPES: Final[dict[Kind, str]] = {"tool": "Tool", "resource": "Resource", "prompt": "Prompt"}

# The schema policies are validated against (`mcpvisor check`, and every load). A call's arguments
# differ from tool to tool, so `args` declares none: a policy reads one after testing for it
# (`context.args has repo && context.args.repo like "acme/*"`), and an unguarded read is an error.
SCHEMA: Final = """\
entity Tenant;
entity Tool = {
  server: String,
  name: String,
  read_only: Bool,
  destructive: Bool,
  idempotent: Bool,
  open_world: Bool,
};
entity Resource = {
  server: String,
  uri: String,
  name: String,
  mime_type: String,
};
entity Prompt = {
  server: String,
  name: String,
};
type Request = {
  args: {},
  endpoint: String,
  via: String,
};
action list, call appliesTo {
  principal: Tenant,
  resource: [Tool, Resource, Prompt],
  context: Request,
};
"""

MAX_DEPTH: Final = 32  # nesting of arguments kept; deeper values are left out
_INT_RANGE: Final = (-(2**63), 2**63 - 1)
# Cedar's JSON reads an object with one of these keys as an entity or extension value: a client
# must not be able to make an argument look like `Tenant::"ops"`.
_ESCAPES: Final = ("__",)


def principal_of(tenant: str) -> str:
    """The tenant's name as a policy names it: `Tenant::"NAME"`, the plain endpoints `Tenant::"local"`."""
    return tenant or LOCAL_TENANT


def tool_attributes(server: str, definition: Mapping[str, Any]) -> dict[str, Any]:
    """`Tool` attributes from an upstream's tool definition (annotations with the MCP defaults)."""
    annotations = definition.get("annotations")
    hints = annotations if isinstance(annotations, Mapping) else {}
    read_only = hints.get("readOnlyHint") is True
    return {
        "server": server,
        "name": str(definition.get("name", "")),
        "read_only": read_only,
        # Meaningful only when not read-only; the specification's default is true.
        "destructive": not read_only and hints.get("destructiveHint") is not False,
        "idempotent": not read_only and hints.get("idempotentHint") is True,
        "open_world": hints.get("openWorldHint") is not False,
    }


def resource_attributes(server: str, resource: Mapping[str, Any]) -> dict[str, Any]:
    """`Resource` attributes of a listed resource (or a template: its `uriTemplate` is the uri)."""
    uri = resource.get("uri", resource.get("uriTemplate", ""))
    return {
        "server": server,
        "uri": uri if isinstance(uri, str) else "",
        "name": _text(resource.get("name")),
        "mime_type": _text(resource.get("mimeType")),
    }


def prompt_attributes(server: str, prompt: Mapping[str, Any]) -> dict[str, Any]:
    return {"server": server, "name": _text(prompt.get("name"))}


def entity_id(kind: Kind, attributes: Mapping[str, Any]) -> str:
    """`server:tool`, `server:uri` or `server:prompt`: the id of the resource entity."""
    return f"{attributes['server']}:{attributes['uri'] if kind == 'resource' else attributes['name']}"


def cedar_args(arguments: Any) -> dict[str, Any]:
    """A call's arguments as a Cedar record.

    JSON's null has no Cedar value: such a member is left out (`has` is false). A number with a
    fraction, or an integer beyond 64 bits, becomes its text (Cedar's numbers are 64-bit integers);
    a whole float such as 5.0 becomes 5. Members whose name starts with `__` are left out.
    """
    if not isinstance(arguments, Mapping):
        return {}
    value = _value(arguments, 0)
    return value if isinstance(value, dict) else {}


def _value(value: Any, depth: int) -> Any:
    """A JSON value as a Cedar JSON value; None for what has none."""
    if value is None or depth > MAX_DEPTH:
        return None
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value if _INT_RANGE[0] <= value <= _INT_RANGE[1] else str(value)
    if isinstance(value, float):
        if value.is_integer() and _INT_RANGE[0] <= value <= _INT_RANGE[1]:
            return int(value)
        return repr(value)
    if isinstance(value, Mapping):
        record = {}
        for key, item in value.items():
            if not isinstance(key, str) or key.startswith(_ESCAPES):
                continue
            if (converted := _value(item, depth + 1)) is not None:
                record[key] = converted
        return record
    if isinstance(value, list | tuple):
        return [converted for item in value if (converted := _value(item, depth + 1)) is not None]
    return None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""
