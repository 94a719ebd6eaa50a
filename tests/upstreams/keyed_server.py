"""An upstream that needs an API key in its environment: `python keyed_server.py` (stdio).

`key_digest` answers with a short SHA-256 of `API_KEY`, so a test can tell whose key a worker was
given without the key itself ever appearing in an answer.
"""

from __future__ import annotations

import hashlib
import os

from mcp.server.mcpserver import MCPServer

server = MCPServer("keyed")


@server.tool(description="A short digest of the API key this server was started with.")
def key_digest() -> str:
    return hashlib.sha256(os.environ.get("API_KEY", "").encode()).hexdigest()[:16]


if __name__ == "__main__":
    server.run()
