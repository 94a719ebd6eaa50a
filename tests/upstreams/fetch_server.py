"""An upstream whose tool calls a remote HTTP API, as most upstreams do: `fetch(url)` GETs it and returns the body.

Each call opens its own connection, as a tool calling an API without a connection pool does, so
a benchmark of it measures what a sandbox's network costs a remote call.
"""

from __future__ import annotations

import urllib.request

from mcp.server.mcpserver import MCPServer

server = MCPServer("fetch")


@server.tool(description="GET the URL and return the body (at most 64 KiB).")
def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return answer.read(65536).decode(errors="replace")


if __name__ == "__main__":
    server.run("stdio")
