"""A small MCP server used as an upstream in tests: `python echo_server.py [--http PORT] [--name N]`.

Tools cover what a proxy must carry unchanged: plain text, structured output with an output
schema, annotations, errors, slow calls, and a side effect a test can observe (`touch`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations
from pydantic import BaseModel


class Weather(BaseModel):
    city: str
    temperature: float
    conditions: str


def build(name: str) -> MCPServer:
    server = MCPServer(name, instructions=f"test upstream {name}")

    @server.tool(description="Echo the text back.", annotations=ToolAnnotations(readOnlyHint=True))
    def echo(text: str) -> str:
        return text

    @server.tool(description="Add two integers.", meta={"origin": "tests"})
    def add(a: int, b: int) -> int:
        return a + b

    @server.tool(title="Weather report", description="Structured weather for a city.")
    def weather(city: str) -> Weather:
        return Weather(city=city, temperature=21.5, conditions="sunny")

    @server.tool(description="Sleep for a number of seconds, then answer.")
    async def slow(seconds: float) -> str:
        await anyio.sleep(seconds)
        return f"slept {seconds}"

    @server.tool(description="Sleep, then create a file: it exists only if the call was not cancelled.")
    async def slow_touch(path: str, seconds: float) -> str:
        await anyio.sleep(seconds)
        await anyio.Path(path).write_text("finished\n")
        return f"touched {path}"

    @server.tool(description="Log one line at each of debug, info, warning and error.")
    async def log_levels(ctx: Context) -> str:
        await ctx.debug("a debug line", logger_name="demo")
        await ctx.info("an info line", logger_name="demo")
        await ctx.warning("a warning line", logger_name="demo")
        await ctx.error("an error line", logger_name="demo")
        return "logged"

    @server.tool(description="Report progress `count` times, each message the wall-clock time it was sent.")
    async def progress_stamps(count: int, interval: float, ctx: Context) -> str:
        for step in range(count):
            await ctx.report_progress(step + 1, count, message=f"{time.time():.6f}")
            await anyio.sleep(interval)
        return f"reported {count}"

    @server.tool(description="Always fails.")
    def fail(message: str = "boom") -> str:
        raise ValueError(message)

    @server.tool(
        description="Create a file at the given path (a side effect tests can observe).",
        annotations=ToolAnnotations(destructiveHint=True),
    )
    def touch(path: str) -> str:
        Path(path).write_text(f"{name} {time.time()}\n")
        return f"touched {path}"

    @server.tool(description="The process id of this upstream.")
    def pid() -> int:
        return os.getpid()

    # In a sandbox every upstream is pid 2 of its own PID namespace: this tells processes apart.
    instance = os.urandom(8).hex()

    @server.tool(description="A random id of this upstream process, drawn when it started.")
    def instance_id() -> str:
        return instance

    @server.tool(description="Return a text of the given length.")
    def long_text(length: int) -> str:
        return "".join(chr(ord("a") + i % 26) for i in range(length))

    @server.tool(description="Announce that the tool list changed, `count` times in a burst.")
    async def notify_changes(count: int, ctx: Context) -> str:
        for _ in range(count):
            await ctx.session.send_tool_list_changed()
        return f"sent {count}"

    @server.resource("test://readme", name="readme", description="A fixed text", mime_type="text/plain")
    def readme() -> str:
        return f"readme of {name}"

    @server.resource("test://items/{item_id}", name="item", description="One item by id")
    def item(item_id: str) -> str:
        return f"item {item_id} of {name}"

    @server.prompt(description="Greet someone.")
    def greet(who: str) -> str:
        return f"Say hello to {who} from {name}."

    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", default="echo")
    parser.add_argument("--http", type=int, help="serve streamable HTTP on this port instead of stdio")
    parser.add_argument("--sse", type=int, help="serve legacy SSE on this port instead of stdio")
    parser.add_argument("--exit-at-once", action="store_true", help="exit with status 3 before serving")
    parser.add_argument("--exit-if-exists", help="exit with status 3 before serving while this file exists")
    args = parser.parse_args()
    if args.exit_at_once or (args.exit_if_exists and os.path.exists(args.exit_if_exists)):
        print("exiting at once, as asked", file=sys.stderr)
        sys.exit(3)
    server = build(args.name)
    if args.http:
        server.run("streamable-http", host="127.0.0.1", port=args.http)
    elif args.sse:
        server.run("sse", host="127.0.0.1", port=args.sse)
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
