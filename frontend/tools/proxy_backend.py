"""The `proxy` tool over the door: its catalog and call routing.

Its results carry the proxy extension's annotations (`proxyAction`, `pythonType`, ...) inside
their content blocks, which the engine passes through as they are in every protocol era.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcpvisor.frontend.door.forwarding import decoded
from mcpvisor.frontend.door.upstreams import NotFound, Refused, Upstreams
from mcpvisor.frontend.tools.proxy_tool import run_proxy
from mcpvisor.wire.proxy import ProxyError


async def serve_proxy(backend: UpstreamsProxyBackend, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Answer one call of the `proxy` tool."""
    return await run_proxy(backend, arguments)


class UpstreamsProxyBackend:
    """`ProxyBackend` over the door: what clients may see, named `server:name`; URIs unchanged."""

    def __init__(self, upstreams: Upstreams) -> None:
        self.upstreams = upstreams

    async def list_tools(self) -> list[dict[str, Any]]:
        return [{**tool, "name": f"{view.id}:{tool['name']}"} for view, tool in self.upstreams.tools()]

    async def list_resources(self) -> list[dict[str, Any]]:
        views = self.upstreams.visible()
        resources = [{**r, "name": f"{view.id}:{r.get('name', '')}"} for view in views for r in view.resources]
        templates = [{**t, "name": f"{view.id}:{t.get('name', '')}"} for view in views for t in view.templates]
        return resources + templates

    async def list_prompts(self) -> list[dict[str, Any]]:
        return [{**prompt, "name": f"{view.id}:{prompt['name']}"} for view, prompt in self.upstreams.prompts()]

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        try:
            target = self.upstreams.find_tool(name, quarantined=True)
        except NotFound as exc:
            raise ProxyError(exc.message) from None
        try:
            return decoded(
                await self.upstreams.call_tool(target, {"name": target.tool, "arguments": arguments}, via="proxy")
            )
        except Refused as refused:
            return refused.answer

    async def read_resource(self, uri: str) -> dict[str, Any]:
        try:
            server = self.upstreams.find_resource(uri)
        except NotFound as exc:
            raise ProxyError(f"Resource '{uri}' not found: {exc.reason}") from None
        return decoded(await self.upstreams.request(server, "resources/read", {"uri": uri}))

    async def get_prompt(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        try:
            server, prompt = self.upstreams.find_prompt(name)
        except NotFound as exc:
            raise ProxyError(f"Prompt '{name}' not found: {exc.reason}") from None
        params = {"name": prompt, "arguments": arguments}
        return decoded(await self.upstreams.request(server, "prompts/get", params))
