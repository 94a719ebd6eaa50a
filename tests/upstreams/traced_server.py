"""An MCP server that traces itself, used as an upstream in the telemetry tests:
`python traced_server.py [--http PORT] [--name N]`.

It sets up the OpenTelemetry SDK from its own `OTEL_*` variables (an OTLP exporter to the tests'
receiver), so the MCP SDK's server spans (`tools/call echo`, parented by the request's
`_meta.traceparent`) and a `work` span of its own below them reach the same receiver as mcpvisor's.
Its tools also say what trace context their request carried, in `_meta` and in HTTP headers.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

import anyio
from mcp.server.mcpserver import Context, MCPServer
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor


def trace_everything(name: str) -> TracerProvider:
    """Every span exported as it ends (to the endpoint the OTEL_* variables name): nothing waits in a queue."""
    provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", name)}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider


def build(name: str) -> MCPServer:
    server = MCPServer(name, instructions=f"traced test upstream {name}")
    tracer = trace.get_tracer("traced-upstream")

    @server.tool(description="Echo the text back, after a little traced work.")
    async def echo(text: str) -> str:
        with tracer.start_as_current_span("work"):
            await anyio.sleep(0.01)
        return text

    @server.tool(description="The trace context this request carried: its _meta, and its HTTP headers (HTTP only).")
    def seen_context(ctx: Context) -> str:
        meta = dict(ctx.request_context.meta or {})
        headers = ctx.headers or {}
        return json.dumps(
            {
                "meta": {key: meta.get(key) for key in ("traceparent", "tracestate", "baggage")},
                "headers": {key: headers.get(key) for key in ("traceparent", "tracestate")},
            }
        )

    @server.tool(description="The names of the OTEL_* variables this process was given (never their values).")
    def otel_environment() -> list[str]:
        return sorted(name for name in os.environ if name.startswith("OTEL_"))

    @server.tool(description="The process id of this upstream.")
    def pid() -> int:
        return os.getpid()

    @server.tool(description="Sleep for a number of seconds, then answer.")
    async def slow(seconds: float) -> str:
        await anyio.sleep(seconds)
        return f"slept {seconds}"

    @server.tool(description="Always fails, with the message given.")
    def fail(message: str = "boom") -> str:
        raise ValueError(message)

    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", default="traced")
    parser.add_argument("--http", type=int, help="serve streamable HTTP on this port instead of stdio")
    args = parser.parse_args()
    provider = trace_everything(args.name)
    # A stdio upstream is stopped with SIGTERM or by closing its stdin: either way its spans are out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server = build(args.name)
        if args.http:
            server.run("streamable-http", host="127.0.0.1", port=args.http)
        else:
            server.run("stdio")
    finally:
        provider.shutdown()


if __name__ == "__main__":
    main()
