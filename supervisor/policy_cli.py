"""`mcpvisor policy test` and `policy schema`: decide a request offline, from the config and its policy files.

No daemon is asked. A tool's annotations come from its approved definition in the state store
(what the running mcpvisor saw and pinned), or from `--annotations`; without either the tool is
taken as one that says nothing (not read-only, destructive, open-world).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mcpvisor.runtime.policies import Decision, Policies, PolicyError
from mcpvisor.runtime.policy_vocabulary import (
    LOCAL_TENANT,
    SCHEMA,
    Kind,
    prompt_attributes,
    resource_attributes,
    tool_attributes,
)
from mcpvisor.store.state_db import STATE_FILE
from mcpvisor.store.state_url import StateStoreError
from mcpvisor.supervisor import config as config_mod
from mcpvisor.supervisor.policy_files import load_policies
from mcpvisor.wire.config import ConfigError

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNKNOWN = 0, 1, 2, 4


ConfigPath = Callable[[str | None], Path]  # `-c` (or None) -> the config file, as every command finds it


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], config_help: str, find: ConfigPath) -> None:
    policy = sub.add_parser(
        "policy",
        help="try the [policy] files on a request, offline; print the Cedar schema they are checked against",
        description="Policies are Cedar files named by [policy] files in the config (see docs/policies.md).",
    )
    actions = policy.add_subparsers(dest="policy_command", metavar="ACTION", required=True)
    test = actions.add_parser(
        "test",
        help="decide one request with the config's policies (no daemon needed): allow, deny or approval",
        description="Decide whether a tenant may call (or see, with --action list) a tool, resource or prompt with "
        "these arguments, as a running mcpvisor would, and name the policies that decided. The tool's annotations "
        "are its approved definition in the state store, else --annotations, else none.",
    )
    test.add_argument("-c", "--config", help=config_help)
    test.add_argument("--tenant", default=LOCAL_TENANT, help=f'the tenant (default "{LOCAL_TENANT}": no tenant)')
    target = test.add_mutually_exclusive_group(required=True)
    target.add_argument("--tool", metavar="SERVER:TOOL", help="the tool, as server:tool")
    target.add_argument("--resource", metavar="SERVER:URI", help="a resource, as server:uri")
    target.add_argument("--prompt", metavar="SERVER:PROMPT", help="a prompt, as server:prompt")
    test.add_argument("--args", default="{}", metavar="JSON", help="the call's arguments as a JSON object")
    test.add_argument("--action", choices=["call", "list"], default="call", help="call (default) or list")
    test.add_argument("--endpoint", default="/mcp/direct", help="context.endpoint (default /mcp/direct)")
    test.add_argument("--via", default="direct", help="context.via: direct, call_tool_read, proxy... (default direct)")
    test.add_argument(
        "--annotations", metavar="JSON", help="the tool's annotations, e.g. '{\"readOnlyHint\": true}' (MCP names)"
    )
    test.add_argument(
        "--expect", choices=["allow", "deny", "approval"], help="exit 1 unless the decision is this one (for CI)"
    )
    test.add_argument("--json", action="store_true", help="print the decision as JSON")
    test.set_defaults(func=lambda args: cmd_test(args, find(args.config)))
    schema = actions.add_parser("schema", help="print the Cedar schema policies are validated against")
    schema.set_defaults(func=lambda _args: print(SCHEMA, end="") or EXIT_OK)


def cmd_test(args: argparse.Namespace, path: Path) -> int:
    try:
        config = config_mod.load(path)
        bundle = load_policies(config, path)
    except ConfigError as exc:
        print(f"mcpvisor: config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if bundle is None or not bundle.sources:
        print(f"mcpvisor: {path}: no [policy] files: every request is allowed", file=sys.stderr)
        return EXIT_USAGE
    try:
        arguments = json.loads(args.args)
        annotations = json.loads(args.annotations) if args.annotations else None
    except json.JSONDecodeError as exc:
        print(f"mcpvisor: policy test: --args and --annotations take JSON: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not isinstance(arguments, dict) or (annotations is not None and not isinstance(annotations, dict)):
        print("mcpvisor: policy test: --args and --annotations take a JSON object", file=sys.stderr)
        return EXIT_USAGE
    tenant = "" if args.tenant == LOCAL_TENANT else args.tenant
    if tenant and tenant not in config.tenants:
        known = ", ".join(sorted(config.tenants)) or "none configured"
        print(f"mcpvisor: policy test: no tenant {tenant!r} (tenants: {known}; {LOCAL_TENANT!r})", file=sys.stderr)
        return EXIT_UNKNOWN
    kind: Kind = "tool" if args.tool else "resource" if args.resource else "prompt"
    server, sep, name = (args.tool or args.resource or args.prompt).partition(":")
    if not sep or not server or not name:
        print(f"mcpvisor: policy test: name the {kind} as SERVER:NAME", file=sys.stderr)
        return EXIT_USAGE
    notes = []
    if server not in config.servers:
        notes.append(f"no server {server!r} is configured")
    elif tenant and server not in config.tenants[tenant].servers:
        notes.append(f"server {server!r} is not one of tenant {tenant!r}'s: its clients cannot reach it at all")
    attributes: dict[str, Any]
    if kind == "tool":
        definition: dict[str, Any] | None = {"name": name, "annotations": annotations} if annotations else None
        if definition is None:
            definition = stored_definition(config, path, server, name)
            if definition is None:
                definition = {"name": name}
                notes.append("no approved definition of this tool is stored: taken as one without annotations")
        attributes = tool_attributes(server, definition)
    elif kind == "resource":
        attributes = resource_attributes(server, {"uri": name})
    else:
        attributes = prompt_attributes(server, {"name": name})
    try:
        policies = Policies.compile(bundle.sources)
    except PolicyError as exc:  # checked by load_policies; a file changed since
        print(f"mcpvisor: config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    decision = policies.decide(
        tenant, args.action, kind, attributes, args=arguments, endpoint=args.endpoint, via=args.via
    )
    if bundle.config.mode == "dry-run":
        notes.append('[policy] mode is "dry-run": a running mcpvisor records this decision and refuses nothing')
    print(render(decision, attributes, notes, as_json=args.json))
    if args.expect is not None and decision.effect != args.expect:
        return EXIT_ERROR
    return EXIT_OK


def render(decision: Decision, attributes: dict[str, Any], notes: list[str], *, as_json: bool) -> str:
    if as_json:
        return json.dumps(
            {
                "decision": decision.effect,
                "policies": list(decision.policies),
                "reasons": list(decision.reasons),
                "errors": list(decision.errors),
                "explanation": decision.explanation,
                "resource": attributes,
                "notes": notes,
            },
            indent=2,
        )
    lines = [
        f"decision: {decision.effect}",
        f"policies: {', '.join(decision.policies) or '(none)'}",
        f"because:  {decision.explanation}",
    ]
    lines += [f"error:    {error}" for error in decision.errors]
    shown = ", ".join(f"{key}={json.dumps(value)}" for key, value in attributes.items())
    lines.append(f"resource: {shown}")
    lines += [f"note:     {note}" for note in notes]
    return "\n".join(lines)


def stored_definition(config: config_mod.Config, config_path: Path, server: str, tool: str) -> dict[str, Any] | None:
    """The tool's approved definition in the state store (SQLite read-only, or the shared store)."""
    query = "SELECT definition FROM approved_definitions WHERE server = ? AND name = ?"
    row = None
    if config.mcpvisor.state_url:
        from mcpvisor.store.state_db import open_store

        try:
            store = open_store("", config.mcpvisor.state_url)
            try:
                row = store.execute(query, (server, tool)).fetchone()
            finally:
                store.close()
        except StateStoreError as exc:
            print(f"mcpvisor: policy test: the tool's definition is not known: {exc}", file=sys.stderr)
            return None
    else:
        path = config_mod.data_dir(config, config_path.resolve()) / STATE_FILE
        if not path.exists():
            return None
        try:
            db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=2.0)
            try:
                row = db.execute(query, (server, tool)).fetchone()
            finally:
                db.close()
        except sqlite3.Error:
            return None
    if row is None:
        return None
    try:
        definition = json.loads(row[0])
    except json.JSONDecodeError:
        return None
    return definition if isinstance(definition, dict) else None
