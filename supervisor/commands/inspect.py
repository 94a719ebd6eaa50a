"""`inspect NAME`."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

import msgspec

from mcpvisor.supervisor.commands import Name, command

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


def render(result: dict[str, Any]) -> str:
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
    return "\n".join(lines)


@command("inspect", args=Name, usage="inspect NAME", render=render)
async def inspect(sup: Supervisor, args: Name) -> dict[str, Any]:
    """Show what a server runs or connects to and the security analysis of its tools.

    The command line or URL (credentials redacted), the names of its env variables and headers
    (never their values), and each tool's risk and findings, marked approved, not approved,
    changed since approval or new since approval. Exits 4 for an unknown server.
    """
    return msgspec.to_builtins(await sup.ask_frontend("inspect", args.name))
