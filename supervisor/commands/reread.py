"""`reread`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcpvisor.supervisor.commands import Args, command

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import ConfigDiff, Supervisor


def diff_result(diff: ConfigDiff) -> dict[str, Any]:
    return {
        "added": diff.added,
        "changed": diff.changed,
        "removed": diff.removed,
        "settings_changed": diff.settings_changed,
        "telemetry_changed": diff.telemetry_changed,
    }


TELEMETRY_LATER = "[telemetry]: changed; it takes effect when mcpvisor restarts (every process sets it up once)"


def render(result: dict[str, Any]) -> str:
    """supervisorctl's words: available, changed, disappeared."""
    lines = [f"{name}: available" for name in result["added"]]
    lines += [f"{name}: changed" for name in result["changed"]]
    lines += [f"{name}: disappeared" for name in result["removed"]]
    if result["settings_changed"]:
        lines.append("[mcpvisor]: changed (the frontend restarts on update)")
    if result.get("telemetry_changed"):
        lines.append(TELEMETRY_LATER)
    return "\n".join(lines) or "No config updates to processes"


@command("reread", usage="reread", render=render)
async def reread(sup: Supervisor, args: Args) -> dict[str, Any]:
    """Read the config file again and show what changed, without applying it (see `update`)."""
    _new, diff = sup.reread()
    return diff_result(diff)
