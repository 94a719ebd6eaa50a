"""A "workspace shell": a stdio MCP server whose tool runs any shell command it is given.

Operators hand teams such tools; a prompt-injected agent drives them as an attacker would. The
sandbox tests use it to try, from inside a tenant's upstream, everything the sandbox must refuse.
"""

from __future__ import annotations

import subprocess

from mcp.server.mcpserver import MCPServer

server = MCPServer("shell")
_held: list[bytearray] = []


@server.tool(description="Run a shell command in the workspace; its exit status, stdout and stderr.")
def run(command: str, timeout: float = 20.0) -> str:
    try:
        done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return "exit: timeout"
    return f"exit: {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"


@server.tool(description="Allocate this many MiB and keep them (each page touched, so it is really used).")
def allocate(mib: int) -> str:
    for _ in range(mib):
        block = bytearray(1024 * 1024)
        for offset in range(0, len(block), 4096):
            block[offset] = 1
        _held.append(block)
    return f"holding {len(_held)} MiB"


if __name__ == "__main__":
    server.run("stdio")
