"""What `mcpvisor check` warns about in valid policies: names the config does not know, list decided by context.

A policy naming a server, tool or tenant that does not exist is valid Cedar and harmless, but it
is most often a typo that leaves a permit or forbid without effect, so it is told, not refused.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from typing import Any

from mcpvisor.runtime.policies import Rule, reads_context
from mcpvisor.runtime.policy_vocabulary import LOCAL_TENANT


def warnings(
    rules: Collection[Rule],
    servers: Mapping[str, Collection[str] | None],
    tenants: Collection[str],
) -> list[str]:
    """One line per doubtful name or use. `servers` maps each server to its known tool names (None: not known)."""
    found: list[str] = []
    for rule in rules:
        named = f"{rule.where} ({rule.id})"
        for kind, value in _entities(rule.body):
            if kind == "Tenant" and value != LOCAL_TENANT and value not in tenants:
                known = ", ".join(sorted(tenants)) or "none configured"
                found.append(f'{named}: Tenant::"{value}" is no tenant (tenants: {known}; "{LOCAL_TENANT}": no tenant)')
            elif kind in ("Tool", "Prompt", "Resource"):
                server, _, name = value.partition(":")
                if server not in servers:
                    found.append(f'{named}: {kind}::"{value}" names no configured server {server!r}')
                elif kind == "Tool" and (tools := servers[server]) is not None and name not in tools:
                    found.append(f'{named}: Tool::"{value}": server {server!r} has no tool {name!r} that was seen')
        for server in _server_literals(rule.body):
            if server not in servers:
                found.append(f"{named}: resource.server == {server!r} names no configured server")
        if _names_list(rule.body.get("action")) and reads_context(rule.body.get("conditions")):
            found.append(
                f"{named}: decides list from context, but a list decision has no arguments or endpoint"
                ' (context.args is {}, context.endpoint is "")'
            )
    return found


def _entities(node: Any) -> Iterator[tuple[str, str]]:
    """Every entity the policy names, in its scope or its conditions, as (type, id)."""
    if isinstance(node, dict):
        for key in ("entity", "__entity"):
            entity = node.get(key)
            if isinstance(entity, dict) and isinstance(entity.get("type"), str) and isinstance(entity.get("id"), str):
                yield entity["type"], entity["id"]
        for value in node.values():
            yield from _entities(value)
    elif isinstance(node, list):
        for item in node:
            yield from _entities(item)


def _server_literals(node: Any) -> Iterator[str]:
    """Strings compared with `resource.server` (either side of == or !=)."""
    if isinstance(node, dict):
        for op in ("==", "!="):
            pair = node.get(op)
            if isinstance(pair, dict):
                left, right = pair.get("left"), pair.get("right")
                for attr, literal in ((left, right), (right, left)):
                    value = literal.get("Value") if isinstance(literal, dict) else None
                    if _is_resource_server(attr) and isinstance(value, str):
                        yield value
        for value in node.values():
            yield from _server_literals(value)
    elif isinstance(node, list):
        for item in node:
            yield from _server_literals(item)


def _is_resource_server(node: Any) -> bool:
    access = node.get(".") if isinstance(node, dict) else None
    return isinstance(access, dict) and access.get("attr") == "server" and access.get("left") == {"Var": "resource"}


def _names_list(scope: Any) -> bool:
    """The action scope names `list` itself (== or in), not merely every action."""
    if not isinstance(scope, dict):
        return False
    entities = [scope.get("entity")] if "entity" in scope else scope.get("entities") or []
    return any(isinstance(e, dict) and e.get("type") == "Action" and e.get("id") == "list" for e in entities)
