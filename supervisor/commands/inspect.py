"""`inspect NAME`."""

from __future__ import annotations

import contextlib
import json
import shlex
from typing import TYPE_CHECKING, Any

import msgspec

from mcpvisor.runtime.pathfd import describe_sandbox
from mcpvisor.supervisor.commands import CommandError, Name, command
from mcpvisor.supervisor.commands.server_propose import inspection

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


def render_proposal(result: dict[str, Any]) -> str:
    lines = [f"proposal: {result['action']} server {result['name']} (by an MCP client, {result['proposed_at']})"]
    if result["command"]:
        lines.append(f"  command:   {shlex.join(result['command'])}")
        if result["cwd"]:
            lines.append(f"  cwd:       {result['cwd']}")
    if result["url"]:
        lines.append(f"  url:       {result['url']} ({result['transport']})")
    if result["command"] or result["url"]:
        lines.append(f"  env:       {', '.join(result['env']) or '-'}")
        lines.append(f"  headers:   {', '.join(result['headers']) or '-'}")
    if result["changes"]:
        lines.append("  changes:")
        width = max(len(change["field"]) for change in result["changes"]) + 2
        for change in result["changes"]:
            lines.append(f"    {change['field']:<{width}}{_value(change['before'])} -> {_value(change['after'])}")
    lines.append(f"  approve: mcpvisor ctl approve {result['name']}   reject: mcpvisor ctl block {result['name']}")
    if "server" in result:
        lines += ["", "as it runs now:", render(result["server"])]
    return "\n".join(lines)


def _value(value: Any) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return "[" + ", ".join(value) + "]"
    return json.dumps(value)


def render(result: dict[str, Any]) -> str:
    if result.get("kind") == "proposal":
        return render_proposal(result)
    state = "quarantined" if result["quarantined"] else "approved"
    state += ", connected" if result["connected"] else ", not connected"
    if not result["enabled"]:
        state += ", disabled"
    lines = [f"server {result['name']} ({state})"]
    if result["command"]:
        lines.append(f"  command:   {shlex.join(result['command'])}")
        if result["cwd"]:
            lines.append(f"  cwd:       {result['cwd']}")
    if result["url"]:
        lines.append(f"  url:       {result['url']} ({result['transport']})")
    lines.append(f"  env:       {', '.join(result['env']) or '-'}")
    lines.append(f"  headers:   {', '.join(result['headers']) or '-'}")
    lines.append(f"  risk:      {result['risk']} (score {result['score']:g})")
    lines.append(f"  tools:     {len(result['tools'])}")
    width = max((len(tool["tool"]) for tool in result["tools"]), default=0) + 2
    for tool in result["tools"]:
        lines.append(f"    {tool['tool']:<{width}}{tool['approval']:<24}{tool['risk']:<9}{tool['summary']}")
        for finding in tool["findings"]:
            lines.append(f"      - [{finding['severity']}] {finding['rule']}: {finding['evidence']}")
    if result["removed_since_approval"]:
        lines.append(f"  removed since approval: {', '.join(result['removed_since_approval'])}")
    lines.append("  (tool descriptions and evidence are untrusted text from the server)")
    for who, sandbox in result.get("sandboxes", {}).items():
        lines += render_sandbox(who, sandbox)
    return "\n".join(lines)


def render_sandbox(who: str, sandbox: dict[str, Any]) -> list[str]:
    """What a sandbox allows, as Flatpak's `info --show-permissions` shows an app's."""
    if not sandbox.get("enabled"):
        return [f"  sandbox ({who}): none, the process runs as mcpvisor does"]
    cpu = f"{sandbox['cpu']:g} cores" if sandbox.get("cpu") else "unlimited"
    home = f"{sandbox['home_mb']} MiB" if sandbox.get("home_mb") else "unlimited"
    return [
        f"  sandbox ({who}):",
        f"    network:    {sandbox['network']}",
        f"    read-only:  {', '.join(sandbox['read_only'])}",
        f"    writable:   {', '.join(sandbox['writable'])}",
        *(f"    refused:    {why}" for why in sandbox.get("refused", [])),
        f"    limits:     {sandbox['memory_mb']} MiB, {sandbox['max_processes']} processes, CPU {cpu}"
        f", home {home} (by {sandbox['limits']})",
        *([f"    uid:        {sandbox['uid']}"] if sandbox.get("uid") is not None else []),
        f"    seccomp:    {sandbox.get('seccomp', '-')}",
        f"    never:      {', '.join(sandbox['never'])}",
    ]


def sandboxes(sup: Supervisor, name: str) -> dict[str, Any]:
    """The sandbox of the server itself and of each tenant's worker of it."""
    if name not in sup.config.servers:
        return {}
    found = {name: describe_sandbox(sup.sandbox_plan(name, for_start=False))}
    for tenant, table in sup.config.tenants.items():
        if name in table.servers:
            found[f"{tenant}/{name}"] = describe_sandbox(sup.sandbox_plan(f"{tenant}/{name}", for_start=False))
    return found


@command("inspect", args=Name, usage="inspect NAME", render=render)
async def inspect(sup: Supervisor, args: Name) -> dict[str, Any]:
    """Show what a server runs or connects to and the security analysis of its tools.

    For a change an MCP client proposed: the action, the exact command line or URL it would run
    or connect to, its env and header names, and each field's value before and after.

    The command line or URL (credentials redacted), the names of its env variables and headers
    (never their values), and each tool's risk and findings, marked approved, not approved,
    changed since approval or new since approval. Exits 4 for an unknown server.
    """
    proposal = sup.proposals.get(args.name)
    if proposal is not None:
        result = inspection(sup, proposal)
        if proposal.action != "add":
            # The server as it runs now, beside what the client would make of it.
            with contextlib.suppress(CommandError):
                result["server"] = msgspec.to_builtins(await sup.ask_frontend("inspect", args.name))
                result["server"]["sandboxes"] = sandboxes(sup, args.name)
        return result
    result = msgspec.to_builtins(await sup.ask_frontend("inspect", args.name))
    result["sandboxes"] = sandboxes(sup, args.name)
    return result
