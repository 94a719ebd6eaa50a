"""An upstream with many tools, for catalog-size benchmarks: `python many_tools_server.py --tools 500`.

Each tool has its own name and a description with a few distinct words, so that a search over
thousands of them has something to rank. The list is built once as plain dicts on the SDK's
low-level server, so that starting twenty of these costs little next to what is measured.
"""

from __future__ import annotations

import argparse
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.stdio import stdio_server

TOPICS = ("invoice", "calendar", "weather", "ticket", "repository", "email", "database", "sensor", "report", "image")
VERBS = ("list", "create", "update", "delete", "search", "export", "archive", "summarize")
SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}}


def tools(server: str, count: int) -> list[dict[str, Any]]:
    found = []
    for index in range(count):
        topic = TOPICS[index % len(TOPICS)]
        verb = VERBS[(index // len(TOPICS)) % len(VERBS)]
        found.append(
            {
                "name": f"{verb}_{topic}_{index}",
                "description": f"{verb.capitalize()} {topic} records, variant {index} of server {server}.",
                "inputSchema": SCHEMA,
            }
        )
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", default="many")
    parser.add_argument("--tools", type=int, default=500)
    args = parser.parse_args()
    listed = types.ListToolsResult(tools=[types.Tool.model_validate(tool) for tool in tools(args.name, args.tools)])

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return listed

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        text = f"{params.name}: {(params.arguments or {}).get('text', '')}"
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    server = Server(args.name, on_list_tools=list_tools, on_call_tool=call_tool)
    options = server.create_initialization_options()

    async def serve() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, options)

    anyio.run(serve)


if __name__ == "__main__":
    main()
