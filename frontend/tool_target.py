"""Finding the upstream tool a `server:tool` name points at, for the built-in call tools and `proxy`.

Unlike the direct endpoint's lookup, a quarantined server's tools are found too: a call to one must
be answered with its security analysis, not with "unknown tool".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mcpvisor.frontend.catalog import split_name
from mcpvisor.frontend.gateway import Gateway
from mcpvisor.frontend.tool_args import ToolInputError


@dataclass(frozen=True, slots=True)
class ToolTarget:
    server: str
    tool: str
    definition: dict[str, Any]
    quarantined: bool

    @property
    def name(self) -> str:
        return f"{self.server}:{self.tool}"

    @property
    def destructive(self) -> bool:
        """The server marks the tool `destructiveHint: true` (whatever else it says)."""
        annotations = self.definition.get("annotations") or {}
        return annotations.get("destructiveHint") is True


def find_tool(gateway: Gateway, name: str) -> ToolTarget:
    """The tool `name` (`server:tool`) names; ToolInputError saying what is wrong otherwise."""
    parts = split_name(name)
    if parts is None:
        raise ToolInputError(
            f"Unknown tool '{name}': upstream tools are named 'server:tool' (find them with retrieve_tools)"
        )
    server, tool = parts
    config = gateway.spec.servers.get(server)
    view = gateway.catalog.servers.get(server)
    if config is None and view is None:
        known = ", ".join(sorted(gateway.spec.servers)) or "none"
        raise ToolInputError(f"Unknown tool '{name}': no server '{server}' (servers: {known})")
    if config is not None and not config.enabled:
        raise ToolInputError(f"Tool '{name}' is unavailable: server '{server}' is disabled")
    if view is None or not view.ready:
        raise ToolInputError(f"Tool '{name}' is unavailable: {gateway.catalog.describe_unavailable(server)}")
    for definition in view.tools:
        if definition.get("name") == tool:
            return ToolTarget(server, tool, definition, quarantined=config is not None and config.quarantined)
    raise ToolInputError(f"Unknown tool '{name}': server '{server}' has no tool '{tool}'")
