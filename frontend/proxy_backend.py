"""The `proxy` tool on the gateway: its catalog and call routing, and keeping its annotations on the wire.

The SDK checks each tool result against the negotiated protocol revision's schema and drops the
keys that schema does not name, among them the proxy extension's annotations (`proxyAction`,
`pythonType`, ...) and the `contentType` of objectified resources: the result is noted with
`unsieved.keep`, so the check runs and the proxy tool's own values are put back afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from mcp.shared.exceptions import MCPError

from mcpvisor.frontend.activity import ActivityLog, Outcome
from mcpvisor.frontend.approvals import ToolApprovals
from mcpvisor.frontend.catalog import ServerView
from mcpvisor.frontend.gateway import Gateway
from mcpvisor.frontend.proxy_tool import run_proxy
from mcpvisor.frontend.quarantine import blocked_answer
from mcpvisor.frontend.tool_args import ToolInputError
from mcpvisor.frontend.tool_target import find_tool
from mcpvisor.frontend.unsieved import keep
from mcpvisor.wire.proxy import ProxyError


async def serve_proxy(backend: GatewayProxyBackend, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Answer one call of the `proxy` tool; its annotations survive the SDK's check (see unsieved)."""
    result = await run_proxy(backend, arguments)
    keep(result)
    return result


class GatewayProxyBackend:
    """`ProxyBackend` over the gateway: what clients may see, named `server:name`; URIs unchanged."""

    def __init__(self, gateway: Gateway, activity: ActivityLog, approvals: ToolApprovals) -> None:
        self.gateway = gateway
        self.activity = activity
        self.approvals = approvals

    def _views(self) -> list[ServerView]:
        return list(self.gateway.catalog.ready_servers(self.gateway.visible_servers()))

    async def list_tools(self) -> list[dict[str, Any]]:
        tools = []
        for view in self._views():
            unapproved = self.approvals.drift(view.id, view.tools).unapproved
            tools += [
                {**tool, "name": f"{view.id}:{tool['name']}"} for tool in view.tools if tool["name"] not in unapproved
            ]
        return tools

    async def list_resources(self) -> list[dict[str, Any]]:
        views = self._views()
        resources = [{**r, "name": f"{view.id}:{r.get('name', '')}"} for view in views for r in view.resources]
        templates = [{**t, "name": f"{view.id}:{t.get('name', '')}"} for view in views for t in view.templates]
        return resources + templates

    async def list_prompts(self) -> list[dict[str, Any]]:
        return [{**p, "name": f"{view.id}:{p['name']}"} for view in self._views() for p in view.prompts]

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        try:
            target = find_tool(self.gateway, name)
        except ToolInputError as exc:
            raise ProxyError(exc.message) from None
        started = time.monotonic()

        def record(outcome: Outcome) -> None:
            self.activity.record(
                server=target.server,
                tool=target.tool,
                variant="proxy",
                intent=None,
                outcome=outcome,
                duration=time.monotonic() - started,
            )

        if (blocked := blocked_answer(self.gateway, self.approvals, target)) is not None:
            record("blocked")
            return blocked
        try:
            result = await self.gateway.forward(
                target.server, "tools/call", {"name": target.tool, "arguments": arguments}
            )
        except MCPError:
            record("error")
            raise
        record("error" if result.get("isError") is True else "ok")
        return result

    async def read_resource(self, uri: str) -> dict[str, Any]:
        server = self.gateway.catalog.resolve_resource(uri)
        visible = self.gateway.visible_servers()
        if server is None or (visible is not None and server not in visible):
            raise ProxyError(f"Resource '{uri}' not found: no connected server offers it")
        return await self.gateway.forward(server, "resources/read", {"uri": uri})

    async def get_prompt(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        target = self.gateway.catalog.resolve_prompt(name)
        visible = self.gateway.visible_servers()
        if target is None or (visible is not None and target[0] not in visible):
            raise ProxyError(f"Prompt '{name}' not found: prompts are named 'server:prompt'")
        return await self.gateway.forward(target[0], "prompts/get", {"name": target[1], "arguments": arguments})
